/**
 * Finding 9: a full disk. The server runs on a data directory that is a small filesystem of the
 * test's own (a loop-mounted ext4), filled from the host as another program would fill it.
 * Every call must answer 507 INSUFFICIENT_STORAGE or a `failed` checkpoint with a reason, never
 * 500 and never `processing` forever, and must leave nothing half-made behind.
 */
import { lstatSync } from 'node:fs';
import { mkdir, readdir, readFile, mkdtemp, rm, statfs, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spreadAcrossGroups } from '../src/engine/inode-groups.js';
import { startServer, type TestServer } from './helpers/server.js';

let work: string;
let mnt: string;
let s: TestServer;

describe('finding 9: a full data directory', () => {
beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'forkpoint-disk-'));
  mnt = join(work, 'data');
  const img = join(work, 'fs.img');
  await execa('mkdir', ['-p', mnt]);
  await execa('truncate', ['-s', '192M', img]);
  await execa('mkfs.ext4', ['-q', '-F', '-m', '0', '-O', '^has_journal', img]);
  await execa('mount', ['-o', 'loop', img, mnt]);
  s = await startServer({}, mnt);
});

afterAll(async () => {
  await rm(join(mnt, 'filler'), { force: true }).catch(() => {});
  await s?.close({ keepData: true });
  if (mnt) await execa('umount', [mnt]).catch(() => execa('umount', ['-l', mnt]));
  if (work) await rm(work, { recursive: true, force: true });
});

const free = async () => {
  const st = await statfs(mnt);
  return st.bavail * st.bsize;
};

