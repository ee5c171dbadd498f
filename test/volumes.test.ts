import { lstat, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';
import { until } from './helpers/wait.js';
import { WATCHER } from './helpers/watcher.js';

/**
 * Persistent volumes on the real engine: written in one instance and read in another, kept when
 * the instance goes, read-only where asked, full at their size, another owner's to nobody, left
 * as they are by rollbacks, shared with forks (or not, as asked), through hibernation, in user
 * namespaces and out of them; and a mount point the image made a symlink is refused, not followed.
 */
const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
let s: TestServer;
let other: { authorization: string };

beforeAll(async () => {
  s = await startServer();
  const { token } = await s.fp.store.tokens.create('someone-else', 'volumes test');
  other = { authorization: `Bearer ${token}` };
}, 60_000);

afterAll(async () => {
  await s?.close();
});

// A failed test leaves nothing for the next to trip on.
afterEach(async () => {
  for (const who of [undefined, other]) {
    for (const i of (await s.api('GET', '/instances', undefined, who)).body.items) await s.api('DELETE', `/instances/${i.id}`, undefined, who);
    for (const v of (await s.api('GET', '/volumes', undefined, who)).body.items) await s.api('DELETE', `/volumes/${v.name}`, undefined, who);
  }
});

const sh = async (id: string, command: string) => s.exec(id, { command });
const volume = async (name: string, sizeMb = 64) => {
  const r = await s.api('POST', '/volumes', { name, size_mb: sizeMb });
  if (r.status !== 201) throw new Error(`create volume: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
};
const checkpoint = async (id: string, body: Record<string, unknown> = {}) => {
  const r = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, body);
  if (r.status !== 200 || r.body.status !== 'ready') throw new Error(`checkpoint: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
};
const del = (path: string) => s.api('DELETE', path);

describe('persistent volumes', () => {
  it('are written in one instance, read in another, and outlive the first; read-only refuses writes; in use, not deleted', async () => {
    const v = await volume('shared');
    expect(v).toMatchObject({ name: 'shared', size_mb: 64, instances: [] });
    const a = await s.instance({ volumes: [{ name: 'shared', path: '/work/data' }] });
    expect(a.volumes).toEqual([{ name: 'shared', path: '/work/data', read_only: false }]);
    expect((await sh(a.id, 'echo from-a > /work/data/note && mkdir -p /work/data/dir && id -u > /work/data/dir/who && stat -c %u:%g /work/data')).exit_code).toBe(0);
    expect((await sh(a.id, 'stat -c %u:%g /work/data')).stdout.trim()).toBe('0:0');

    const b = await s.instance({ volumes: [{ name: 'shared', path: '/mnt/ro', read_only: true }] });
    expect((await sh(b.id, 'cat /mnt/ro/note')).stdout).toBe('from-a\n');
    const write = await sh(b.id, 'echo nope > /mnt/ro/other');
    expect(write.exit_code).not.toBe(0);
    expect(write.stderr).toMatch(/Read-only file system/);
    // The files API sees the volume too, and honours read-only.
    const viaApi = await request(`${s.url}/instances/${b.id}/files?path=/mnt/ro/note`, { headers: { authorization: `Bearer ${s.token}` } });
    expect(viaApi.statusCode).toBe(200);
    expect(await viaApi.body.text()).toBe('from-a\n');

    // On the host the files are in canonical ids (the sandbox's root is 0 there, as in a layer),
    // whatever host range the instance runs in.
    const dataDir = join(s.dataDir, 'persistent-volumes', v.id, 'data');
    expect((await stat(join(dataDir, 'note'))).uid).toBe(0);
    expect(a.user_namespace).toBe(true);

    const listed = await s.api('GET', '/volumes');
    expect(listed.body.items.find((x: { name: string }) => x.name === 'shared').instances.sort()).toEqual([a.id, b.id].sort());
    const busy = await del('/volumes/shared');
    expect(busy.status).toBe(409);
    expect(busy.body.error.details).toMatchObject({ reason: 'VOLUME_IN_USE' });

    expect((await del(`/instances/${a.id}`)).status).toBe(204);
    expect((await sh(b.id, 'cat /mnt/ro/note /mnt/ro/dir/who')).stdout).toBe('from-a\n0\n');
    const c = await s.instance({ volumes: [{ name: 'shared', path: '/srv' }] });
    expect((await sh(c.id, 'cat /srv/note')).stdout).toBe('from-a\n');
    for (const id of [b.id, c.id]) expect((await del(`/instances/${id}`)).status).toBe(204);
    expect((await del('/volumes/shared')).status).toBe(204);
    expect((await s.api('GET', '/volumes/shared')).status).toBe(404);
    expect((await lstat(join(s.dataDir, 'persistent-volumes', v.id)).catch(() => null))).toBeNull();
  });

  it('fill up at their size: ENOSPC inside, 507 for a file written through the API', async () => {
    await volume('small', 64);
    const inst = await s.instance({ volumes: [{ name: 'small', path: '/data' }] });
    const dd = await sh(inst.id, 'dd if=/dev/zero of=/data/big bs=1M count=100 2>&1; echo exit=$?');
    expect(dd.stdout).toMatch(/No space left on device/);
    expect(dd.stdout).not.toContain('exit=0');
    const info = (await s.api('GET', '/volumes/small')).body;
    expect(info.used_bytes).toBeGreaterThan(40 * 1024 * 1024);
    expect(info.used_bytes).toBeLessThanOrEqual(64 * 1024 * 1024);
    // The rest of the instance's disk is not the volume's: it still writes there.
    expect((await sh(inst.id, 'echo fine > /root/ok && cat /root/ok')).stdout).toBe('fine\n');
    const put = await request(`${s.url}/instances/${inst.id}/files?path=/data/more.bin`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/octet-stream' },
      body: Buffer.alloc(32 * 1024 * 1024, 1),
    });
    const answer = await put.body.json() as { error: { code: string; message: string } };
    expect(put.statusCode).toBe(507);
    expect(answer.error.code).toBe('INSUFFICIENT_STORAGE');
    expect(answer.error.message).toContain('/data/more.bin');
    expect((await del(`/instances/${inst.id}`)).status).toBe(204);
    expect((await del('/volumes/small')).status).toBe(204);
  });

  it('are their owner\'s alone: another owner gets 404 for the name, and cannot mount it', async () => {
    await volume('private');
    expect((await s.api('GET', '/volumes/private', undefined, other)).status).toBe(404);
    expect((await s.api('DELETE', '/volumes/private', undefined, other)).status).toBe(404);
    expect((await s.api('GET', '/volumes', undefined, other)).body.items).toEqual([]);
    const mount = await s.api('POST', '/instances', { volumes: [{ name: 'private', path: '/data' }] }, other);
    expect(mount.status).toBe(404);
    // The same name is free for them: names are per owner.
    expect((await s.api('POST', '/volumes', { name: 'private', size_mb: 64 }, other)).status).toBe(201);
    expect((await s.api('DELETE', '/volumes/private', undefined, other)).status).toBe(204);
    expect((await s.api('GET', '/volumes/private')).status).toBe(200);
    expect((await del('/volumes/private')).status).toBe(204);
  });

  it('refuse bad names, sizes and paths with 400, a second volume of a name with 409', async () => {
    await volume('checks');
    expect((await s.api('POST', '/volumes', { name: 'checks', size_mb: 64 })).body.error.details).toMatchObject({ reason: 'VOLUME_EXISTS' });
    for (const body of [{ name: 'Bad Name', size_mb: 64 }, { name: 'tiny', size_mb: 1 }, { name: 'huge', size_mb: 1 << 24 }]) {
      expect((await s.api('POST', '/volumes', body)).status, JSON.stringify(body)).toBe(400);
    }
    for (const path of ['/', 'relative', '/proc/x', '/dev', '/.fp/x', '/tmp', '/a/../etc', '/a/./b', '/a//b', '/with:colon', '/with]bracket']) {
      const r = await s.api('POST', '/instances', { volumes: [{ name: 'checks', path }] });
      expect(r.status, path).toBe(400);
    }
    const nested = await s.api('POST', '/instances', { volumes: [{ name: 'checks', path: '/a' }, { name: 'checks', path: '/a/b' }] });
    expect(nested.status).toBe(400);
    expect((await s.api('POST', '/instances', { volumes: [{ name: 'nope', path: '/a' }] })).status).toBe(404);
    expect((await s.api('GET', '/instances')).body.items).toEqual([]);
    expect((await del('/volumes/checks')).status).toBe(204);
  });

  it('are left as they are by a rollback, shared with a fork (or an empty read-only directory, as asked), kept through hibernation', async () => {
    await volume('kept');
    const inst = await s.instance({ volumes: [{ name: 'kept', path: '/kept' }] });
    // A process whose working directory is in the volume, alive across it all.
    await sh(inst.id, 'echo v1 > /kept/f; echo v1 > /root/f');
    const proc = await s.api('POST', `/instances/${inst.id}/processes`, { command: 'cd /kept && i=0; while true; do i=$((i+1)); echo $i > /kept/alive.new; mv /kept/alive.new /kept/alive; sleep 0.1; done' });
    expect(proc.status).toBe(201);
    const cp = await checkpoint(inst.id);
    await sh(inst.id, 'echo v2 > /kept/f; echo v2 > /root/f');

    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: cp.id })).status).toBe(200);
    // The instance's disk went back; the volume did not.
    expect((await sh(inst.id, 'cat /root/f /kept/f')).stdout).toBe('v1\nv2\n');
    const ticks = async (id: string) => (await sh(id, 'cat /kept/alive')).stdout;
    // Alive: its count moves (within seconds, not a fixed 400 ms: three test files share two cores).
    const ticking = async (id: string) => {
      const first = await ticks(id);
      await until('the volume\'s ticker to move on', async () => (await ticks(id)) !== first, 5_000);
    };
    await ticking(inst.id);

    const same = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: cp.id });
    expect(same.status).toBe(201);
    expect(same.body.volumes).toEqual([{ name: 'kept', path: '/kept', read_only: false }]);
    await sh(same.body.id, 'echo from-fork > /kept/fork-note');
    expect((await sh(inst.id, 'cat /kept/fork-note')).stdout).toBe('from-fork\n');

    // A fork without the volume: its processes were in it, so a memory fork cannot be made...
    const none = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: cp.id, volumes: 'none' });
    expect(none.status).toBe(503);
    expect(none.body.error.details).toMatchObject({ engine: 'RESTORE_FAILED' });
    expect((await s.api('GET', '/instances')).body.items.map((i: { id: string }) => i.id).sort()).toEqual([inst.id, same.body.id].sort());
    // ...but a files-only one boots with an empty, read-only directory in the volume's place.
    const filesOnly = await checkpoint(inst.id, { memory: false });
    const bare = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: filesOnly.id, volumes: 'none' });
    expect(bare.status).toBe(201);
    expect(bare.body.volumes).toEqual([{ name: null, path: '/kept', read_only: true }]);
    expect((await sh(bare.body.id, 'ls -A /kept | wc -l; touch /kept/x 2>&1 || echo refused')).stdout).toMatch(/^0\n.*refused\n$/s);
    const listed = (await s.api('GET', '/volumes/kept')).body.instances;
    expect(listed.sort()).toEqual([inst.id, same.body.id].sort());

    // Hibernation dumps the memory and restores it on the same volume.
    expect((await s.api('POST', `/instances/${inst.id}/hibernate`)).status).toBe(200);
    await sh(same.body.id, 'echo while-asleep > /kept/f');
    expect((await sh(inst.id, 'cat /kept/f')).stdout).toBe('while-asleep\n');
    await ticking(inst.id);

    for (const id of [inst.id, same.body.id, bare.body.id]) expect((await del(`/instances/${id}`)).status).toBe(204);
    expect((await del('/volumes/kept')).status).toBe(204);
  });

  it('are watched with inotify through a checkpoint and a rollback (CRIU opens a volume\'s inodes by handle itself)', async () => {
    await volume('watched');
    const inst = await s.instance({ image: 'debian', volumes: [{ name: 'watched', path: '/src' }] });
    expect((await s.api('PUT', `/instances/${inst.id}/files?path=/opt/watcher.py`, WATCHER, { authorization: `Bearer ${s.token}`, 'content-type': 'application/octet-stream' })).status).toBe(200);
    await sh(inst.id, 'mkdir -p /src/sub');
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'python3 /opt/watcher.py /src /src/sub' });
    const events = async () => (await sh(inst.id, 'cat /tmp/events')).stdout as string;
    await until('the watcher', async () => (await events()).includes('watching'), 10_000);
    const cp = await checkpoint(inst.id);
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: cp.id })).status).toBe(200);
    await sh(inst.id, 'touch /src/sub/after-rollback');
    await until('the event', async () => (await events()).includes('2 after-rollback\n'), 10_000);
  });

  it('stay mounted by their instances through a server restart, and mount again after it', async () => {
    await volume('durable');
    const inst = await s.instance({ volumes: [{ name: 'durable', path: '/d' }] });
    await sh(inst.id, 'echo before > /d/f');
    const cp = await checkpoint(inst.id);
    const dataDir = s.dataDir;
    await s.close({ keepSandboxes: true });
    s = await startServer({}, dataDir);
    expect((await s.api('GET', `/instances/${inst.id}`)).body.status).toBe('running');
    expect((await sh(inst.id, 'cat /d/f')).stdout).toBe('before\n');
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: cp.id })).status).toBe(200);
    const second = await s.instance({ volumes: [{ name: 'durable', path: '/d' }] });
    expect((await sh(second.id, 'cat /d/f')).stdout).toBe('before\n');
  });

  it('mount on the host\'s ids too (user_namespace false), the files the same', async () => {
    await volume('plain');
    const userns = await s.instance({ volumes: [{ name: 'plain', path: '/v' }] });
    await sh(userns.id, 'echo hi > /v/f && chown 1000:1000 /v/f');
    const host = await s.instance({ user_namespace: false, volumes: [{ name: 'plain', path: '/v' }] });
    expect((await sh(host.id, 'stat -c %u:%g /v/f; cat /v/f')).stdout).toBe('1000:1000\nhi\n');
    const cp = await checkpoint(host.id);
    expect((await s.api('POST', `/instances/${host.id}/rollback`, { checkpoint_id: cp.id })).status).toBe(200);
    expect((await sh(host.id, 'cat /v/f')).stdout).toBe('hi\n');
    for (const id of [userns.id, host.id]) expect((await del(`/instances/${id}`)).status).toBe(204);
    expect((await del('/volumes/plain')).status).toBe(204);
  });

  it('attack: an image whose mount point is a symlink to a host path gets a failed boot, not a volume on the host', async () => {
    // The build runs in a sandbox: the link is the image's, as an attacker's image would have it.
    const built = await s.api('POST', '/images', { name: 'linked', dockerfile: 'FROM default\nRUN ln -s /etc /data && mkdir -p /home && ln -s /root /home/link\n' });
    expect(built.status).toBe(201);
    await volume('target');
    const hostEtc = await readFile('/etc/hostname', 'utf8').catch(() => '');
    for (const path of ['/data', '/home/link/inner']) {
      const r = await s.api('POST', '/instances', { image: 'linked', volumes: [{ name: 'target', path }] });
      expect(r.status, path).toBe(503);
      expect(r.body.error.message, path).toMatch(/volume mount point/);
    }
    // Nothing was mounted over the host's directories, nothing written there.
    const mounts = await readFile('/proc/self/mountinfo', 'utf8');
    expect(mounts.split('\n').filter((l) => / \/etc | \/root /.test(l))).toEqual([]);
    expect(await readFile('/etc/hostname', 'utf8').catch(() => '')).toBe(hostEtc);
    expect((await s.api('GET', '/instances')).body.items.filter((i: { status: string }) => i.status !== 'error')).toEqual([]);
    for (const i of (await s.api('GET', '/instances')).body.items) await del(`/instances/${i.id}`);
    expect((await del('/volumes/target')).status).toBe(204);
    expect((await del('/images/linked')).status).toBe(204);
  });

  it('from the command line: volume create, create --volume, cp into it, volume ls, volume rm', async () => {
    const work = await mkdtemp(join(tmpdir(), 'forkpoint-volumes-cli-'));
    try {
      const env = { ...(process.env as Record<string, string>), FORKPOINT_URL: s.url, FORKPOINT_TOKEN: s.token, XDG_CONFIG_HOME: join(work, 'config'), NO_COLOR: '1' };
      const fp = (...args: string[]) => execa(process.execPath, [CLI, ...args], { env, reject: false });
      expect((await fp('volume', 'create', 'cli-vol', '--size', '64')).stdout).toBe('cli-vol');
      const made = await fp('create', '--volume', 'cli-vol:/workspace', '--volume', 'cli-vol:/ro:ro');
      expect(made.exitCode, made.stderr).toBe(0);
      const id = made.stdout.trim();
      await writeFile(join(work, 'in.txt'), 'copied in\n');
      expect((await fp('cp', join(work, 'in.txt'), `${id}:/workspace/in.txt`)).exitCode).toBe(0);
      expect((await sh(id, 'cat /ro/in.txt')).stdout).toBe('copied in\n');
      const ls = await fp('volume', 'ls');
      expect(ls.stdout).toMatch(/^NAME\s+SIZE\s+USED\s+INSTANCES/);
      expect(ls.stdout).toMatch(/cli-vol\s+64(\.0)? MiB\s+\S+ \S+\s+1\s/);
      const busy = await fp('volume', 'rm', 'cli-vol');
      expect(busy.exitCode).toBe(1);
      expect(busy.stderr).toContain('mounted by');
      expect((await fp('--json', 'volume', 'inspect', 'cli-vol')).exitCode).toBe(0);
      expect((await fp('rm', id)).exitCode).toBe(0);
      expect((await fp('volume', 'rm', 'cli-vol')).stdout).toBe('cli-vol');
      const bad = await fp('create', '--volume', 'no-path');
      expect(bad.exitCode).toBe(2);
      expect(bad.stderr).toContain('NAME:/PATH');
    } finally {
      await rm(work, { recursive: true, force: true });
    }
  });
});
