import { execa } from 'execa';
import { request } from 'undici';
import { readFileSync, statSync } from 'node:fs';
import { CommandExitError, FileNotFoundError, InvalidArgumentError, Sandbox, SandboxError, TimeoutError, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';
import { until } from './helpers/wait.js';

let s: TestServer;
beforeAll(async () => {
  s = await startServer();
  // The SDK is pointed at forkpoint by its three environment variables and nothing else.
  process.env.E2B_API_URL = s.url;
  process.env.E2B_SANDBOX_URL = s.url;
  process.env.E2B_API_KEY = s.token;
  process.env.E2B_VOLUME_API_URL = s.url;
});
afterAll(async () => {
  delete process.env.E2B_API_URL;
  delete process.env.E2B_SANDBOX_URL;
  delete process.env.E2B_API_KEY;
  delete process.env.E2B_VOLUME_API_URL;
  await s?.close();
});

describe('the published e2b SDK, unchanged', () => {
  it('creates a sandbox, runs commands (output, exit errors, streaming) and kills it', async () => {
    const sbx = await Sandbox.create();
    expect(sbx.sandboxId).toMatch(/^inst_/);
    const r = await sbx.commands.run('echo hi');
    expect(r.stdout).toBe('hi\n');
    expect(r.exitCode).toBe(0);
    const failed = await sbx.commands.run('echo oops >&2; exit 3').catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(CommandExitError);
    expect((failed as CommandExitError).exitCode).toBe(3);
    expect((failed as CommandExitError).stderr).toBe('oops\n');
    const lines: string[] = [];
    await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => void lines.push(d) });
    expect(lines.join('')).toBe('line1\nline2\nline3\n');
    expect(await sbx.isRunning()).toBe(true);
    await sbx.kill();
    expect((await s.api('GET', `/instances/${sbx.sandboxId}`)).status).toBe(404);
  });

  it('files: write, read, list, exists, makeDir, remove', async () => {
    const sbx = await Sandbox.create();
    await sbx.files.write('/tmp/a.txt', 'hello file');
    expect(await sbx.files.read('/tmp/a.txt')).toBe('hello file');
    await sbx.files.write('notes.txt', 'in the home');
    expect((await sbx.commands.run('cat /home/user/notes.txt')).stdout).toBe('in the home');
    expect(await sbx.files.exists('/tmp/a.txt')).toBe(true);
    expect(await sbx.files.exists('/tmp/nope')).toBe(false);
    expect(await sbx.files.makeDir('/tmp/d/e')).toBe(true);
    expect(await sbx.files.makeDir('/tmp/d/e')).toBe(false);
    const names = (await sbx.files.list('/tmp')).map((e) => e.name).sort();
    expect(names).toEqual(expect.arrayContaining(['a.txt', 'd']));
    await sbx.files.remove('/tmp/d');
    expect(await sbx.files.exists('/tmp/d')).toBe(false);
    await sbx.kill();
  });

  it('a background command: commands.list, sendStdin, kill', async () => {
    const sbx = await Sandbox.create();
    const out: string[] = [];
    const h = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => void out.push(d) });
    expect((await sbx.commands.list()).map((p) => p.pid)).toContain(h.pid);
    await sbx.commands.sendStdin(h.pid, 'typed\n');
    await until('the echo', () => out.join('').includes('typed'));
    expect(await sbx.commands.kill(h.pid)).toBe(true);
    await until('gone from the list', async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid));
    // A terminal of a size no frame can carry is the caller's mistake, said as such.
    await expect(sbx.pty.create({ rows: 100_000, cols: 80, onData: () => {} })).rejects.toThrow(/1 to 1000 rows and columns/);
    const pty = await sbx.pty.create({ rows: 24, cols: 80, onData: () => {} });
    await expect(sbx.pty.resize(pty.pid, { rows: 24, cols: 70_000 })).rejects.toThrow(InvalidArgumentError);
    await sbx.pty.kill(pty.pid);
    await sbx.kill();
  });
});

describe('volumes through the e2b SDK', () => {
  it('Sandbox.create({volumeMounts}) mounts a forkpoint volume by name; a second sandbox sees what the first wrote; getInfo says where', async () => {
    expect((await s.api('POST', '/volumes', { name: 'e2b-shared', size_mb: 64 })).status).toBe(201);
    const a = await Sandbox.create({ volumeMounts: { '/mnt/shared': 'e2b-shared' } });
    const b = await Sandbox.create({ volumeMounts: { '/mnt/shared': 'e2b-shared' } });
    try {
      await a.files.write('/mnt/shared/note.txt', 'written by a');
      expect(await b.files.read('/mnt/shared/note.txt')).toBe('written by a');
      expect((await b.getInfo()).volumeMounts).toEqual([{ name: 'e2b-shared', path: '/mnt/shared' }]);
      // A volume that is not there: the SDK's not-found error, no sandbox made.
      await expect(Sandbox.create({ volumeMounts: { '/x': 'no-such-volume' } })).rejects.toThrow(/volume no-such-volume not found/);
    } finally {
      await a.kill();
      await b.kill();
      expect((await s.api('DELETE', '/volumes/e2b-shared')).status).toBe(204);
    }
  });
});

