import { existsSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { runForOutput } from './run.js';

const DU_DEADLINE_MS = 60_000;

/** Bytes under a path as files hold them. -x: not into mounted overlays (merged/), which would
 * count every layer again; -D: a layer in a volume is a symlink to follow. */
export async function diskUsage(path: string): Promise<number> {
  if (!existsSync(path)) return 0;
  // A walk past its deadline (a tree of millions of entries) answers with the directory's own size.
  const r = await runForOutput('du', ['-sbxD', '--apparent-size', path], AbortSignal.timeout(DU_DEADLINE_MS));
  const total = /^(\d+)\t/.exec(r.stdout)?.[1];
  if (total !== undefined) return Number(total);
  return (await stat(path)).size;
}
