import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cgroupMounts, favourCgroupMoves } from '../../src/engine/cgroup-moves.js';

// Lines of a hybrid host's mountinfo (cgroup v1 controllers and the unified hierarchy), one with
// a space in its mount point, as proc(5) escapes it.
const HYBRID = [
  '24 23 0:21 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755',
  '25 24 0:22 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate',
  '26 24 0:23 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory',
  '27 24 0:24 / /srv/a\\040b rw,relatime - cgroup cgroup rw,pids',
].join('\n');

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'forkpoint-cgroup-moves-'));
});
afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('the cgroup hierarchy asked to favour moves (favordynmods)', () => {
  it("is read from mountinfo: each cgroup mount's point, type and superblock options", () => {
    expect(cgroupMounts(HYBRID)).toEqual([
      { mountPoint: '/sys/fs/cgroup/unified', fsType: 'cgroup2', superOptions: ['rw', 'nsdelegate'] },
      { mountPoint: '/sys/fs/cgroup/memory', fsType: 'cgroup', superOptions: ['rw', 'memory'] },
      { mountPoint: '/srv/a b', fsType: 'cgroup', superOptions: ['rw', 'pids'] },
    ]);
  });

  it('is left alone when the unified hierarchy has it already, and says so', async () => {
    const info = join(dir, 'already');
    await writeFile(info, HYBRID.replace('rw,nsdelegate', 'rw,nsdelegate,favordynmods'));
    expect(await favourCgroupMoves(info)).toEqual({ state: 'already', mount: '/sys/fs/cgroup/unified' });
  });

  it('is unavailable, with its reason, on a host without cgroups', async () => {
    const info = join(dir, 'none');
    await writeFile(info, HYBRID.split('\n')[0]!);
    expect(await favourCgroupMoves(info)).toMatchObject({ state: 'unavailable', reason: 'no cgroup hierarchy is mounted' });
  });
});