describe('E2B\'s Volume class (its /volumes and its volume content API)', () => {
  it('creates, lists and finds a volume; writes, reads, lists and removes its files with no sandbox; a sandbox mounting it sees them', async () => {
    const vol = await Volume.create('e2b-Content');
    expect(vol.volumeId).toMatch(/^vol_/);
    expect(vol.token).toMatch(/\./);
    expect((await Volume.list()).map((v) => v.name)).toContain('e2b-Content');
    expect(await Volume.getInfo(vol.volumeId)).toMatchObject({ volumeId: vol.volumeId, name: 'e2b-Content', token: vol.token });
    // forkpoint's own clients (no E2B SDK) still get forkpoint's answer on the same path.
    expect((await s.api('GET', '/volumes')).body.items.map((v: { name: string }) => v.name)).toContain('e2b-Content');
    let sbx: Sandbox | undefined;
    try {
      const written = await vol.writeFile('/dir/a.txt', 'hello volume');
      expect(written).toMatchObject({ name: 'a.txt', path: '/dir/a.txt', type: 'file', size: 12, uid: 0 });
      expect(await vol.readFile('/dir/a.txt')).toBe('hello volume');
      expect(await vol.readFile('dir/a.txt', { format: 'bytes' })).toEqual(new TextEncoder().encode('hello volume'));
      await vol.writeFile('/dir/a.txt', 'replaced');
      await expect(vol.writeFile('/dir/a.txt', 'not again', { force: false })).rejects.toThrow(VolumeError);
      expect(await vol.readFile('/dir/a.txt')).toBe('replaced');
      const owned = await vol.writeFile('/dir/user.txt', 'x', { uid: 1000, gid: 1000, mode: 0o600 });
      expect([owned.uid, owned.gid, owned.mode & 0o777]).toEqual([1000, 1000, 0o600]);
      const changed = await vol.updateMetadata('/dir/a.txt', { uid: 1001, gid: 1002, mode: 0o640 });
      expect([changed.uid, changed.gid, changed.mode & 0o7777]).toEqual([1001, 1002, 0o640]);
      const moded = await vol.updateMetadata('/dir/a.txt', { mode: 0o644 }); // what is not given stays
      expect([moded.uid, moded.gid, moded.mode & 0o7777]).toEqual([1001, 1002, 0o644]);
      await expect(vol.updateMetadata('/nope', { mode: 0o600 })).rejects.toThrow(VolumePathNotFoundError);
      expect((await vol.makeDir('/made/deep', { force: true })).type).toBe('directory');
      expect((await vol.getInfo('/made')).type).toBe('directory');
      expect(await vol.exists('/nope')).toBe(false);
      await expect(vol.readFile('/nope')).rejects.toThrow(VolumePathNotFoundError);
      expect((await vol.list('/')).map((e) => e.path).sort()).toEqual(['/dir', '/made']);
      expect((await vol.list('/', { depth: 3 })).map((e) => e.path).sort()).toEqual(['/dir', '/dir/a.txt', '/dir/user.txt', '/made', '/made/deep']);

      sbx = await Sandbox.create({ volumeMounts: { '/mnt/v': vol } });
      expect((await sbx.commands.run('cat /mnt/v/dir/a.txt; stat -c %u /mnt/v/dir/user.txt')).stdout).toBe('replaced1000\n');
      expect((await sbx.commands.run("stat -c '%u:%g %a' /mnt/v/dir/a.txt")).stdout).toBe('1001:1002 644\n');
      await sbx.commands.run('echo from the sandbox > /mnt/v/back.txt', { user: 'root' });
      expect(await vol.readFile('/back.txt')).toBe('from the sandbox\n');
      // A volume in use is not destroyed.
      await expect(Volume.destroy(vol.volumeId)).rejects.toThrow(VolumeError);
      await vol.remove('/made');
      expect(await vol.exists('/made')).toBe(false);
    } finally {
      await sbx?.kill();
    }
    expect(await Volume.destroy(vol.volumeId)).toBe(true);
    await expect(Volume.getInfo(vol.volumeId)).rejects.toThrow(VolumeNotFoundError);
  });

  it('attack: what a sandbox leaves in a volume (symlinks to host paths, .. chains, a FIFO) reaches nothing of the host through the content API; one volume\'s token opens no other, another owner finds none', async () => {
    const vol = await Volume.create('e2b-hostile');
    const other = await Volume.create('e2b-other');
    const sbx = await Sandbox.create({ volumeMounts: { '/mnt/h': vol } });
    try {
      await sbx.commands.run('cd /mnt/h && ln -s /etc/hostname abs && ln -s ../../../../../../etc/hostname rel && ln -s / root && mkfifo fifo && mkdir d && ln -s /etc d/etc', { user: 'root' });
      const host = readFileSync('/etc/hostname', 'utf8');
      for (const path of ['/abs', '/rel', '/root/etc/hostname', '/d/etc/hostname', '/../../../etc/hostname', '/etc/hostname']) {
        const got = await vol.readFile(path).then((t) => t, (e: unknown) => e);
        expect(got, path).toBeInstanceOf(VolumeError);
        expect(String(got)).not.toContain(host.trim());
      }
      // A FIFO is refused at once, not waited on for a writer.
      await expect(vol.readFile('/fifo')).rejects.toThrow(VolumeError);
      expect((await vol.getInfo('/abs')).type).toBe('symlink');
      // Owner and mode changes reach no host file either: a link keeps its target's mode (it has
      // none of its own: refused), its owner is its own.
      const hostFile = statSync('/etc/hostname');
      await expect(vol.updateMetadata('/abs', { mode: 0o777 })).rejects.toThrow(VolumeError);
      expect((await vol.updateMetadata('/abs', { uid: 1234 })).uid).toBe(1234);
      await vol.updateMetadata('/root/etc/hostname', { uid: 1234, mode: 0o777 }).catch(() => {});
      expect([statSync('/etc/hostname').uid, statSync('/etc/hostname').mode]).toEqual([hostFile.uid, hostFile.mode]);
      // Writing through a symlink stays in the volume too: the host's file is untouched.
      await vol.writeFile('/root/etc/forkpoint-volume-escape', 'x').catch(() => {});
      expect(() => readFileSync('/etc/forkpoint-volume-escape')).toThrow();
      // One volume's token opens that volume only (it is no credential for another); a made-up
      // token nothing.
      expect((await fetch(`${s.url}/volumecontent/${vol.volumeId}/path?path=/`, { headers: { authorization: `Bearer ${vol.token}` } })).status).toBe(200);
      const crossed = await fetch(`${s.url}/volumecontent/${other.volumeId}/path?path=/`, { headers: { authorization: `Bearer ${vol.token}` } });
      expect(crossed.status).toBe(401);
      const forged = await fetch(`${s.url}/volumecontent/${vol.volumeId}/path?path=/`, { headers: { authorization: `Bearer ${vol.token.slice(0, -2)}xx` } });
      expect(forged.status).toBe(401);
      // Another owner's API token: no such volume.
      const stranger = await s.fp.store.tokens.create('stranger', 'e2b volumes');
      await expect(Volume.getInfo(vol.volumeId, { apiKey: stranger.token })).rejects.toThrow(VolumeNotFoundError);
      const theirs = await fetch(`${s.url}/volumecontent/${vol.volumeId}/file?path=/abs`, { headers: { authorization: `Bearer ${stranger.token}` } });
      expect(theirs.status).toBe(404);
    } finally {
      await sbx.kill();
      await Volume.destroy(vol.volumeId);
      await Volume.destroy(other.volumeId);
    }
  });
});

