import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** 1 ms of CPU every 200 ms: a lazy-pages daemon's transfer of 256 MiB (~0.1 s of CPU) takes ~20 s
 * held (at 2 %, a loaded run saw one done within the ~3 s a test took to act on it). */
const QUOTA_US = 1000;
const PERIOD_US = 200_000;

/** A CPU group of the test's own, holding `pid` to 0.5 % of one CPU until `release`: a process
 * made slow on purpose (a lazy-pages daemon, so that its transfer is surely still under way when
 * a test acts on it), never stopped (what it serves still gets served). cgroup v1 or v2. */
export function throttle(pid: number): { release(): Promise<void> } {
  const v2 = !existsSync('/sys/fs/cgroup/cpu/cgroup.procs');
  const root = v2 ? '/sys/fs/cgroup' : '/sys/fs/cgroup/cpu';
  const group = join(root, `forkpoint-test-throttle-${pid}`);
  mkdirSync(group);
  if (v2) writeFileSync(join(group, 'cpu.max'), `${QUOTA_US} ${PERIOD_US}`);
  else {
    writeFileSync(join(group, 'cpu.cfs_period_us'), String(PERIOD_US));
    writeFileSync(join(group, 'cpu.cfs_quota_us'), String(QUOTA_US));
  }
  writeFileSync(join(group, 'cgroup.procs'), String(pid));
  let released = false;
  return {
    /** Back to the root group (the test is done holding it either way), then the group goes,
     * once a process killed in it has left it too. */
    async release() {
      if (released) return;
      released = true;
      const deadline = Date.now() + 10_000;
      for (;;) {
        for (const p of readFileSync(join(group, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean)) {
          try {
            writeFileSync(join(root, 'cgroup.procs'), p);
          } catch {
            // exiting
          }
        }
        try {
          rmdirSync(group);
          return;
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EBUSY' || Date.now() > deadline) throw err;
        }
        await new Promise((r) => setTimeout(r, 20));
      }
    },
  };
}
