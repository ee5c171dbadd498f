import { getPriority, setPriority } from 'node:os';

/**
 * Runs the server above its sandboxes' default priority (`serverNice`, -5 unless configured):
 * a checkpoint, rollback or fork is the server's work (its record, its network, its agent) as
 * much as CRIU's, and on a host whose CPUs spinning host processes keep busy, a fork at the
 * default priority took 3.3× its idle time (bench/under-load.ts). CRIU's workers and the copy of
 * an upper run at -10 of their own; sandboxes start at 0 whatever the server runs at (boot.c).
 * Only this thread and those it starts from now on take it (Linux's nice is per thread).
 * Returns what it could not do, for the log; a server without CAP_SYS_NICE runs as it is.
 */
export function raiseServerPriority(nice: number): string | undefined {
  if (nice === getPriority()) return undefined;
  try {
    setPriority(nice);
    return undefined;
  } catch (err) {
    return `could not set the server's nice value to ${nice}: ${(err as Error).message}`;
  }
}
