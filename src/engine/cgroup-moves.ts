import { readFile } from 'node:fs/promises';
import { runWithin } from './run.js';

/** A remount is a moment's work; one that hangs is given up on (the server starts without it). */
const REMOUNT_DEADLINE_MS = 10_000;

/** What the host's cgroup hierarchy says of `favordynmods` after `favourCgroupMoves`. */
export interface CgroupMovesState {
  state: 'set' | 'already' | 'unavailable';
  /** The hierarchy asked (its mount point). */
  mount?: string;
  /** Why it is not in force, when it is not. */
  reason?: string;
}

interface CgroupMount {
  mountPoint: string;
  fsType: 'cgroup' | 'cgroup2';
  superOptions: string[];
}

/** The host's cgroup mounts, from a mountinfo text (proc(5): the fields after " - " are the
 * filesystem type, the source and the superblock's options). */
export function cgroupMounts(mountinfo: string): CgroupMount[] {
  const mounts: CgroupMount[] = [];
  for (const line of mountinfo.split('\n')) {
    const [before, after] = line.split(' - ');
    if (!before || !after) continue;
    const [fsType, , superOptions = ''] = after.split(' ');
    if (fsType !== 'cgroup' && fsType !== 'cgroup2') continue;
    const mountPoint = (before.split(' ')[4] ?? '').replace(/\\(\d{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
    mounts.push({ mountPoint, fsType, superOptions: superOptions.split(',') });
  }
  return mounts;
}

/**
 * Makes moving a process into a cgroup cheap, by mounting the cgroup hierarchy `favordynmods`.
 *
 * Why: every restore (a rollback, a fork, a wake) moves its CRIU into the sandbox's cgroups before
 * the tree is forked there. The kernel guards such moves with one host-wide lock whose writer,
 * the first time after a quiet moment, waits out an RCU grace period: 7-8 ms on these machines
 * (a Python loop moving a `sleep` 300 ms apart: 7.7 ms a move, 0.25 with the option), and a
 * rollback's CRIU waited for it at the median. `favordynmods` keeps that lock in the mode that
 * needs no grace period (Linux 6.0); since 6.18 a move then locks only the moved process's thread
 * group. The price, in the kernel's words, is forks and exits a little more expensive (on 6.0 to
 * 6.17 they take the one lock's slow path; on 6.18 their own thread group's). It is host-wide
 * and, on 6.18, stays until the next boot. The option is asked of one hierarchy, the unified one
 * where there is one: the lock is every hierarchy's. A kernel that does not know it, or a
 * container not allowed to remount, costs a warning.
 */
export async function favourCgroupMoves(mountinfoPath = '/proc/self/mountinfo'): Promise<CgroupMovesState> {
  const mounts = cgroupMounts(await readFile(mountinfoPath, 'utf8'));
  const target = mounts.find((m) => m.fsType === 'cgroup2') ?? mounts[0];
  if (!target) return { state: 'unavailable', reason: 'no cgroup hierarchy is mounted' };
  if (target.superOptions.includes('favordynmods')) return { state: 'already', mount: target.mountPoint };
  // mount(8) keeps the options the mount has (its controllers, nsdelegate) and adds this one.
  const r = await runWithin('mount', ['-o', 'remount,favordynmods', target.mountPoint], REMOUNT_DEADLINE_MS);
  const after = cgroupMounts(await readFile(mountinfoPath, 'utf8')).find((m) => m.mountPoint === target.mountPoint);
  if (after?.superOptions.includes('favordynmods')) return { state: 'set', mount: target.mountPoint };
  return { state: 'unavailable', mount: target.mountPoint, reason: r.code === 0 ? 'the kernel kept the hierarchy as it was' : r.stderr.trim() || `mount exited ${r.code}` };
}
