import { readFile, writeFile } from 'node:fs/promises';

/** What each sandbox's user namespace allows of the kernel's inotify counters (native/idmap.c,
 * userns_limits, writes the same numbers). */
export const INOTIFY_PER_SANDBOX = { instances: 128, watches: 65536 } as const;

const HOST = {
  instances: '/proc/sys/fs/inotify/max_user_instances',
  watches: '/proc/sys/fs/inotify/max_user_watches',
} as const;

/**
 * CRIU, run as root, owns every sandbox's user namespace (see native/boot.c), and the kernel
 * charges a namespace's inotify use to its owner too: to the host's root, up to the host's
 * per-user ceiling (128 instances by default). Each sandbox is bounded in its own namespace;
 * this raises the host's ceilings (never lowers them) so that every range of the pool at its
 * bound, and the host's root, fit under them together. Returns what it changed.
 */
export async function raiseInotifyCeilings(ranges: number): Promise<string[]> {
  const changed: string[] = [];
  for (const key of ['instances', 'watches'] as const) {
    const want = INOTIFY_PER_SANDBOX[key] * (ranges + 1);
    const now = Number((await readFile(HOST[key], 'utf8')).trim());
    if (Number.isInteger(now) && now >= want) continue;
    await writeFile(HOST[key], `${Math.min(want, 2 ** 31 - 1)}\n`);
    changed.push(`${HOST[key]}: ${now} -> ${want}`);
  }
  return changed;
}
