import { Sandbox } from '@opencomputer/sdk';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';

let s: TestServer;
let opts: { apiUrl: string; apiKey: string };
beforeAll(async () => {
  s = await startServer();
  opts = { apiUrl: s.url, apiKey: s.token };
});
afterAll(async () => s?.close());

describe('the published @opencomputer/sdk, unchanged, against forkpoint', () => {
  it('creates a sandbox, runs commands, reads and writes files, connects and kills', async () => {
    const sb = await Sandbox.create({ ...opts, envs: { GREETING: 'hi' }, metadata: { via: 'sdk' } });
    expect(sb.sandboxId).toMatch(/^inst_/);
    expect(sb.status).toBe('running');
    const r = await sb.exec.run('echo $GREETING; echo oops >&2; exit 3');
    expect(r).toEqual({ exitCode: 3, stdout: 'hi\n', stderr: 'oops\n' });
    expect((await sb.exec.run('pwd', { cwd: '/tmp' })).stdout).toBe('/tmp\n');

    await sb.files.write('/work/notes/a.txt', 'hello files\n');
    expect(await sb.files.read('/work/notes/a.txt')).toBe('hello files\n');
    await sb.files.write('/work/bin.dat', new Uint8Array([0, 1, 2, 255]));
    expect(Array.from(await sb.files.readBytes('/work/bin.dat'))).toEqual([0, 1, 2, 255]);
    await sb.files.makeDir('/work/empty/deep');
    const entries = await sb.files.list('/work');
    expect(entries.map((e) => [e.name, e.isDir]).sort()).toEqual([['bin.dat', false], ['empty', true], ['notes', true]]);
    expect(await sb.files.exists('/work/notes/a.txt')).toBe(true);
    await sb.files.remove('/work/notes/a.txt');
    expect(await sb.files.exists('/work/notes/a.txt')).toBe(false);
    expect((await sb.exec.run('cat /work/bin.dat | wc -c')).stdout.trim()).toBe('4');

    const again = await Sandbox.connect(sb.sandboxId, opts);
    expect(await again.isRunning()).toBe(true);
    await again.kill();
    await expect(Sandbox.connect(sb.sandboxId, opts)).rejects.toThrow(/404/);
  });

  it('its default sandbox is OpenComputer\'s: commands as `sandbox` (uid 1000, HOME /home/sandbox) who may sudo, /workspace theirs and a mount of its own, jq; root on request through the shell\'s sudo only', async () => {
    const sb = await Sandbox.create({ ...opts, template: 'base' } as Parameters<typeof Sandbox.create>[0]);
    const r = await sb.exec.run('whoami; id -u; echo $HOME; sudo -n whoami; stat -c %U /workspace; touch /workspace/mine && echo wrote; jq -n 1+1; df /workspace | tail -1 | awk \'{print $NF}\'');
    expect(r).toEqual({ exitCode: 0, stdout: 'sandbox\n1000\n/home/sandbox\nroot\nsandbox\nwrote\n2\n/workspace\n', stderr: '' });
    // Not root by default: what only root may do is refused. Commands start in the user's home.
    expect((await request(`${s.url}/api/sandboxes/${sb.sandboxId}/exec/run`, { method: 'POST', headers: { 'x-api-key': s.token, 'content-type': 'application/json' }, body: JSON.stringify({ cmd: 'pwd' }) }).then((r) => r.body.json()))).toMatchObject({ exitCode: 0, stdout: '/home/sandbox\n' });
    expect((await sb.exec.run('pwd')).stdout).toBe('/home/sandbox\n');
    expect((await sb.exec.run('touch /etc/owned')).exitCode).not.toBe(0);
    // A second sandbox finds the image built; a checkpoint's sandbox is the same machine.
    const other = await Sandbox.create(opts);
    expect((await other.exec.run('whoami')).stdout).toBe('sandbox\n');
    const ck = await other.createCheckpoint('as-sandbox');
    const fork = await Sandbox.createFromCheckpoint(ck.id, opts);
    expect((await fork.exec.run('whoami')).stdout).toBe('sandbox\n');
    for (const x of [sb, other, fork]) await x.kill();
  });

  it('checkpoints, restores in place, and creates a sandbox from a checkpoint', async () => {
    const sb = await Sandbox.create(opts);
    await sb.files.write('/root/state.txt', 'before\n');
    const cp = await sb.createCheckpoint('before');
    expect(cp).toMatchObject({ sandboxId: sb.sandboxId, name: 'before' });
    await sb.files.write('/root/state.txt', 'after\n');
    await sb.restoreCheckpoint(cp.id);
    expect(await sb.files.read('/root/state.txt')).toBe('before\n');
    const list = await sb.listCheckpoints();
    expect(list.map((c) => c.id)).toEqual([cp.id]);
    expect(list[0]!.status).toBe('ready');

    const fork = await Sandbox.createFromCheckpoint(cp.id, opts);
    expect(fork.sandboxId).not.toBe(sb.sandboxId);
    expect(await fork.files.read('/root/state.txt')).toBe('before\n');
    await fork.files.write('/root/state.txt', 'fork\n');
    expect(await sb.files.read('/root/state.txt')).toBe('before\n');

    await sb.hibernate();
    expect((await Sandbox.connect(sb.sandboxId, opts)).status).toBe('hibernated');
    await sb.wake();
    expect(await sb.files.read('/root/state.txt')).toBe('before\n');
    await sb.deleteCheckpoint(cp.id);
    expect(await sb.listCheckpoints()).toEqual([]);
    await fork.kill();
    await sb.kill();
  });

  it('as OpenComputer answers them (issue 23): /workspace there, a directory removed with what is in it, a checkpoint name taken (409), the checkpoint limit (400)', async () => {
    const small = await startServer({ maxCheckpointsPerInstance: 2 });
    try {
      const o = { apiUrl: small.url, apiKey: small.token };
      const sb = await Sandbox.create(o);
      // Its examples' working directory is there (they write to it with the shell).
      expect((await sb.exec.run('echo here > /workspace/marker && cat /workspace/marker')).stdout).toBe('here\n');
      await sb.files.write('/work/tree/deep/a.txt', 'a');
      expect((await sb.exec.run('sudo -n ln -s /etc /work/tree/etc-link')).exitCode).toBe(0); // in root's directory
      await sb.files.remove('/work/tree');
      expect([await sb.files.exists('/work/tree'), await sb.files.exists('/etc/passwd')]).toEqual([false, true]);
      await sb.files.remove('/work/never-was');
      await sb.createCheckpoint('one');
      await expect(sb.createCheckpoint('one')).rejects.toThrow(/409/);
      await sb.createCheckpoint('two');
      await expect(sb.createCheckpoint('three')).rejects.toThrow(/400/);
      expect((await sb.listCheckpoints()).map((c) => c.name).sort()).toEqual(['one', 'two']);
      await sb.kill();
    } finally {
      await small.close();
    }
  });

  it('downloadUrl and uploadUrl: a link that reads or writes one file with no key, and nothing else', async () => {
    const sb = await Sandbox.create(opts);
    try {
      await sb.files.write('/root/report.txt', 'the report\n');
      const down = await sb.downloadUrl('/root/report.txt', { expiresIn: 60 });
      const got = await fetch(down);
      expect([got.status, await got.text()]).toEqual([200, 'the report\n']);
      const up = await sb.uploadUrl('/root/upload.txt');
      expect((await fetch(up, { method: 'PUT', body: 'put with no key\n' })).status).toBe(204);
      expect(await sb.files.read('/root/upload.txt')).toBe('put with no key\n');

      // Another path, the other direction, another sandbox, a changed signature, or a link made
      // by a token revoked since: refused, and nothing read or written.
      const other = new URL(down);
      other.searchParams.set('path', '/etc/shadow');
      expect((await fetch(other)).status).toBe(401);
      expect((await fetch(down, { method: 'PUT', body: 'overwrite' })).status).toBe(401);
      expect(await sb.files.read('/root/report.txt')).toBe('the report\n');
      expect((await fetch(up)).status).toBe(401);
      const second = await Sandbox.create(opts);
      expect((await fetch(down.replace(sb.sandboxId, second.sandboxId))).status).toBe(401);
      await second.kill();
      const forged = new URL(down);
      forged.searchParams.set('signature', forged.searchParams.get('signature')!.replace(/.$/, (c) => (c === 'A' ? 'B' : 'A')));
      expect((await fetch(forged)).status).toBe(401);
      const { token, record } = await s.fp.store.tokens.create('default', 'short-lived');
      const byRevoked = await Sandbox.connect(sb.sandboxId, { apiUrl: s.url, apiKey: token });
      const link = await byRevoked.downloadUrl('/root/report.txt');
      expect((await fetch(link)).status).toBe(200);
      await s.fp.store.tokens.revoke(record.id);
      expect((await fetch(link)).status).toBe(401);
    } finally {
      await sb.kill();
    }
  });

  it('a wrong key is refused', async () => {
    await expect(Sandbox.create({ apiUrl: s.url, apiKey: 'nope' })).rejects.toThrow(/401/);
  });
});