/** Fills the filesystem, leaving about `leave` bytes. */
async function fill(leave: number): Promise<void> {
  const size = Math.max(0, (await free()) - leave);
  await execa('fallocate', ['-l', String(size), join(mnt, 'filler')]);
}

  it('spreads what instances and checkpoints make over the filesystem: their directories are top directories (chattr +T)', async () => {
    // An ext4 without a journal (as here) scans every inode freed in the last minutes before it
    // hands out a new one in a group (src/engine/inode-groups.ts).
    for (const dir of ['instances', 'checkpoints', 'layers']) {
      const { stdout } = await execa('lsattr', ['-d', join(mnt, dir)]);
      expect(stdout.split(/\s+/)[0], dir).toContain('T');
    }
  });

  it('marking them has a deadline: a chattr that hangs is left behind, and the server starts unmarked with a reason', async () => {
    const hung = join(work, 'hung-chattr');
    const pidFile = join(work, 'hung-chattr.pid');
    await writeFile(hung, `#!/bin/sh\necho $$ > ${pidFile}\nexec sleep 30\n`, { mode: 0o755 });
    const dir = join(mnt, 'deadline-probe');
    await mkdir(dir);
    try {
      const t = performance.now();
      const r = await spreadAcrossGroups([dir], { chattr: hung, deadlineMs: 300 });
      expect(performance.now() - t).toBeLessThan(5000);
      expect(r).toEqual({ marked: [], failed: 'chattr did not end within 0.3 s' });
    } finally {
      // Left behind by the deadline, as the server leaves it; the test's own to end.
      const pid = Number(await readFile(pidFile, 'utf8').catch(() => '0'));
      if (pid > 0) process.kill(pid, 'SIGKILL');
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('create, checkpoint and fork answer 507 or end `failed`, never 500 or processing forever; nothing is left half-made', async () => {
    const a = await s.instance({ name: 'before-full' });
    await s.exec(a.id, { command: 'echo kept > /root/f' });
    const good = (await s.api('POST', `/instances/${a.id}/checkpoints?wait=true`, {})).body;
    expect(good.status).toBe('ready');
    const before = (await s.api('GET', '/instances?limit=500')).body.items.length;

    await fill(3 << 20);

    const created = await s.api('POST', '/instances', { name: 'while-full' });
    expect(created.status).toBe(507);
    expect(created.body.error.code).toBe('INSUFFICIENT_STORAGE');

    const ck = await s.api('POST', `/instances/${a.id}/checkpoints?wait=true`, { memory: true });
    expect([200, 507]).toContain(ck.status);
    if (ck.status === 200) {
      expect(ck.body.status).toBe('failed');
      expect(ck.body.error).toMatch(/space/i);
      const again = await s.api('GET', `/instances/${a.id}/checkpoints/${ck.body.id}`);
      expect(again.body.status).toBe('failed');
      expect((await s.api('DELETE', `/instances/${a.id}/checkpoints/${ck.body.id}`)).status).toBe(204);
    }

    const fork = await s.api('POST', `/instances/${a.id}/fork`, { checkpoint_id: good.id, count: 2 });
    expect([201, 507]).toContain(fork.status);
    if (fork.status === 507) expect(fork.body.error.code).toBe('INSUFFICIENT_STORAGE');

    // Inside, the sandbox meets the full disk as ENOSPC, and runs on.
    const w = await s.exec(a.id, { command: 'head -c 20000000 /dev/zero > /root/big; echo rc=$?; rm -f /root/big' });
    expect(w.stdout).toMatch(/rc=1/);
    expect(w.stderr).toMatch(/No space left|I\/O error/); // busybox's words for ENOSPC
    expect((await s.exec(a.id, { command: 'cat /root/f' })).stdout).toBe('kept\n');

    const after = (await s.api('GET', '/instances?limit=500')).body.items;
    expect(after.filter((i: { status: string }) => i.status === 'error')).toEqual([]);
    expect(after.length).toBe(before + (fork.status === 201 ? 2 : 0));

    // With room again, everything works as before.
    await rm(join(mnt, 'filler'));
    const b = await s.instance({ name: 'after-full' });
    const ok = (await s.api('POST', `/instances/${b.id}/checkpoints?wait=true`, {})).body;
    expect(ok.status).toBe('ready');
    const f2 = await s.api('POST', `/instances/${a.id}/fork`, { checkpoint_id: good.id });
    expect(f2.status).toBe(201);
  });
});

describe('finding 9: a per-instance disk limit (limits.disk_mb)', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startServer();
  });
  afterAll(async () => server?.close());

  /** Bytes allocated under the server's data directory, where everything of its sandboxes lands
   * (the host's free space would count what other tests, running beside this one, write). */
  const dataDirBytes = async () => Number((await execa('du', ['-s', '-x', '-B1', server.dataDir])).stdout.split('\t')[0]);
  const volumeMounts = async () => (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').filter((l) => l.includes(`${server.dataDir}/volumes/`));

  it('a sandbox cannot write past its limit, and the host\'s disk grows by no more than it', async () => {
    const i = await server.instance({ name: 'capped', limits: { disk_mb: 64 } });
    expect(i.limits.disk_mb).toBe(64);
    const df = await server.exec(i.id, { command: 'df -m / | tail -1' });
    expect(Number(df.stdout.trim().split(/\s+/)[1])).toBeLessThanOrEqual(64); // the sandbox sees its limit
    const used = await dataDirBytes();
    const w = await server.exec(i.id, { command: 'dd if=/dev/zero of=/root/big bs=1M count=200 2>&1; echo rc=$?', timeout_ms: 60_000 });
    expect(w.stdout).toMatch(/No space left on device/);
    expect(w.stdout).toMatch(/rc=1/);
    expect((await dataDirBytes()) - used).toBeLessThan(70 << 20);
    // What is deleted inside goes back; the instance works on.
    await server.exec(i.id, { command: 'rm /root/big; head -c 20000000 /dev/urandom > /root/keep; sync' });
    expect((await server.exec(i.id, { command: 'wc -c < /root/keep' })).stdout.trim()).toBe('20000000');
  });

  it('checkpoints freeze into the limited disk; rollback and forks work; all of it goes with the instances', async () => {
    const i = await server.instance({ name: 'capped2', limits: { disk_mb: 96 } });
    await server.exec(i.id, { command: 'echo one > /root/v; head -c 10000000 /dev/urandom > /root/data', session: 'main' });
    const ck = (await server.api('POST', `/instances/${i.id}/checkpoints?wait=true`, {})).body;
    expect(ck.status).toBe('ready');
    expect(ck.delta_bytes).toBeGreaterThan(10_000_000);
    await server.exec(i.id, { command: 'echo two > /root/v' });
    expect((await server.api('POST', `/instances/${i.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    expect((await server.exec(i.id, { command: 'cat /root/v' })).stdout).toBe('one\n');
    const fork = (await server.api('POST', `/instances/${i.id}/fork`, { checkpoint_id: ck.id })).body;
    expect(fork.limits.disk_mb).toBe(96);
    expect((await server.exec(fork.id, { command: 'cat /root/v; wc -c < /root/data' })).stdout).toBe('one\n10000000\n');
    // the fork's own writes count against its own limit, not its source's
    const big = await server.exec(fork.id, { command: 'dd if=/dev/zero of=/root/big bs=1M count=200 2>&1; echo rc=$?', timeout_ms: 60_000 });
    expect(big.stdout).toMatch(/rc=1/);
    expect((await server.exec(i.id, { command: 'head -c 50000000 /dev/zero > /root/room; echo rc=$?' })).stdout).toBe('rc=0\n');

    expect((await volumeMounts()).length).toBeGreaterThanOrEqual(2);
    // The source goes first: its checkpoint's layer lives on in its volume while the fork stands on it.
    expect((await server.api('DELETE', `/instances/${i.id}`)).status).toBe(204);
    expect((await server.exec(fork.id, { command: 'wc -c < /root/data' })).stdout).toBe('10000000\n');
    expect((await server.api('DELETE', `/instances/${fork.id}`)).status).toBe(204);
    expect((await volumeMounts()).filter((m) => m.includes(i.id) || m.includes(fork.id))).toEqual([]);
    expect((await readdir(join(server.dataDir, 'volumes'))).filter((n) => n.startsWith(i.id) || n.startsWith(fork.id))).toEqual([]);
  });

  it('a files-only checkpoint copies a small upper into the limited disk; one that does not fit there is frozen by rename instead', async () => {
    const i = await server.instance({ name: 'copied-capped', limits: { disk_mb: 96 } });
    const pid = () => server.engine.sandbox(i.id)!.pid;
    await server.exec(i.id, { command: 'echo small > /root/s' });
    let before = pid();
    const small = (await server.api('POST', `/instances/${i.id}/checkpoints?wait=true`, { memory: false })).body;
    expect(small.status).toBe('ready');
    expect(pid()).toBe(before); // copied in a freeze: the same processes
    const layer = (await server.fp.store.checkpoints.get(small.id))!.layers[0]!;
    expect(lstatSync(server.engine.layout.layer(layer)).isSymbolicLink()).toBe(true); // it lives in the instance's disk
    // 40 MB frozen into a layer (a memory checkpoint renames), then 30 MB more in the upper: the
    // copy of those 30 MB does not fit in what the 96 MiB disk has left.
    await server.exec(i.id, { command: 'head -c 40000000 /dev/urandom > /root/a', timeout_ms: 30_000 });
    expect((await server.api('POST', `/instances/${i.id}/checkpoints?wait=true`, {})).body.status).toBe('ready');
    await server.exec(i.id, { command: 'head -c 30000000 /dev/urandom > /root/b', timeout_ms: 30_000 });
    before = pid();
    const big = (await server.api('POST', `/instances/${i.id}/checkpoints?wait=true`, { memory: false })).body;
    expect(big.status, JSON.stringify(big)).toBe('ready');
    expect(pid()).not.toBe(before); // dumped and restored: the upper renamed
    await server.exec(i.id, { command: 'rm /root/b /root/s' });
    expect((await server.api('POST', `/instances/${i.id}/rollback`, { checkpoint_id: big.id })).status).toBe(200);
    expect((await server.exec(i.id, { command: 'wc -c < /root/b; cat /root/s' })).stdout).toBe('30000000\nsmall\n');
    expect((await server.api('DELETE', `/instances/${i.id}`)).status).toBe(204);
  });

  it('a limit below 64 MiB is refused with a clear error', async () => {
    const r = await server.api('POST', '/instances', { limits: { disk_mb: 10 } });
    expect(r.status).toBe(400);
    expect(r.body.error.code).toBe('INVALID_REQUEST');
  });
});
