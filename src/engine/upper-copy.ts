import { getPriority } from 'node:os';
import { runForOutput, startPiped, type PipedRun } from './run.js';

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
  // find's complaints (an entry gone meanwhile) go nowhere, as its pipeline's status is head's.
  const { code, stdout } = await runForOutput('sh', ['-c', 'find -P "$1" -xdev -printf "%b\\n" 2>/dev/null | head -n "$2"', 'size', path, String(atMost + 1)], signal);
  if (signal.aborted) throw signal.reason instanceof Error ? signal.reason : new Error('the walk was stopped');
  if (code !== 0) throw new Error(`the walk of ${path} ended with ${code}`);
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
  private readonly copy: PipedRun;
  private stopped: Error | undefined;

  constructor(src: string, dest: string) {
    // It works while the sandbox is paused: above what keeps a busy host's CPUs busy, as CRIU's
    // workers are (criu_run.c, CRIU_NICE). `nice` takes it there from the server's own value,
    // which what the server starts begins at; one that may not raise it warns and copies at
    // that value.
    const raise = String(COPY_NICE - getPriority());
    const script = 'read -r go && exec nice -n "$3" cp -a --sparse=auto --reflink=auto --no-target-directory -- "$1" "$2"';
    // By the engine's spawner (run.ts): Node forking itself was ~3-10 ms of the event loop.
    this.copy = startPiped('sh', ['-c', script, 'copy', src, dest, raise]);
  }

  /** Copies, within `deadlineMs` (else the copy is stopped and this throws). */
  async run(deadlineMs: number): Promise<void> {
    const timer = setTimeout(() => this.stop(new Error(`the copy was not done within ${deadlineMs} ms`)), deadlineMs);
    try {
      this.copy.feed('go\n');
      const r = await this.copy.result;
      if (this.stopped) throw this.stopped;
      if (r.code !== 0) throw new Error(`cp: ${r.stderr.trim().split('\n').slice(-3).join(' / ') || `exit ${r.code}`}`);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Stops it before it ran (or while it runs). */
  cancel(): void {
    this.stop(new Error('cancelled'));
  }

  private stop(err: Error): void {
    this.stopped ??= err;
    this.copy.kill();
  }
}
