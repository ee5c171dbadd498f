import { setPriority } from 'node:os';
import { execa } from 'execa';

/** The copy's nice value: CRIU's (native/criu_run.c). */
const COPY_NICE = -10;

/**
 * How much of an upper a files-only checkpoint copies while the sandbox is frozen, rather than
 * dumping and restoring it with CRIU to freeze the upper by rename. Measured here (2 cores,
 * ext4): `cp -a` of a small tree is 3-5 ms, plus ~50 us an entry and ~1 ms a MiB; a dump and
 * restore is 25-40 ms for an idle sandbox and grows 4-8 ms with each process. Beyond these
 * bounds the copy would cost more than it saves, and the upper is frozen by rename, which also
 * empties it (the next copy starts small again).
 */
export const COPY_LIMITS = { maxBytes: 32 * 1024 * 1024, maxEntries: 2000, deadlineMs: 1000 };

/**
 * The same for a memory checkpoint, whose processes CRIU then dumps in the same freeze and leaves
 * running. Its alternative costs a restore (15-20 ms here), not a dump and a restore, so it is
 * worth less; and a copy repeats the whole upper since its last rename, where a rename keeps only
 * what changed since the last checkpoint. The common case is a few edited files between two
 * checkpoints; a checkpoint after a build or an install freezes by rename and starts over with
 * an empty upper. At most this much is stored twice per checkpoint.
 */
export const MEMORY_COPY_LIMITS = { maxBytes: 256 * 1024, maxEntries: 500 };

export interface TreeSize {
  bytes: number;
  entries: number;
}

/** What a tree holds on disk (allocated bytes: a sparse file's holes are not copied), counted
 * without following a symlink in it (find's physical walk) or crossing into another filesystem;
 * a hard link's blocks count once per name (more, never less). The walk stops after `atMost` + 1
 * entries: every memory checkpoint measures its upper first, and one past the bounds (a
 * `node_modules` of 100,000 files) is frozen by rename whatever its full size. */
export async function treeSize(path: string, signal: AbortSignal, atMost: number): Promise<TreeSize> {
  const { stdout } = await execa('sh', ['-c', 'find -P "$1" -xdev -printf "%b\\n" | head -n "$2"', 'size', path, String(atMost + 1)], { cancelSignal: signal });
  const lines = stdout.split('\n').filter(Boolean);
  let blocks = 0;
  for (const line of lines) {
    const n = Number(line);
    if (!Number.isSafeInteger(n) || n < 0) throw new Error(`find answered ${JSON.stringify(line.slice(0, 80))}`);
    blocks += n;
  }
  return { bytes: blocks * 512, entries: lines.length };
}

/**
 * A copy of a tree as it is: owners, modes, times, extended attributes (an overlay's whiteouts
 * and opaque markers), hard links, holes, special files; symlinks as symlinks, never followed
 * (`-a` is `-dR --preserve=all`). Started before the pause and held at a `read` until `run`, so
 * that the pause pays for the copy, not for starting a process. The source must not change
 * while it runs (its sandbox is frozen). `dest` must not exist; on failure what was copied of it
 * is left for the caller to remove.
 */
export class PreparedCopy {
  private readonly abort = new AbortController();
  private readonly sub;

  constructor(src: string, dest: string) {
    const script = 'read -r go && exec cp -a --sparse=auto --reflink=auto --no-target-directory -- "$1" "$2"';
    this.sub = execa('sh', ['-c', script, 'copy', src, dest], { stdin: 'pipe', cancelSignal: this.abort.signal, forceKillAfterDelay: 0 });
    this.sub.catch(() => {}); // its outcome is run()'s
    // It works while the sandbox is paused: above what keeps a busy host's CPUs busy, as CRIU's
    // workers are (criu_run.c, CRIU_NICE). Best effort: a server that may not raise it copies
    // at its own priority.
    try {
      if (this.sub.pid) setPriority(this.sub.pid, COPY_NICE);
    } catch {
      // no CAP_SYS_NICE
    }
  }

  /** Copies, within `deadlineMs` (else the copy is stopped and this throws). */
  async run(deadlineMs: number): Promise<void> {
    const timer = setTimeout(() => this.abort.abort(new Error(`the copy was not done within ${deadlineMs} ms`)), deadlineMs);
    try {
      this.sub.stdin.end('go\n');
      await this.sub;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Stops it before it ran (or while it runs). */
  cancel(): void {
    this.abort.abort(new Error('cancelled'));
  }
}
