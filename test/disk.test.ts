/**
 * Finding 9: a full disk. The server runs on a data directory that is a small filesystem of the
 * test's own (a loop-mounted ext4), filled from the host as another program would fill it.
 * Every call must answer 507 INSUFFICIENT_STORAGE or a `failed` checkpoint with a reason, never
 * 500 and never `processing` forever, and must leave nothing half-made behind.
 */
import { mkdtemp, rm, statfs } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';

let work: string;
let mnt: string;
let s: TestServer;

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

describe('finding 9: a full data directory', () => {
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
