import { readdir, readFile, readlink, realpath } from 'node:fs/promises';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const exec = promisify(execFile);

/** Watches looked up per dump: more are left to CRIU's own search (which fails the dump). */
const MAX_WATCHES = 256;
/** A sandbox with very many descriptors is not read to the end: the scan is a checkpoint job's,
 * and jobs of other instances wait behind it. */
const MAX_FDS_READ = 65_536;
const SCAN_DEADLINE_MS = 1000;
const FHPATH_TIMEOUT_MS = 2000;
const WATCH_LINE = /^inotify wd:\S+ ino:\S+ sdev:\S+ .*fhandle-type:([0-9a-f]{1,8}) f_handle:([0-9a-f]{2,256})$/gm;

/**
 * The paths, inside a sandbox, of the inodes its processes watch with inotify: hints for CRIU,
 * which cannot open them by their handle on the overlay and otherwise fails the dump
 * ("Can't dump that handle"). A watch's fdinfo (written by the kernel) holds the overlay's
 * handle, around the handle of the real inode in one of the sandbox's layers; `fp-agent fhpath`
 * opens that inode on the host (O_PATH) and says where it is; the layer it is in gives its path
 * in the sandbox. Nothing the sandbox names is followed; a watch that cannot be placed is left
 * out. `roots`: the sandbox's upper and lower directories, newest first.
 */
export async function inotifyWatchPaths(pids: number[], roots: string[], fsDir: string, agentPath: string): Promise<string[]> {
  const handles = new Set<string>();
  const deadline = performance.now() + SCAN_DEADLINE_MS;
  let read = 0;
  for (const pid of pids) {
    const fds = await readdir(`/proc/${pid}/fd`).catch(() => [] as string[]);
    for (const fd of fds) {
      if (handles.size >= MAX_WATCHES || ++read > MAX_FDS_READ || performance.now() > deadline) break;
      if ((await readlink(`/proc/${pid}/fd/${fd}`).catch(() => '')) !== 'anon_inode:inotify') continue;
      const info = await readFile(`/proc/${pid}/fdinfo/${fd}`, 'utf8').catch(() => '');
      for (const m of info.matchAll(WATCH_LINE)) if (handles.size < MAX_WATCHES) handles.add(`${m[1]} ${m[2]}`);
    }
  }
  if (handles.size === 0) return [];
  const real = await Promise.all(roots.map((r) => realpath(r).catch(() => undefined)));
  const paths = new Set<string>();
  for (const h of handles) {
    const [type, handle] = h.split(' ') as [string, string];
    const host = (await exec(agentPath, ['fhpath', fsDir, type, handle], { timeout: FHPATH_TIMEOUT_MS }).catch(() => ({ stdout: '' }))).stdout.trim();
    if (!host.startsWith('/')) continue;
    const root = real.find((p) => p !== undefined && (host === p || host.startsWith(`${p}/`)));
    if (root !== undefined) paths.add(host.slice(root.length) || '/');
  }
  return [...paths];
}
