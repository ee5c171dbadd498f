import { existsSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { runForOutput } from './run.js';

/** Bytes under a path as files hold them. -x: not into mounted overlays (merged/), which would
 * count every layer again; -D: a layer in a volume is a symlink to follow. */
export async function diskUsage(path: string): Promise<number> {
  if (!existsSync(path)) return 0;
  const r = await runForOutput('du', ['-sbxD', '--apparent-size', path]);
  const n = Number(r.stdout.split('\t')[0]);
  if (Number.isFinite(n)) return n;
  return (await stat(path)).size;
}
