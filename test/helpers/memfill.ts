import { KIT } from './attack-kit.js';
import { eventually, type TestServer } from './server.js';

/**
 * Driving `attack memfill` (test/fixtures/attack.c) in a sandbox of `s`: memory written before a
 * checkpoint, rewritten in part, and checksummed by the program itself, so that a restore that
 * brings back one wrong page is seen.
 */
export function memfill(s: TestServer) {
  /** A command's trimmed stdout; a failed command throws. */
  const sh = async (id: string, command: string, session?: string): Promise<string> => {
    const r = await s.exec(id, { command, timeout_ms: 30_000, ...(session ? { session } : {}) });
    if (r.exit_code !== 0) throw new Error(`${command}: ${r.stderr}`);
    return (r.stdout as string).trim();
  };
  const waitFor = (id: string, file: string) => eventually(async () => (await sh(id, `test -e ${file} && echo y || true`)) === 'y', 30_000);
  return {
    sh,
    /** Starts the filler on `mib` MiB in the sandbox's `main` session and waits until it is written. */
    async start(id: string, mib: number): Promise<void> {
      await sh(id, `${KIT} memfill ${mib} /tmp > /dev/null 2>&1 &`, 'main');
      await waitFor(id, '/tmp/memfill.ready');
    },
    /** The checksum of the filler's memory, computed by the filler itself. */
    async sumOf(id: string): Promise<string> {
      await sh(id, 'rm -f /tmp/memfill.sum; kill -USR1 $(pidof attack)');
      return eventually(async () => (await sh(id, 'cat /tmp/memfill.sum 2>/dev/null || true')) || undefined, 20_000);
    },
    /** The filler rewrites a small working set: a word in every 64th page, 64 pages the kernel
     * writes for it (getrandom), 16 pages it gives back (MADV_DONTNEED: zeros from then on), and
     * 1 MiB moved over another (mremap: pages that keep their bytes at an address where the
     * parent image has others) whose old place reads as zeros. */
    async touch(id: string): Promise<void> {
      await sh(id, 'rm -f /tmp/memfill.touched; kill -USR2 $(pidof attack)');
      await waitFor(id, '/tmp/memfill.touched');
      // The move is made wherever there is room for it (the fillers here hold 128 MiB or more).
      if ((await sh(id, 'cat /tmp/memfill.touched')) !== 'moved') throw new Error('the filler did not move its MiB (mremap)');
    },
  };
}
