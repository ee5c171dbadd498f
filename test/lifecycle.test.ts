import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { readFile } from 'node:fs/promises';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cgroupMounts } from '../src/engine/cgroup-moves.js';
import { eventually, overlaysUnder, startServer, type TestServer } from './helpers/server.js';

const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
let s: TestServer;
beforeAll(async () => {
  s = await startServer();
});
afterAll(async () => s?.close());

const alive = (pid: number) => existsSync(`/proc/${pid}`);

describe('what a server changes on its host', () => {
  it('mounts the cgroup hierarchy favordynmods, so that a restore joins its cgroups without waiting out a grace period', async () => {
    const mounts = cgroupMounts(await readFile('/proc/self/mountinfo', 'utf8'));
    const asked = mounts.find((m) => m.fsType === 'cgroup2') ?? mounts[0];
    expect(asked?.superOptions).toContain('favordynmods');
  });
});

describe('instance lifecycle', () => {
  it('create → 201 running; get; list with paging', async () => {
    const one = await s.instance({ name: 'one', metadata: { team: 'x' } });
    expect(one).toMatchObject({ name: 'one', status: 'running', image: 'default', metadata: { team: 'x' } });
    const two = await s.instance({ name: 'two' });
    expect((await s.api('GET', `/instances/${one.id}`)).body.id).toBe(one.id);
    const page1 = await s.api('GET', '/instances?limit=1');
    expect(page1.body.items).toHaveLength(1);
    expect(page1.body.items[0].id).toBe(two.id);
    const page2 = await s.api('GET', `/instances?limit=1&cursor=${page1.body.next_cursor}`);
    expect(page2.body.items[0].id).toBe(one.id);
  });

  it('stop kills every process and unmounts; start boots again on the same disk', async () => {
    const inst = await s.instance({ name: 'stopper' });
    await s.exec(inst.id, { command: 'echo kept > /root/file' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'exec sleep 999' });
    const pid = s.engine.sandbox(inst.id)!.pid;
    const stopped = await s.api('POST', `/instances/${inst.id}/stop`);
    expect(stopped.body.status).toBe('stopped');
    expect(alive(pid)).toBe(false);
    expect(await overlaysUnder(s.engine.layout.instance(inst.id))).toEqual([]);
    expect((await s.api('POST', `/instances/${inst.id}/exec`, { command: 'true' })).body.error.code).toBe('CONFLICT');
    const started = await s.api('POST', `/instances/${inst.id}/start`);
    expect(started.body.status).toBe('running');
    expect((await s.exec(inst.id, { command: 'cat /root/file; ps -o args | grep -c "[s]leep 999"' })).stdout).toBe('kept\n0\n');
  });

  it('a sandbox whose PID 1 is killed from the host (as an out-of-memory kill would) stops: its instance says why, nothing of it stays running or mounted, a call answers 409, a start boots it on its disk', async () => {
    const inst = await s.instance({ name: 'killed' });
    await s.exec(inst.id, { command: 'echo kept > /root/file' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'exec sleep 999' });
    const pid = s.engine.sandbox(inst.id)!.pid;
    process.kill(pid, 'SIGKILL');
    await eventually(async () => (await s.api('GET', `/instances/${inst.id}`)).body.status === 'stopped');
    const view = (await s.api('GET', `/instances/${inst.id}`)).body;
    expect(view.error).toContain(`host pid ${pid}`);
    expect(s.engine.sandbox(inst.id)).toBeUndefined();
    expect(await overlaysUnder(s.engine.layout.instance(inst.id))).toEqual([]);
    const call = await s.api('POST', `/instances/${inst.id}/exec`, { command: 'true' });
    expect([call.status, call.body.error.code, call.body.error.details?.status]).toEqual([409, 'CONFLICT', 'stopped']);
    const started = await s.api('POST', `/instances/${inst.id}/start`);
    expect([started.body.status, started.body.error]).toEqual(['running', null]);
    expect((await s.exec(inst.id, { command: 'cat /root/file; ps -o args | grep -c "[s]leep 999"' })).stdout).toBe('kept\n0\n');
  });

  it('delete leaves no process, no mount and no disk', async () => {
    const inst = await s.instance({ name: 'doomed' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'exec sleep 999' });
    const pid = s.engine.sandbox(inst.id)!.pid;
    const dir = s.engine.layout.instance(inst.id);
    expect((await s.api('DELETE', `/instances/${inst.id}`)).status).toBe(204);
    expect(alive(pid)).toBe(false);
    expect(await overlaysUnder(dir)).toEqual([]);
    expect(existsSync(dir)).toBe(false);
    expect((await s.api('GET', `/instances/${inst.id}`)).status).toBe(404);
  });

  it('instances belong to the token\'s owner: another owner gets 404', async () => {
    const inst = await s.instance({ name: 'mine' });
    const { token } = await s.fp.store.tokens.create('mallory', 'other');
    const h = { authorization: `Bearer ${token}` };
    expect((await s.api('GET', `/instances/${inst.id}`, undefined, h)).status).toBe(404);
    expect((await s.api('POST', `/instances/${inst.id}/exec`, { command: 'id' }, h)).status).toBe(404);
    expect((await s.api('DELETE', `/instances/${inst.id}`, undefined, h)).status).toBe(404);
    expect((await s.api('GET', '/instances', undefined, h)).body.items).toEqual([]);
  });
});

