import { mkdir, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';
import { EngineError } from '../seam/errors.js';
import type { DataLayout } from '../lib/data-layout.js';
import type { Mounter } from './overlay.js';
import { run } from './run.js';

/**
 * Squashes layers (newest first) and, unless `image` is null, the image under them into one
 * new full-root layer. The merged view is read through a read-only overlay, where whiteouts
 * and opaque directories are already resolved, and copied. Nothing mounted changes: the
 * caller swaps the new layer in for future mounts.
 */
export async function squashLayers(d: { layout: DataLayout; mounter: Mounter; agentPath: string }, layers: string[], image: string | null, into: string): Promise<void> {
  const l = d.layout;
  const view = join(l.trash, `squash-view-${into}`);
  const tmp = `${l.layer(into)}.tmp`;
  await mkdir(view, { recursive: true });
  await rm(tmp, { recursive: true, force: true });
  const lowers = [...layers.map((id) => l.relative(l.layer(id))), ...(image ? [l.relative(l.image(image))] : [])];
  // A read-only overlay needs two lowers; a single layer is copied as it is.
  if (lowers.length >= 2) await d.mounter.mountReadOnly(lowers, view, l.root);
  try {
    const source = lowers.length >= 2 ? view : join(l.root, lowers[0]!);
    const r = await execa('cp', ['-a', '--', `${source}/.`, tmp], { reject: false });
    if (r.exitCode !== 0 && !/socket/.test(r.stderr)) throw new EngineError('MOUNT_FAILED', `squash copy: ${r.stderr.trim()}`);
  } finally {
    if (lowers.length >= 2) await d.mounter.unmount(view);
    await rm(view, { recursive: true, force: true });
  }
  await run(d.agentPath, ['syncfs', tmp]);
  await rename(tmp, l.layer(into));
}