describe('what E2B\'s own SDK tests found (issue 23)', () => {
  it('a multi-file write puts each file at its own path, directories made; a gzip upload is stored as its content', async () => {
    const sbx = await Sandbox.create();
    try {
      const written = await sbx.files.write([
        { path: '/tmp/multi/one/a.txt', data: 'A' },
        { path: 'rel/dir/b.txt', data: 'B' },
      ]);
      expect(written.map((w) => w.path).sort()).toEqual(['/home/user/rel/dir/b.txt', '/tmp/multi/one/a.txt']);
      expect(await sbx.files.read('/tmp/multi/one/a.txt')).toBe('A');
      expect(await sbx.files.read('/home/user/rel/dir/b.txt')).toBe('B');
      await sbx.files.write('/tmp/zipped.txt', 'stored as it reads', { gzip: true });
      expect((await sbx.commands.run('cat /tmp/zipped.txt')).stdout).toBe('stored as it reads');
    } finally {
      await sbx.kill();
    }
  });

  it('isRunning is false once a sandbox is paused, and once it is killed (it threw)', async () => {
    const paused = await Sandbox.create();
    const killed = await Sandbox.create();
    try {
      expect(await paused.isRunning()).toBe(true);
      await paused.pause();
      expect(await paused.isRunning()).toBe(false);
      await killed.kill();
      expect(await killed.isRunning()).toBe(false);
    } finally {
      await paused.kill().catch(() => {});
    }
  });

  it('files as envd lists them: sorted by name, a link as what it points to with an absolute target, and a missing file removed without an error', async () => {
    const sbx = await Sandbox.create();
    try {
      // Created out of order; envd walks a directory in name order (it answered the agent's).
      await sbx.commands.run('mkdir -p /tmp/ls/b /tmp/ls/a && touch /tmp/ls/c /tmp/ls/B /tmp/ls/a/z /tmp/ls/a/y && cd /tmp/ls && ln -s c link && ln -s link link2 && ln -s gone dangling');
      const top = await sbx.files.list('/tmp/ls');
      expect(top.map((e) => e.name)).toEqual(['B', 'a', 'b', 'c', 'dangling', 'link', 'link2']);
      expect((await sbx.files.list('/tmp/ls', { depth: 2 })).map((e) => e.path)).toEqual(
        ['/tmp/ls/B', '/tmp/ls/a', '/tmp/ls/a/y', '/tmp/ls/a/z', '/tmp/ls/b', '/tmp/ls/c', '/tmp/ls/dangling', '/tmp/ls/link', '/tmp/ls/link2']);
      const link = await sbx.files.getInfo('/tmp/ls/link');
      expect([link.type, link.symlinkTarget]).toEqual(['file', '/tmp/ls/c']);
      const chained = top.find((e) => e.name === 'link2')!;
      expect([chained.type, chained.symlinkTarget]).toEqual(['file', '/tmp/ls/c']);
      const dangling = top.find((e) => e.name === 'dangling')!;
      expect([dangling.type, dangling.symlinkTarget]).toEqual(['symlink', '/tmp/ls/gone']);
      await sbx.files.remove('/tmp/ls/never-was');
      await sbx.files.remove('/tmp/ls/link');
      expect([await sbx.files.exists('/tmp/ls/link'), await sbx.files.exists('/tmp/ls/c')]).toEqual([false, true]);
    } finally {
      await sbx.kill();
    }
  });

  it('a sysctl file reads as what it holds (it answered "Cannot allocate memory")', async () => {
    const sbx = await Sandbox.create();
    try {
      const bootId = (await sbx.files.read('/proc/sys/kernel/random/boot_id')).trim();
      expect(bootId).toMatch(/^[0-9a-f-]{36}$/);
      expect(bootId).toBe((await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim());
    } finally {
      await sbx.kill();
    }
  });

  it('a command past its request\'s deadline ends the stream with deadline_exceeded and is killed (the stream just stopped: E2B\'s Python SDK read a command with no end)', async () => {
    const made = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 60 }, { 'x-api-key': s.token });
    const id: string = made.body.sandboxID;
    try {
      // Connect's streaming framing, as E2B's Python SDK speaks it: its timeout travels as the
      // request's Connect-Timeout-Ms, which the server alone enforces.
      const message = Buffer.from(JSON.stringify({ process: { cmd: '/bin/sh', args: ['-c', 'sleep 30'] } }));
      const envelope = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), message]);
      envelope.writeUInt32BE(message.length, 1);
      const started = Date.now();
      const r = await fetch(`${s.url}/process.Process/Start`, {
        method: 'POST',
        headers: { 'content-type': 'application/connect+json', 'connect-protocol-version': '1', 'connect-timeout-ms': '800', 'e2b-sandbox-id': id, 'x-access-token': made.body.envdAccessToken as string },
        body: envelope,
      });
      const body = Buffer.from(await r.arrayBuffer());
      expect(Date.now() - started).toBeLessThan(20_000);
      const frames: { flags: number; json: any }[] = [];
      for (let at = 0; at + 5 <= body.length;) {
        const len = body.readUInt32BE(at + 1);
        frames.push({ flags: body[at]!, json: JSON.parse(body.subarray(at + 5, at + 5 + len).toString()) });
        at += 5 + len;
      }
      expect(frames[0]!.json.event.start.pid).toBeGreaterThan(0);
      const end = frames.at(-1)!;
      expect([end.flags & 2, end.json.error?.code]).toEqual([2, 'deadline_exceeded']);
      await until('the command killed', async () => !(await s.exec(id, { command: 'ps -o args' })).stdout.includes('sleep 30'));
    } finally {
      await s.api('DELETE', `/instances/${id}`);
    }
  });

  it('`token create --e2b` writes a key E2B\'s SDKs accept as it is (Python refused forkpoint\'s before sending it), the same credential on every face', async () => {
    const made = await execa(process.execPath, [new URL('../dist/cli.js', import.meta.url).pathname, 'token', 'create', '--e2b', '--owner', 'e2b-shaped'], { env: { ...process.env, FORKPOINT_DATA_DIR: s.dataDir, FORKPOINT_CONFIG: '' } });
    const key = made.stdout.trim();
    // The check both SDKs make (python-sdk e2b/api/__init__.py, js-sdk src/api/index.ts).
    expect(key).toMatch(/^e2b_[0-9a-f]+$/);
    const sbx = await Sandbox.create({ apiKey: key });
    try {
      expect((await sbx.commands.run('echo via-e2b-key')).stdout).toBe('via-e2b-key\n');
      const bearer = { authorization: `Bearer ${key}` };
      expect((await s.api('GET', `/instances/${sbx.sandboxId}`, undefined, bearer)).status).toBe(200);
      expect((await s.api('GET', '/api/sandboxes', undefined, bearer)).status).toBe(200);
      expect((await s.api('GET', `/instances/${sbx.sandboxId}`)).status).toBe(404); // another owner's token
      const forged = `${key.slice(0, 28)}${'0'.repeat(key.length - 28)}`;
      expect((await s.api('GET', '/instances', undefined, { authorization: `Bearer ${forged}` })).status).toBe(401);
    } finally {
      await sbx.kill();
    }
  });

  it('Sandbox.list orders by start time and filters by startedAfter and template (they were ignored)', async () => {
    const tag = { listTest: String(Date.now()) };
    const a = await Sandbox.create({ metadata: tag });
    const b = await Sandbox.create({ metadata: tag });
    try {
      const ids = async (opts: Parameters<typeof Sandbox.list>[0]) => (await Sandbox.list(opts).nextItems()).map((x) => x.sandboxId);
      expect(await ids({ query: { metadata: tag }, order: 'asc' })).toEqual([a.sandboxId, b.sandboxId]);
      expect(await ids({ query: { metadata: tag }, order: 'desc' })).toEqual([b.sandboxId, a.sandboxId]);
      const startedB = (await b.getInfo()).startedAt;
      expect(await ids({ query: { metadata: tag, startedAfter: startedB } })).toEqual([b.sandboxId]);
      expect(await ids({ query: { metadata: tag, startedAfter: new Date(startedB.getTime() + 60_000) } })).toEqual([]);
      expect(await ids({ query: { metadata: tag, template: 'base' }, order: 'asc' })).toEqual([a.sandboxId, b.sandboxId]);
      expect(await ids({ query: { metadata: tag, template: (await a.getInfo()).templateId }, order: 'asc' })).toEqual([a.sandboxId, b.sandboxId]);
      expect(await ids({ query: { metadata: tag, template: 'no-such-template' } })).toEqual([]);
    } finally {
      await Promise.all([a.kill(), b.kill()]);
    }
  });

  it('listSnapshots filters by name and by the sandbox they were taken of (it listed every snapshot)', async () => {
    const [a, b] = await Promise.all([Sandbox.create(), Sandbox.create()]);
    try {
      const name = `snap-filter-${Date.now()}`;
      const ofA = await a.createSnapshot({ name });
      const ofB = await b.createSnapshot();
      const ids = async (p: ReturnType<typeof Sandbox.listSnapshots>) => (await p.nextItems()).map((x) => x.snapshotId);
      expect(await ids(Sandbox.listSnapshots({ name }))).toEqual([ofA.snapshotId]);
      expect(await ids(Sandbox.listSnapshots({ name: `${name}-does-not-exist` }))).toEqual([]);
      expect(await ids(a.listSnapshots())).toEqual([ofA.snapshotId]);
      expect(await ids(b.listSnapshots())).toEqual([ofB.snapshotId]);
      expect(await ids(Sandbox.listSnapshots())).toEqual(expect.arrayContaining([ofA.snapshotId, ofB.snapshotId]));
      await Promise.all([Sandbox.deleteSnapshot(ofA.snapshotId), Sandbox.deleteSnapshot(ofB.snapshotId)]);
    } finally {
      await Promise.all([a.kill(), b.kill()]);
    }
  });

  it('a command whose sandbox is killed under it fails as E2B\'s does: the connection drops, then the health check says the sandbox is gone (it ended with exit -1)', async () => {
    const sbx = await Sandbox.create();
    const cmd = await sbx.commands.run('sleep 60', { background: true });
    await sbx.kill();
    const err = await cmd.wait().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TimeoutError);
    expect((err as Error).message).toContain('sandbox was killed or reached its end of life');
  });

  it('the base template has the tools E2B\'s base has and its tests assume (the default image had busybox only)', async () => {
    const sbx = await Sandbox.create();
    try {
      const r = await sbx.commands.run('for t in curl python3 python git pgrep tput ps; do command -v $t >/dev/null && echo $t; done; python -c "print(6*7)"');
      // `python` too: E2B's Python SDK's own tests start `python -m http.server`.
      expect(r.stdout.split('\n').filter(Boolean)).toEqual(['curl', 'python3', 'python', 'git', 'pgrep', 'tput', 'ps', '42']);
      // pip installs as the user does in E2B's base (no "externally managed" refusal), and a venv
      // can be made: here from a wheel made on the spot (no index reachable from the tests).
      const wheel = [
        'import zipfile, base64, hashlib',
        'files = {"fp_demo/__init__.py": b"ANSWER = 42\\n", "fp_demo-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: fp-demo\\nVersion: 0.1\\n", "fp_demo-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: fp\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}',
        'rec = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b\'=\').decode()},{len(d)}\\n" for n, d in files.items()) + "fp_demo-0.1.dist-info/RECORD,,\\n"',
        'z = zipfile.ZipFile("/tmp/fp_demo-0.1-py3-none-any.whl", "w")',
        '[z.writestr(n, d) for n, d in files.items()]; z.writestr("fp_demo-0.1.dist-info/RECORD", rec); z.close()',
      ].join('\n');
      await sbx.files.write('/tmp/mkwheel.py', wheel);
      const pip = await sbx.commands.run('python /tmp/mkwheel.py && pip install -q --no-index /tmp/fp_demo-0.1-py3-none-any.whl && python -c "import fp_demo; print(fp_demo.ANSWER)"');
      expect(pip.stdout.trim().split('\n').pop()).toBe('42');
      const venv = await sbx.commands.run('python -m venv /tmp/v && /tmp/v/bin/pip install -q --no-index /tmp/fp_demo-0.1-py3-none-any.whl && /tmp/v/bin/python -c "import fp_demo, sys; print(fp_demo.ANSWER, sys.prefix)"');
      expect(venv.stdout.trim()).toBe('42 /tmp/v');
    } finally {
      await sbx.kill();
    }
  });

  it('E2B\'s user: commands and files are `user`\'s by default and root\'s on request, sudo works without a password, and an unknown user is refused (everything ran as root, and sudo was missing)', async () => {
    const sbx = await Sandbox.create();
    try {
      expect((await sbx.commands.run('whoami; pwd; echo $HOME')).stdout).toBe('user\n/home/user\n/home/user\n');
      expect((await sbx.commands.run('whoami; pwd', { user: 'root' })).stdout).toBe('root\n/root\n');
      expect((await sbx.commands.run('sudo whoami; sudo -n true && echo no-password')).stdout).toBe('root\nno-password\n');
      // A file written as the default user is its, in its home, mode as its umask leaves it.
      await sbx.files.write('mine.txt', 'x');
      const mine = await sbx.files.getInfo('mine.txt');
      expect(mine).toMatchObject({ path: '/home/user/mine.txt', owner: 'user', group: 'user', permissions: '-rw-r--r--' });
      await sbx.files.makeDir('made/below');
      expect((await sbx.files.list('made')).map((e) => [e.name, e.owner, e.permissions])).toEqual([['below', 'user', 'drwxr-xr-x']]);
      // As root: its home, its file.
      await sbx.files.write('hello.txt', 'root only', { user: 'root' });
      expect(await sbx.files.read('/root/hello.txt', { user: 'root' })).toBe('root only');
      expect((await sbx.files.getInfo('/root/hello.txt', { user: 'root' })).owner).toBe('root');
      // As envd (root itself) does for a user: root's access, and what it makes is the user's,
      // parent directories included, wherever it is (E2B's own test writes /0/...).
      await sbx.commands.run('chmod 600 /root/hello.txt', { user: 'root' });
      expect(await sbx.files.read('/root/hello.txt')).toBe('root only');
      await sbx.files.write('/0/deep/made.txt', 'x');
      expect((await sbx.commands.run('stat -c %U:%G /0 /0/deep /0/deep/made.txt', { user: 'root' })).stdout).toBe('user:user\nuser:user\nuser:user\n');
      // A command as an unknown user never runs (envd: "invalid username").
      await expect(sbx.commands.run('touch /tmp/ran', { user: 'root123' as 'root' })).rejects.toThrow(/invalid username/);
      expect((await sbx.commands.run('test -e /tmp/ran || echo absent')).stdout).toBe('absent\n');
      // The user's processes hold the user's ids, seen from inside: uid, gid, groups.
      expect((await sbx.commands.run('id -u; id -g; cat /proc/self/status | grep -E "^(Uid|Gid)"')).stdout).toMatch(/^1000\n1000\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n$/);
    } finally {
      await sbx.kill();
    }
  });

  it('getMetrics reads the sandbox\'s CPU, memory and disk from its cgroups and its upper (it answered none)', async () => {
    const sbx = await Sandbox.create();
    try {
      await sbx.commands.run('head -c 5000000 /dev/urandom > /tmp/five-mb');
      await sbx.commands.run('timeout 20 sh -c "while :; do :; done"', { background: true });
      // A busy loop on one of its CPUs; the suite's other file may hold the host's CPUs a moment,
      // so a few readings (each over its own short window) may be taken before one shows it.
      let m: Awaited<ReturnType<typeof sbx.getMetrics>>[number] | undefined;
      for (let i = 0; i < 10 && !(m && m.cpuUsedPct > 30); i++) [m] = await sbx.getMetrics();
      expect(m).toBeDefined();
      expect(m!.cpuCount).toBeGreaterThanOrEqual(1);
      expect(m!.cpuUsedPct).toBeGreaterThan(30);
      expect(m!.memUsed).toBeGreaterThan(0);
      expect(m!.memTotal).toBe(1024 * 1024 * 1024);
      expect(m!.diskUsed).toBeGreaterThanOrEqual(5_000_000);
      expect(m!.diskTotal).toBeGreaterThan(m!.diskUsed);
      // A range before the sandbox was: none (it answered the reading of now).
      const hourAgo = new Date(Date.now() - 3_600_000);
      expect(await sbx.getMetrics({ start: hourAgo, end: new Date(hourAgo.getTime() + 1_800_000) })).toEqual([]);
      expect(await sbx.getMetrics({ start: new Date(Date.now() - 10_000), end: new Date() })).toHaveLength(1);
      await sbx.pause();
      expect(await Sandbox.getMetrics(sbx.sandboxId)).toEqual([]);
    } finally {
      await sbx.kill();
    }
  });

  it('updateNetwork replaces the sandbox\'s egress policy, in force at once (it answered 404)', async () => {
    const sbx = await Sandbox.create();
    try {
      const policy = async () => (await s.api('GET', `/instances/${sbx.sandboxId}`)).body.network as { egress: string; allow: string[]; deny: string[] };
      expect((await policy()).egress).toBe('allow');
      await sbx.updateNetwork({ allowOut: ['10.1.2.3'], denyOut: ['0.0.0.0/0'] });
      expect(await policy()).toMatchObject({ egress: 'deny', allow: ['10.1.2.3'], deny: [] });
      await sbx.updateNetwork({ denyOut: ['192.0.2.0/24'] });
      expect(await policy()).toMatchObject({ egress: 'allow', allow: [], deny: ['192.0.2.0/24'] });
      await sbx.updateNetwork({});
      expect(await policy()).toMatchObject({ egress: 'allow', allow: [], deny: [] });
      await expect(sbx.updateNetwork({ egressProxy: { address: 'proxy.example:3128' } })).rejects.toThrow(/not supported/);
    } finally {
      await sbx.kill();
    }
  });

  it('file metadata: kept with the file (user.e2b.* xattrs), told by getInfo, list and after a rename, replaced by the next upload; set inside the sandbox it shows too (the SDK refused: envd 0.6.2 needed)', async () => {
    const sbx = await Sandbox.create();
    try {
      const info = await sbx.files.write('meta.txt', 'with metadata', { metadata: { author: 'mish', purpose: 'upload' } });
      expect(Array.isArray(info) ? undefined : info.metadata).toEqual({ author: 'mish', purpose: 'upload' });
      expect((await sbx.files.getInfo('meta.txt')).metadata).toEqual({ author: 'mish', purpose: 'upload' });
      expect((await sbx.files.list('.')).find((e) => e.name === 'meta.txt')?.metadata).toEqual({ author: 'mish', purpose: 'upload' });
      await sbx.files.rename('meta.txt', 'moved.txt');
      expect((await sbx.files.getInfo('moved.txt')).metadata).toEqual({ author: 'mish', purpose: 'upload' });
      await sbx.files.write('moved.txt', 'again', { metadata: { author: 'other' } });
      expect((await sbx.files.getInfo('moved.txt')).metadata).toEqual({ author: 'other' });
      await sbx.files.write('moved.txt', 'plain');
      expect((await sbx.files.getInfo('moved.txt')).metadata).toBeUndefined();
      await sbx.commands.run('python3 -c "import os; os.setxattr(\'/home/user/moved.txt\', \'user.e2b.author\', b\'inside\')"');
      expect((await sbx.files.getInfo('moved.txt')).metadata).toEqual({ author: 'inside' });
    } finally {
      await sbx.kill();
    }
  });

  it('attack: metadata a sandbox writes that no header could carry (tabs, newlines, control bytes, 100 keys) is left out or refused, never passed on', async () => {
    const sbx = await Sandbox.create();
    try {
      await sbx.files.write('x.txt', 'x');
      const py = [
        'import os',
        "p = '/home/user/x.txt'",
        "os.setxattr(p, 'user.e2b.ok', b'fine')",
        "os.setxattr(p, 'user.e2b.tab', b'a\\tb')",
        "os.setxattr(p, 'user.e2b.nl', b'a\\nx\\tevil\\tvalue')",
        "os.setxattr(p, 'user.e2b.ctl', b'\\x01')",
        "os.setxattr(p, 'user.e2b.k\\tx', b'v')",
      ].join('\n');
      await sbx.files.write('/tmp/meta.py', py);
      await sbx.commands.run('python3 /tmp/meta.py');
      expect((await sbx.files.getInfo('x.txt')).metadata).toEqual({ ok: 'fine' });
      await sbx.commands.run("python3 -c \"import os\nfor i in range(100): os.setxattr('/home/user/x.txt', 'user.e2b.k%d' % i, b'v')\"");
      const many = (await sbx.files.getInfo('x.txt')).metadata ?? {};
      expect(Object.keys(many).length).toBeLessThanOrEqual(64);
      expect((await sbx.commands.run('echo alive')).stdout).toBe('alive\n');
    } finally {
      await sbx.kill();
    }
  });

  it('watchDir: a write, a directory made below a recursive watch and a file in it, through a checkpoint; a missing directory and a file refused as envd does (it was not served)', async () => {
    const sbx = await Sandbox.create();
    try {
      await sbx.files.makeDir('w/sub');
      await sbx.files.write('w/a.txt', 'one');
      const seen: string[] = [];
      const has = (what: string) => () => seen.includes(what);
      const handle = await sbx.files.watchDir('w', (e) => void seen.push(`${e.type} ${e.name}`), { recursive: true });
      await sbx.files.write('w/a.txt', 'two');
      await until('the write', has('write a.txt'));
      await sbx.files.makeDir('w/sub/new');
      await until('the new directory', has('create sub/new'));
      await sbx.commands.run('echo x > /home/user/w/sub/new/f.txt');
      await until('a file in the new directory', has('write sub/new/f.txt'));
      // A checkpoint closes every connection to the agent; the watch is taken up again after it.
      await sbx.createSnapshot();
      await sbx.commands.run('rm /home/user/w/a.txt');
      await until('the removal, after the checkpoint', has('remove a.txt'));
      await handle.stop();
      await expect(sbx.files.watchDir('nowhere', () => {})).rejects.toThrow(FileNotFoundError);
      await expect(sbx.files.watchDir('w/sub/new/f.txt', () => {})).rejects.toThrow(SandboxError);
    } finally {
      await sbx.kill();
    }
  });

  it('the polling watcher E2B\'s sync Python SDK uses: CreateWatcher, GetWatcherEvents (each event once), RemoveWatcher; another sandbox\'s token cannot read it (they answered Unimplemented)', async () => {
    const made = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 60 }, { 'x-api-key': s.token });
    const other = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 60 }, { 'x-api-key': s.token });
    const id: string = made.body.sandboxID;
    const rpc = async (method: string, body: unknown, sandbox = made.body) => {
      const r = await fetch(`${s.url}/filesystem.Filesystem/${method}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'connect-protocol-version': '1', 'e2b-sandbox-id': sandbox.sandboxID, 'x-access-token': sandbox.envdAccessToken as string },
        body: JSON.stringify(body),
      });
      return { status: r.status, json: (await r.json()) as any };
    };
    try {
      await s.exec(id, { command: 'mkdir -p /home/user/pw' });
      const created = await rpc('CreateWatcher', { path: 'pw', recursive: true });
      expect(created.status).toBe(200);
      const watcherId: string = created.json.watcherId;
      await s.exec(id, { command: 'echo one > /home/user/pw/f.txt' });
      const events: { name: string; type: string }[] = [];
      await until('the events', async () => {
        events.push(...((await rpc('GetWatcherEvents', { watcherId })).json.events ?? []));
        return events.some((e) => e.name === 'f.txt' && e.type === 'EVENT_TYPE_WRITE');
      });
      expect(events.filter((e) => e.name === 'f.txt').map((e) => e.type)).toEqual(['EVENT_TYPE_CREATE', 'EVENT_TYPE_WRITE']);
      expect((await rpc('GetWatcherEvents', { watcherId })).json.events ?? []).toEqual([]);
      expect((await rpc('GetWatcherEvents', { watcherId }, other.body)).status).toBe(404);
      expect((await rpc('RemoveWatcher', { watcherId })).status).toBe(200);
      expect((await rpc('GetWatcherEvents', { watcherId })).status).toBe(404);
      expect((await rpc('CreateWatcher', { path: 'nowhere' })).status).toBe(404);
    } finally {
      await s.api('DELETE', `/instances/${id}`);
      await s.api('DELETE', `/instances/${other.body.sandboxID}`);
    }
  });

  it('deleteSnapshot answers true, then false for the same snapshot (it threw)', async () => {
    const sbx = await Sandbox.create();
    try {
      const snap = await sbx.createSnapshot();
      expect(await Sandbox.deleteSnapshot(snap.snapshotId)).toBe(true);
      expect(await Sandbox.deleteSnapshot(snap.snapshotId)).toBe(false);
    } finally {
      await sbx.kill();
    }
  });

  it('signed file URLs (downloadUrl, uploadUrl): they read and write their one file with no other credential, by E2B_SANDBOX_URL (which names no sandbox) or envd\'s host name; they were 401', async () => {
    const sbx = await Sandbox.create({ secure: true });
    const other = await Sandbox.create({ secure: true });
    try {
      await sbx.files.write('hello.txt', 'hello world');
      const download = await sbx.downloadUrl('hello.txt', { useSignatureExpiration: 60 });
      expect(new URL(download).origin).toBe(s.url); // no sandbox in it
      const got = await fetch(download);
      expect([got.status, await got.text()]).toEqual([200, 'hello world']);
      // With no expiry, and as root (the user is signed).
      await sbx.files.write('/root/mine', 'root only', { user: 'root' });
      expect(await (await fetch(await sbx.downloadUrl('/root/mine', { user: 'root' }))).text()).toBe('root only');
      // An upload: multipart, as the SDK's docs do it; the answer is envd's.
      const form = new FormData();
      form.append('file', 'file content');
      const up = await fetch(await sbx.uploadUrl('up.txt', { useSignatureExpiration: 60 }), { method: 'POST', body: form });
      expect([up.status, await up.json()]).toEqual([200, [{ name: 'up.txt', path: '/home/user/up.txt', type: 'file' }]]);
      expect(await sbx.files.read('up.txt')).toBe('file content');
      expect((await sbx.commands.run('stat -c %U up.txt')).stdout).toBe('user\n');
      // A field past the parser's bound is refused, not written cut short.
      const big = new FormData();
      big.append('file', 'x'.repeat((1 << 20) + 1));
      expect((await fetch(await sbx.uploadUrl('big.txt', { useSignatureExpiration: 60 }), { method: 'POST', body: big })).status).toBe(413);
      expect(await sbx.files.exists('big.txt')).toBe(false);
      // Expired: envd's own answer.
      const expired = await fetch(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: -10 }));
      expect([expired.status, await expired.json()]).toEqual([401, { code: 401, message: 'signature is already expired' }]);
      // By envd's host name (E2B's SDKs outside debug mode): that sandbox's, and no other's.
      const byHost = async (url: string, id: string) => {
        const u = new URL(url);
        const r = await request(`${s.url}${u.pathname}${u.search}`, { headers: { host: `49983-${id}.localhost` } });
        return [r.statusCode, await r.body.text()];
      };
      expect(await byHost(download, sbx.sandboxId)).toEqual([200, 'hello world']);
      expect((await byHost(download, other.sandboxId))[0]).toBe(401);
    } finally {
      await sbx.kill();
      await other.kill();
    }
  });

  it('attack: a signed file URL opens nothing but its path, its user and its direction; it dies with the API token it was made with', async () => {
    const { token, record } = await s.fp.store.tokens.create('default', 'signed-urls');
    const sbx = await Sandbox.create({ secure: true, apiKey: token });
    const other = await Sandbox.create({ secure: true });
    try {
      await sbx.files.write('/root/secret', 'root only', { user: 'root' });
      await sbx.files.write('hello.txt', 'hello world');
      const link = new URL(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: 60 }));
      const tampered = (change: (q: URLSearchParams) => void) => {
        const u = new URL(link);
        change(u.searchParams);
        return u.toString();
      };
      const status = async (url: string, init?: RequestInit) => (await fetch(url, init)).status;
      // Another path, another user, a later expiry, no expiry: the signature no longer fits.
      expect(await status(tampered((q) => q.set('path', '/root/secret')))).toBe(401);
      expect(await status(tampered((q) => q.set('path', '../../root/secret')))).toBe(401);
      expect(await status(tampered((q) => q.set('username', 'root')))).toBe(401);
      expect(await status(tampered((q) => q.set('signature_expiration', String(Number(q.get('signature_expiration')) + 3600))))).toBe(401);
      expect(await status(tampered((q) => q.delete('signature_expiration')))).toBe(401);
      // A read's signature does not write.
      expect(await status(link.toString(), { method: 'POST', body: 'overwritten', headers: { 'content-type': 'application/octet-stream' } })).toBe(401);
      expect(await sbx.files.read('hello.txt')).toBe('hello world');
      // A user the link does not sign, asked for by envd's Basic header, is not taken: what an
      // upload signed for the default user writes is the default user's.
      const upload = await sbx.uploadUrl('owned.txt', { useSignatureExpiration: 60 });
      const basicRoot = { authorization: `Basic ${Buffer.from('root:').toString('base64')}`, 'content-type': 'application/octet-stream' };
      expect(await status(upload, { method: 'POST', body: 'x', headers: basicRoot })).toBe(200);
      expect((await sbx.commands.run('stat -c %U /home/user/owned.txt')).stdout).toBe('user\n');
      // Another sandbox named by the header: the link is that sandbox's, not this one's.
      expect(await status(link.toString(), { headers: { 'e2b-sandbox-id': other.sandboxId } })).toBe(401);
      // A URL with no path signs no file (envd's "whatever the upload names").
      const anywhere = await sbx.uploadUrl(undefined, { useSignatureExpiration: 60 });
      const form = new FormData();
      form.append('file', new Blob(['planted']), '/root/.bashrc');
      expect(await status(anywhere, { method: 'POST', body: form })).toBe(401);
      // Revoking the API token the sandbox was made with ends its links.
      expect(await status(link.toString())).toBe(200);
      await s.fp.store.tokens.revoke(record.id);
      expect(await status(link.toString())).toBe(401);
    } finally {
      await s.api('DELETE', `/instances/${sbx.sandboxId}`);
      await other.kill();
    }
  });
});

describe('the e2b SDK\'s lifecycle: snapshots, pause and connect, timeouts, listing', () => {
  it('createSnapshot, then two sandboxes from it: each has the file and a counter that goes on from the snapshot\'s value, on its own', async () => {
    const sbx = await Sandbox.create();
    await sbx.files.write('state.txt', 'from before the snapshot');
    await sbx.commands.run('i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done', { background: true });
    // (Until the loop first writes, there is no file: 0, not a failed command.)
    await until('the counter', async () => Number((await sbx.commands.run('cat /tmp/n 2>/dev/null || echo 0')).stdout) >= 5);
    const snap = await sbx.createSnapshot();
    const at = Number((await sbx.commands.run('cat /tmp/n')).stdout);
    const made: Sandbox[] = [sbx];
    try {
      const a = await Sandbox.create(snap.snapshotId);
      made.push(a);
      const b = await Sandbox.create(snap.snapshotId);
      made.push(b);
      for (const x of [a, b]) {
        expect(await x.files.read('/home/user/state.txt')).toBe('from before the snapshot');
        const first = Number((await x.commands.run('cat /tmp/n')).stdout);
        // Restored at the snapshot's value (about `at`), not from zero, and counting on.
        expect(first).toBeGreaterThanOrEqual(5);
        expect(first).toBeLessThanOrEqual(at + 20);
        await until('counting on', async () => Number((await x.commands.run('cat /tmp/n')).stdout) > first);
      }
      await a.files.write('state.txt', 'changed in a');
      expect(await b.files.read('state.txt')).toBe('from before the snapshot');
      expect(await sbx.files.read('state.txt')).toBe('from before the snapshot');
    } finally {
      // Whatever failed: a sandbox left running keeps its command's stream open, and the
      // server's close would wait for it.
      for (const x of made) await x.kill().catch(() => {});
    }
  });

  it('connect never shortens a sandbox\'s life: one that never ends (made on another face) still does not; a longer timeout extends, a shorter one does not', async () => {
    const inst = await s.instance();
    const never = await Sandbox.connect(inst.id);
    const year = 300 * 86400_000;
    expect((await never.getInfo()).endAt.getTime() - Date.now()).toBeGreaterThan(year);
    const sbx = await Sandbox.create({ timeoutMs: 600_000 });
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 30_000 });
    expect((await sbx.getInfo()).endAt.getTime() - Date.now()).toBeGreaterThan(500_000);
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 1_200_000 });
    expect((await sbx.getInfo()).endAt.getTime() - Date.now()).toBeGreaterThan(1_100_000);
    await sbx.kill();
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('a files-only pause (keepMemory: false) stops the sandbox; connect boots it on its files: the file is there, the process is not (it kept memory), and the boot id is new (it was the host\'s, the same in every sandbox and after every boot)', async () => {
    const sbx = await Sandbox.create();
    const other = await Sandbox.create();
    const bootId = async (x: Sandbox) => (await x.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim();
    try {
      const before = await bootId(sbx);
      expect(before).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
      expect(await bootId(other)).not.toBe(before);
      // A pause that keeps memory is a restore: the same boot.
      await sbx.pause();
      expect(await bootId(await sbx.connect())).toBe(before);
      await sbx.files.write('/home/user/kept.txt', 'on disk');
      await sbx.commands.run('sleep 600', { background: true });
      await sbx.pause({ keepMemory: false });
      expect(await sbx.isRunning()).toBe(false);
      expect((await Sandbox.list({ query: { state: ['paused'] } }).nextItems()).map((i) => i.sandboxId)).toContain(sbx.sandboxId);
      const back = await sbx.connect();
      expect(await back.isRunning()).toBe(true);
      expect(await back.files.read('/home/user/kept.txt')).toBe('on disk');
      expect((await back.commands.run('ps -o args')).stdout).not.toContain('sleep 600');
      expect(await bootId(back)).not.toBe(before);
    } finally {
      await sbx.kill();
      await other.kill();
    }
  });

  it('a timeout that pauses files only (onTimeout: {action: pause, keepMemory: false}) stops the sandbox; connect boots it on its files with a new boot id, and its next timeout pauses it again (it hibernated with memory, and a resumed one was then deleted at its timeout)', async () => {
    const sbx = await Sandbox.create({ timeoutMs: 3_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } });
    const status = async () => (await s.api('GET', `/instances/${sbx.sandboxId}`)).body.status as string;
    try {
      await sbx.files.write('/home/user/marker.txt', 'kept');
      const before = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim();
      await until('paused by its timeout, files only', async () => (await status()) === 'stopped', 20_000);
      const back = await sbx.connect({ timeoutMs: 3_000 });
      expect(await back.files.read('/home/user/marker.txt')).toBe('kept');
      expect((await back.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()).not.toBe(before);
      await until('paused again by its next timeout', async () => (await status()) === 'stopped', 20_000);
    } finally {
      await sbx.kill();
    }
  });

  it('pause, then connect: a variable in a running process is still there', async () => {
    const sbx = await Sandbox.create();
    const h = await sbx.commands.run('read line; echo "got $line, secret=$SECRET"', { background: true, stdin: true, envs: { SECRET: 'kept-in-memory' } });
    await sbx.pause();
    expect((await s.api('GET', `/instances/${sbx.sandboxId}`)).body.status).toBe('hibernated');
    const again = await Sandbox.connect(sbx.sandboxId);
    const out: string[] = [];
    const conn = await again.commands.connect(h.pid, { onStdout: (d) => void out.push(d) });
    await again.commands.sendStdin(h.pid, 'hello\n');
    expect((await conn.wait()).exitCode).toBe(0);
    await until('the answer', () => out.join('').includes('got hello, secret=kept-in-memory'));
    await again.kill();
  });

  it('setTimeout ends a sandbox when it is over; Sandbox.list filters by metadata', async () => {
    const a = await Sandbox.create({ metadata: { team: 'red' } });
    const b = await Sandbox.create({ metadata: { team: 'blue' } });
    const red = await Sandbox.list({ query: { metadata: { team: 'red' } } }).nextItems();
    expect(red.map((x) => x.sandboxId)).toEqual([a.sandboxId]);
    expect(red[0]!.metadata).toEqual({ team: 'red' });
    await b.setTimeout(1000);
    await until('the timeout', async () => (await s.api('GET', `/instances/${b.sandboxId}`)).status === 404, 10_000);
    expect(await a.isRunning()).toBe(true);
    await a.kill();
  });
});

describe('@e2b/code-interpreter, unchanged', () => {
  it('code contexts (their calls carry the traffic token, not the access token: they answered 401) and the sandbox\'s variables in runCode (they were not there)', async () => {
    const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter');
    const sbx = await CodeSandbox.create({ envs: { SANDBOX_VAR: 'from-create' } });
    try {
      const ctx = await sbx.createCodeContext();
      expect(ctx).toMatchObject({ language: 'python', cwd: '/home/user' });
      expect((await sbx.listCodeContexts()).map((c) => c.id)).toContain(ctx.id);
      await sbx.runCode('x = 41', { context: ctx });
      expect((await sbx.runCode('print(x + 1)', { context: ctx })).logs.stdout).toEqual(['42\n']);
      expect((await sbx.runCode('print("x" in globals())')).logs.stdout).toEqual(['False\n']); // the default context is another
      await sbx.removeCodeContext(ctx);
      expect((await sbx.listCodeContexts()).map((c) => c.id)).not.toContain(ctx.id);
      const env = await sbx.runCode('import os; print(os.environ.get("SANDBOX_VAR"), os.environ.get("RUN_VAR"))', { envs: { RUN_VAR: 'per-run' } });
      expect(env.logs.stdout).toEqual(['from-create per-run\n']);
    } finally {
      await sbx.kill();
    }
  }, 180_000);

  it('R and Java cells: a value as R prints it and as E2B\'s Java shows it, state between cells, the sandbox\'s and a cell\'s variables (Java\'s as system properties), errors and output (they were refused: "language r is not served")', async () => {
    const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter');
    const sbx = await CodeSandbox.create({ envs: { SANDBOX_VAR: 'from-create' } });
    try {
      const text = async (code: string, opts: { language: string; envs?: Record<string, string> }) => {
        const r = await sbx.runCode(code, opts);
        expect(r.error, JSON.stringify(r.error)).toBeUndefined();
        return r.results[0]?.text;
      };
      expect(await text('Sys.getenv("SANDBOX_VAR")', { language: 'r' })).toBe('[1] "from-create"');
      expect(await text('Sys.getenv("FOO")', { language: 'r', envs: { FOO: 'bar' } })).toBe('[1] "bar"');
      expect(await text('Sys.getenv("FOO", unset = "default")', { language: 'r' })).toBe('[1] "default"');
      await text('x <- c(1, 2, 3)', { language: 'r' });
      const r = await sbx.runCode('cat("sum:", sum(x), "\\n"); x * 2', { language: 'r' });
      expect([r.logs.stdout, r.results[0]?.text]).toEqual([['sum: 6 \n'], '[1] 2 4 6']);
      expect((await sbx.runCode('stop("boom")', { language: 'r' })).error).toMatchObject({ value: 'boom' });
      expect(await text('System.getProperty("SANDBOX_VAR")', { language: 'java' })).toBe('from-create');
      expect(await text('System.getProperty("FOO")', { language: 'java', envs: { FOO: 'bar' } })).toBe('bar');
      expect(await text('System.getProperty("FOO", "default")', { language: 'java' })).toBe('default');
      await text('int n = 20;', { language: 'java' });
      const j = await sbx.runCode('System.out.println("n=" + n); n + 22', { language: 'java' });
      // A println is two writes, told apart, as E2B's Java kernel tells them.
      expect([j.logs.stdout, j.results[0]?.text]).toEqual([['n=20', '\n'], '42']);
      expect((await sbx.runCode('Integer.parseInt("x")', { language: 'java' })).error).toMatchObject({ name: 'java.lang.NumberFormatException' });
      expect((await sbx.runCode('int y = ', { language: 'java' })).error).toMatchObject({ name: 'CompilationError' });
    } finally {
      await sbx.kill();
    }
  }, 180_000);

  it('runCode keeps state between cells, and a snapshot and a sandbox from it keep it too', async () => {
    const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter');
    const sbx = await CodeSandbox.create();
    const first = await sbx.runCode('a = 1');
    expect(first.error).toBeUndefined();
    const second = await sbx.runCode('print(a)');
    expect(second.logs.stdout).toEqual(['1\n']);
    expect((await sbx.runCode('a + 41')).text).toBe('42');
    const err = await sbx.runCode('1 / 0');
    expect(err.error?.name).toBe('ZeroDivisionError');

    const snap = await sbx.createSnapshot();
    const fork = await CodeSandbox.create(snap.snapshotId);
    expect((await fork.runCode('print(a)')).logs.stdout).toEqual(['1\n']);
    await fork.runCode('a = 2');
    expect((await sbx.runCode('print(a)')).logs.stdout).toEqual(['1\n']);
    await fork.kill();
    await sbx.kill();
  }, 180_000);
  it('rich outputs (a matplotlib figure as PNG, a pandas frame as HTML and data, display()), a string result as its text, JavaScript, TypeScript and bash cells, and a cell cut off by its client interrupted (they were Python only, and the next cell waited, then a 500)', async () => {
    const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter');
    const sbx = await CodeSandbox.create({ envs: { TEST_ENV_VAR: 'supertest' } });
    try {
      const plot = await sbx.runCode(`
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3], [3, 1, 2])
        plt.show()
        41 + 1
        `);
      expect(plot.error).toBeUndefined();
      expect(plot.results.map((r) => [r.isMainResult, r.png !== undefined])).toEqual([[false, true], [true, false]]);
      expect(Buffer.from(plot.results[0]!.png!, 'base64').subarray(1, 4).toString()).toBe('PNG');
      expect(plot.results[0]!.extra).toEqual({});
      const frame = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2, 3]})');
      expect(frame.results[0]!.data).toEqual({ a: [1, 2, 3] });
      expect(frame.results[0]!.html).toContain('<table');
      expect((await sbx.runCode('display({"text/html": "<b>hi</b>", "text/plain": "hi"})')).results[0]).toMatchObject({ html: '<b>hi</b>', text: 'hi' });
      // What the Python SDK's own tests found: IPython.display's objects as in a notebook (the
      // import failed: there is no IPython in the image), and every output line with its time
      // (the Python SDK reads it: KeyError 'timestamp').
      const shown = await sbx.runCode('from IPython.display import display, Markdown\ndisplay({"text/latex": r"\\text{X}"}, raw=True)\ndisplay(Markdown("# hi"))');
      expect(shown.results.map((r) => r.formats())).toEqual([['latex'], ['markdown']]);
      expect(shown.results[1]!.markdown).toBe('# hi');
      // (The JS SDK stamps lines itself: the kernel's own answer, read inside the sandbox.)
      const raw = await sbx.commands.run(`curl -s -X POST http://127.0.0.1:49999/execute -H 'content-type: application/json' -d '{"code": "print(1)"}'`);
      const line = raw.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l) as { type: string; text?: string; timestamp?: number }).find((m) => m.type === 'stdout');
      expect(line?.text).toBe('1\n');
      expect(Math.abs((line?.timestamp ?? 0) / 1e6 - Date.now())).toBeLessThan(60_000);
      expect((await sbx.runCode('import os; os.getenv("TEST_ENV_VAR")')).text).toBe('supertest');
      const pil = await sbx.runCode('from PIL import Image\nImage.new("RGB", (4, 4)).save("/tmp/x.png")');
      expect(pil.results[0]?.png).toBeDefined();
      expect((await sbx.runCode('!pwd')).logs.stdout.join('').trim()).toBe('/home/user');

      expect((await sbx.listCodeContexts()).map((c) => c.language)).toEqual(expect.arrayContaining(['python', 'javascript']));
      const js = await sbx.runCode('import { readFileSync } from "fs"\nconsole.log(typeof readFileSync)', { language: 'js' });
      expect(js.logs.stdout).toEqual(['function\n']);
      expect((await sbx.runCode('await Promise.resolve("Hello World!")', { language: 'js' })).text).toBe('Hello World!');
      expect((await sbx.runCode('process.cwd()', { language: 'js' })).text).toBe('/home/user');
      expect((await sbx.runCode('process.env.FOO', { language: 'js', envs: { FOO: 'bar' } })).text).toBe('bar');
      expect((await sbx.runCode('process.env.FOO || "default"', { language: 'js' })).text).toBe('default');
      // TypeScript: its types stripped, the rest run as JavaScript (it was refused, 400).
      expect((await sbx.runCode('const message: string = "Hello World!"; console.log(message)', { language: 'ts' })).logs.stdout).toEqual(['Hello World!\n']);
      expect((await sbx.runCode('process.cwd()', { language: 'typescript' })).text).toBe('/home/user');
      const tsCtx = await sbx.createCodeContext({ language: 'typescript' });
      await sbx.runCode('interface Box { n: number }\nconst box: Box = { n: 41 }', { context: tsCtx });
      expect((await sbx.runCode('await Promise.resolve(box.n as number + 1)', { context: tsCtx })).text).toBe('42');
      expect((await sbx.runCode('const broken: = 1', { language: 'ts' })).error?.name).toBe('SyntaxError');
      const jsCtx = await sbx.createCodeContext({ language: 'js' });
      await sbx.runCode('var kept = 41', { context: jsCtx });
      expect((await sbx.runCode('kept + 1', { context: jsCtx })).text).toBe('42');
      expect((await sbx.runCode('echo $TEST_ENV_VAR; pwd', { language: 'bash' })).logs.stdout.join('')).toBe('supertest\n/home/user\n');
      await expect(sbx.runCode({ context: jsCtx, language: 'python' } as never)).rejects.toThrow();

      await expect(sbx.runCode('import time; time.sleep(300)', { timeoutMs: 2_000 })).rejects.toThrow();
      const started = Date.now();
      // Two fresh-clone runs of 28 answered this cell 409 ("not running": the port proxy found
      // no live sandbox for a moment), not reproduced since; issue 23's note has it. Retried a
      // few times, so that the cell is still asked to run soon and its answer checked.
      let next: Awaited<ReturnType<typeof sbx.runCode>> | undefined;
      for (let attempt = 0; !next; attempt++) {
        next = await sbx.runCode('1 + 1', { timeoutMs: 20_000 }).catch(async (err: Error) => {
          if (attempt >= 4 || !/409/.test(err.message)) throw err;
          // The SDK shows the status only: what the server says, and the instance's state, go
          // to the log, so that a run that meets it tells which state it was.
          const said = await fetch(`${s.url}/health`, { headers: { 'e2b-sandbox-id': sbx.sandboxId, 'e2b-sandbox-port': '49999', 'x-access-token': (sbx as unknown as { envdAccessToken: string }).envdAccessToken } });
          const rec = await s.api('GET', `/instances/${sbx.sandboxId}`);
          console.warn(`runCode after an interrupt: 409 (attempt ${attempt}); now the port says ${said.status} ${await said.text()}; the instance is ${JSON.stringify(rec.body.status)}`);
          return new Promise<undefined>((r) => setTimeout(() => r(undefined), 500));
        });
      }
      expect(next.text).toBe('2');
      expect(Date.now() - started).toBeLessThan(15_000);
    } finally {
      await sbx.kill();
    }
  }, 300_000);
  it('charts: a matplotlib figure\'s data as `result.chart` (bar, box and whisker, pie, a dated line with units, a categorical scale, several axes, and what is none of those), beside its PNG (there was no chart)', async () => {
    const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter');
    const sbx = await CodeSandbox.create();
    type Chart = { type: string; title: string | null; elements: Record<string, unknown>[] } & Record<string, unknown>;
    const chartOf = async (code: string): Promise<Chart> => {
      const run = await sbx.runCode(`import matplotlib.pyplot as plt\n${code}\nplt.show()`);
      expect(run.error).toBeUndefined();
      expect(run.results[0]!.png).toBeDefined();
      return run.results[0]!.chart as unknown as Chart;
    };
    try {
      const bar = await chartOf("plt.bar(['A', 'B', 'C'], [100, 200, 300], label='Sold')\nplt.xlabel('Authors')\nplt.ylabel('Books')\nplt.title('Sales')");
      expect(bar).toMatchObject({ type: 'bar', title: 'Sales', x_label: 'Authors', y_label: 'Books', x_unit: null, y_unit: null });
      expect(bar.elements).toEqual([{ label: 'A', value: 100, group: 'Sold' }, { label: 'B', value: 200, group: 'Sold' }, { label: 'C', value: 300, group: 'Sold' }]);

      const box = await chartOf("fig, ax = plt.subplots()\nax.boxplot([[85, 90, 78, 92, 88], [95, 89, 76, 91, 84, 87]], tick_labels=['A', 'B'])\nax.set_title('Scores')");
      expect(box).toMatchObject({ type: 'box_and_whisker', title: 'Scores' });
      expect(box.elements).toEqual([
        { label: 'A', min: 78, first_quartile: 85, median: 88, third_quartile: 90, max: 92, outliers: [] },
        { label: 'B', min: 84, first_quartile: 84.75, median: 88, third_quartile: 90.5, max: 95, outliers: [76] },
      ]);

      const pie = await chartOf("plt.pie([90, 10], labels=['No', 'Yes'], startangle=90)\nplt.title('Early?')");
      expect(pie).toEqual({ type: 'pie', title: 'Early?', elements: [{ label: 'No', angle: 324, radius: 1 }, { label: 'Yes', angle: 36, radius: 1 }] });

      const line = await chartOf("import datetime\ndays = [datetime.date(2023, 9, 1) + datetime.timedelta(days=i) for i in range(10)]\nplt.plot(days, range(10), label='n')\nplt.xlabel('Time (s)')\nplt.ylabel('Amplitude (Hz)')");
      expect(line).toMatchObject({ type: 'line', x_scale: 'datetime', y_scale: 'linear', x_unit: 's', y_unit: 'Hz', title: null });
      expect(line.elements).toHaveLength(1);
      const points = line.elements[0]!.points as [string, number][];
      expect(points).toHaveLength(10);
      expect(new Date(points[0]![0]).toISOString()).toBe('2023-09-01T00:00:00.000Z');
      expect(points[9]![1]).toBe(9);
      expect((line.x_ticks as unknown[]).every((t) => typeof t === 'string' && !Number.isNaN(Date.parse(t)))).toBe(true);

      const categories = await chartOf("plt.plot([1, 2, 3], ['x', 'y', 'z'])");
      expect(categories).toMatchObject({ type: 'line', x_scale: 'linear', y_scale: 'categorical', y_ticks: ['x', 'y', 'z'] });
      expect(categories.elements[0]!.points).toEqual([[1, 'x'], [2, 'y'], [3, 'z']]);

      const both = await chartOf("fig, axs = plt.subplots(1, 2)\nfig.suptitle('Two')\naxs[0].plot([0, 1], [1, 0])\naxs[1].scatter([1, 2, 3], [3, 2, 1], label='s')\naxs[1].set_title('Dots')");
      expect(both.type).toBe('superchart');
      expect(both.title).toBe('Two');
      expect(both.elements.map((c) => c.type)).toEqual(['line', 'scatter']);
      expect(both.elements[1]).toMatchObject({ title: 'Dots', elements: [{ label: 's', points: [[1, 3], [2, 2], [3, 1]] }] });

      expect(await chartOf("fig, ax = plt.subplots()\nax.add_artist(plt.Circle((0, 0), 1))\nplt.title('Circle')")).toEqual({ type: 'unknown', title: 'Circle', elements: [] });
    } finally {
      await sbx.kill();
    }
  }, 180_000);
});