describe('images', () => {
  it('a rootfs tarball imported as a named image boots', async () => {
    const tarball = join(s.dataDir, 'rootfs.tar.gz');
    // The image's files are hard links shared with other servers' data directories: a link made
    // or removed there changes an inode's ctime, which tar reports (exit 1) though no byte changed.
    const packed = await execa('tar', ['--warning=no-file-changed', '-czf', tarball, '-C', s.engine.layout.image('default'), '.'], { reject: false });
    expect(packed.exitCode, packed.stderr).toBeLessThanOrEqual(1);
    await execa(process.execPath, [CLI, 'image', 'import', 'imported', tarball], { env: { ...process.env, FORKPOINT_DATA_DIR: s.dataDir } });
    const inst = await s.instance({ name: 'from-tar', image: 'imported' });
    expect(inst.image).toBe('imported');
    expect((await s.exec(inst.id, { command: 'echo ok; ls /bin/busybox' })).stdout).toBe('ok\n/bin/busybox\n');
    const again = await execa(process.execPath, [CLI, 'image', 'import', 'imported', tarball], { env: { ...process.env, FORKPOINT_DATA_DIR: s.dataDir }, reject: false });
    expect(again.exitCode).not.toBe(0); // images are never replaced in place
  });
});

describe('bad input gets 4xx in the envelope', () => {
  const cases: [string, string, string, unknown, number][] = [
    ['unknown image', 'POST', '/instances', { image: 'nope' }, 400],
    ['bad name', 'POST', '/instances', { name: 'Bad_Name!' }, 400],
    ['unknown field', 'POST', '/instances', { nmae: 'x' }, 400],
    ['huge env', 'POST', '/instances', { env: Object.fromEntries(Array.from({ length: 300 }, (_, i) => [`V${i}`, 'x'])) }, 400],
    ['bad env name', 'POST', '/instances', { env: { 'A-B': '1' } }, 400],
    ['tiny memory limit', 'POST', '/instances', { limits: { memory_mb: 1 } }, 400],
    ['unknown instance', 'GET', '/instances/inst_nothere', undefined, 404],
  ];
  for (const [what, method, path, body, status] of cases) {
    it(what, async () => {
      const r = await s.api(method, path, body);
      expect(r.status).toBe(status);
      expect(r.body.error.code).toBe(status === 404 ? 'NOT_FOUND' : 'INVALID_REQUEST');
      expect(r.body.error.message).toEqual(expect.any(String));
    });
  }

  it('negative timeout, empty command, bad session name', async () => {
    const inst = await s.instance({ name: 'badexec' });
    for (const body of [{ command: 'true', timeout_ms: -1 }, { command: '' }, { command: [] }, { command: 'x', session: '../etc' }]) {
      const r = await s.api('POST', `/instances/${inst.id}/exec`, body);
      expect(r.status).toBe(400);
      expect(r.body.error.code).toBe('INVALID_REQUEST');
    }
  });

  it('nothing is left half-made by a refused create', async () => {
    const before = (await s.fp.store.instances.all()).length;
    await s.api('POST', '/instances', { image: 'nope' });
    expect((await s.fp.store.instances.all()).length).toBe(before);
  });
});