describe('attacks on the E2B face', () => {
  it('an upload that is not the gzip it says it is: 400 and no file; another encoding: 415', async () => {
    const made = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 60 }, { 'x-api-key': s.token });
    const id: string = made.body.sandboxID;
    const headers = { 'e2b-sandbox-id': id, 'x-access-token': made.body.envdAccessToken as string, 'content-type': 'application/octet-stream' };
    try {
      const bad = await fetch(`${s.url}/files?path=/tmp/bomb`, { method: 'POST', headers: { ...headers, 'content-encoding': 'gzip' }, body: 'not gzip at all' });
      expect(bad.status, await bad.text()).toBe(400);
      const br = await fetch(`${s.url}/files?path=/tmp/bomb`, { method: 'POST', headers: { ...headers, 'content-encoding': 'br' }, body: 'x' });
      expect(br.status).toBe(415);
      expect((await s.exec(id, { command: 'test -e /tmp/bomb && echo there || echo none' })).stdout).toBe('none\n');
    } finally {
      await s.api('DELETE', `/instances/${id}`);
    }
  });

  it('a sandbox\'s access token opens that sandbox only; a fork gets its own; control calls need the API key', async () => {
    const a = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 60 }, { 'x-api-key': s.token });
    const b = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 60 }, { 'x-api-key': s.token });
    expect(a.status).toBe(201);
    const tokenA: string = a.body.envdAccessToken;
    const rpc = (id: string, token: string) =>
      fetch(`${s.url}/process.Process/List`, { method: 'POST', headers: { 'content-type': 'application/json', 'e2b-sandbox-id': id, 'x-access-token': token }, body: '{}' });
    expect((await rpc(a.body.sandboxID, tokenA)).status).toBe(200);
    expect((await rpc(b.body.sandboxID, tokenA)).status).toBe(401);
    expect((await rpc(a.body.sandboxID, tokenA.slice(0, -2) + 'xx')).status).toBe(401);
    const files = await fetch(`${s.url}/files?path=/etc/hostname`, { headers: { 'e2b-sandbox-id': b.body.sandboxID, 'x-access-token': tokenA } });
    expect(files.status).toBe(401);
    // A port inside another sandbox, through the proxy, with the wrong sandbox's token.
    const port = await fetch(`${s.url}/`, { headers: { 'e2b-sandbox-id': b.body.sandboxID, 'e2b-sandbox-port': '8080', 'x-access-token': tokenA } });
    expect(port.status).toBe(401);
    // With its own token, a closed port is the sandbox's business: 503, not a server error.
    const closed = await fetch(`${s.url}/`, { headers: { 'e2b-sandbox-id': a.body.sandboxID, 'e2b-sandbox-port': '8080', 'x-access-token': tokenA } });
    expect(closed.status).toBe(503);

    const forks = await s.api('POST', `/sandboxes/${a.body.sandboxID}/fork`, { count: 1 }, { 'x-api-key': s.token });
    expect(forks.status).toBe(201);
    const f = forks.body[0].sandbox;
    expect(f.envdAccessToken).not.toBe(tokenA);
    expect((await rpc(f.sandboxID, tokenA)).status).toBe(401);
    expect((await rpc(f.sandboxID, f.envdAccessToken)).status).toBe(200);

    // The traffic token opens the sandbox's ports, not its envd, and no other sandbox's ports.
    const traffic: string = a.body.trafficAccessToken;
    expect(traffic).toMatch(/^tok_/);
    expect((await rpc(a.body.sandboxID, traffic)).status).toBe(401);
    const viaTraffic = (id: string) => fetch(`${s.url}/`, { headers: { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '8080', 'e2b-traffic-access-token': traffic } });
    expect((await viaTraffic(a.body.sandboxID)).status).toBe(503); // let in: nothing listens there
    expect((await viaTraffic(b.body.sandboxID)).status).toBe(401);

    expect((await s.api('GET', `/sandboxes/${a.body.sandboxID}`, undefined, {})).status).toBe(401);
    const { token } = await s.fp.store.tokens.create('intruder', 'test');
    const other = await s.api('GET', `/sandboxes/${a.body.sandboxID}`, undefined, { 'x-api-key': token });
    expect(other.status).toBe(404);
    expect(other.body).toMatchObject({ code: 404 });
    expect((await s.api('DELETE', `/sandboxes/${a.body.sandboxID}`, undefined, { 'x-api-key': token })).status).toBe(404);
    for (const id of [a.body.sandboxID, b.body.sandboxID, f.sandboxID]) expect((await s.api('DELETE', `/sandboxes/${id}`, undefined, { 'x-api-key': s.token })).status).toBe(204);
  });
});
