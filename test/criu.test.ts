import { createHash } from 'node:crypto';
import { chmod, mkdir, mkdtemp, readdir, readFile, realpath, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { Criu } from '../src/engine/criu.js';
import { worker } from '../src/engine/launcher.js';
import { sleep, startServer, type TestServer } from './helpers/server.js';

let s: TestServer;
beforeAll(async () => {
  s = await startServer();
});
afterAll(async () => s?.close());

/** Builds test/fixtures/NAME.c static, puts it in the instance as /usr/local/bin/NAME and starts
 * it there with OUT as its argument (the file it answers SIGUSR1 in). */
async function runFixture(id: string, name: string, out: string): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'forkpoint-criu-'));
  try {
    const binary = join(dir, name);
    await execa('cc', ['-static', '-O2', '-pthread', '-o', binary, new URL(`./fixtures/${name}.c`, import.meta.url).pathname]);
    const up = await request(`${s.url}/instances/${id}/files?path=/usr/local/bin/${name}`, { method: 'PUT', headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/octet-stream' }, body: await readFile(binary) });
    await up.body.text();
    expect(up.statusCode).toBeLessThan(300);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
  expect((await s.exec(id, { command: `chmod 755 /usr/local/bin/${name}` })).exit_code).toBe(0);
  expect((await s.api('POST', `/instances/${id}/processes`, { command: `exec /usr/local/bin/${name} ${out}` })).status).toBeLessThan(300);
}

/** SIGUSR1 to the instance's processes named NAME, and what OUT holds once one has answered. */
async function ask(id: string, name: string, out: string): Promise<string> {
  const r = await s.exec(id, { command: `rm -f ${out}; for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = ${name} ] && kill -USR1 \${p#/proc/}; done; for i in $(seq 100); do [ -s ${out} ] && break; sleep 0.02; done; cat ${out}` });
  return r.stdout.trim();
}

describe('the project\'s CRIU', () => {
  it('is >= 4.2 and passes `criu check` on this kernel', async () => {
    const criu = loadConfig({ env: {} }).criuPath;
    const version = await execa(criu, ['--version']);
    const [major, minor] = /Version:\s*(\d+)\.(\d+)/.exec(version.stdout)!.slice(1).map(Number);
    expect(major! * 100 + minor!).toBeGreaterThanOrEqual(402);
    const check = await execa(criu, ['check'], { reject: false });
    expect(check.exitCode, check.stderr).toBe(0);
  });

  it('is forkpoint\'s build, with the patches of deploy/criu/: set-up did not fall back to an unpatched CRIU', async () => {
    const criu = loadConfig({ env: {} }).criuPath;
    const patches = (await readdir('deploy/criu')).filter((f) => f.endsWith('.patch')).sort();
    const digest = createHash('sha256');
    for (const f of patches) digest.update(await readFile(join('deploy/criu', f)));
    // deploy/criu.sh's build flags are in the digest too (`echo "${build_flags[*]}"`).
    const flags = /^build_flags=\(([^)]*)\)$/m.exec(await readFile('deploy/criu.sh', 'utf8'))![1]!;
    digest.update(`${flags}\n`);
    expect((await readFile(`${criu}.patches`, 'utf8')).trim()).toBe(digest.digest('hex'));
    // Maps libc and nothing else (built without GnuTLS, libnftables opened when a network lock
    // needs it, the rest linked in: deploy/criu/0014): every CRIU process loads its libraries,
    // and every task a restore forks from it unmaps them.
    const libs = await execa('ldd', [await realpath(criu)]);
    const mapped = libs.stdout.split('\n').map((l) => l.trim().split(/\s/)[0]!).filter((l) => l && !/^linux-vdso|ld-linux/.test(l));
    expect(mapped).toEqual(['libc.so.6']);
    // The patch itself: a network namespace dumped empty costs no walk of the host's conntrack
    // table (CRIU's log names that walk "Dumping netns links", after the namespace's info).
    const dir = await mkdtemp(join(tmpdir(), 'forkpoint-criu-'));
    const tree = execa('setsid', ['unshare', '-n', 'sleep', '60'], { stdio: 'ignore', reject: false });
    try {
      await new Promise((r) => setTimeout(r, 200));
      const dumped = await execa(criu, ['dump', '-t', String(tree.pid), '-D', dir, '--empty-ns', 'net', '--leave-running', '--network-lock', 'skip', '-v4', '-o', 'dump.log'], { reject: false, timeout: 30_000 });
      const log = await readFile(join(dir, 'dump.log'), 'utf8');
      expect(dumped.exitCode, log.slice(-2000)).toBe(0);
      const afterNetns = log.slice(log.indexOf('Dump NET namespace info'));
      expect(afterNetns.length).toBeLessThan(log.length);
      expect(afterNetns).not.toContain('Dumping netns links');
    } finally {
      tree.kill('SIGKILL');
      await tree;
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('restores with no network lock when the restore asks for none, whatever lock the dump took (deploy/criu/0002; the dump\'s nftables lock is libnftables opened on demand, 0014)', async () => {
    const criu = loadConfig({ env: {} }).criuPath;
    const dir = await mkdtemp(join(tmpdir(), 'forkpoint-criu-'));
    // What the restored namespace holds just before CRIU would unlock it: an unpatched CRIU
    // takes the dump's nftables lock from the inventory image and makes its table there.
    const script = join(dir, 'tables.sh');
    await writeFile(script, `#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = post-restore ] || exit 0\nnsenter -t "$CRTOOLS_INIT_PID" -n nft list tables > ${join(dir, 'tables.txt')} 2>&1\n`);
    await chmod(script, 0o755);
    const tree = execa('setsid', ['unshare', '-n', 'sleep', '60'], { stdio: 'ignore', reject: false });
    let restored: number | undefined;
    try {
      await new Promise((r) => setTimeout(r, 200));
      const dumped = await execa(criu, ['dump', '-t', String(tree.pid), '-D', dir, '--empty-ns', 'net', '--network-lock', 'nftables', '-o', 'dump.log'], { reject: false, timeout: 30_000 });
      expect(dumped.exitCode, await readFile(join(dir, 'dump.log'), 'utf8').catch(() => '')).toBe(0);
      const pidfile = join(dir, 'restored.pid');
      const r = await execa(criu, ['restore', '-D', dir, '--empty-ns', 'net', '--network-lock', 'skip', '-d', '--pidfile', pidfile, '--action-script', script, '-o', 'restore.log'], { reject: false, timeout: 30_000 });
      expect(r.exitCode, await readFile(join(dir, 'restore.log'), 'utf8').catch(() => '')).toBe(0);
      restored = Number(await readFile(pidfile, 'utf8'));
      expect(await readFile(join(dir, 'tables.txt'), 'utf8')).toBe('');
    } finally {
      if (restored) process.kill(restored, 'SIGKILL');
      tree.kill('SIGKILL');
      await tree;
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('dumps and restores a process holding a listening TCP socket', async () => {
    const inst = await s.instance({ name: 'listener' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: ['nc', '-ll', '-p', '8080', '-e', 'echo', 'pong'] });
    const before = await s.exec(inst.id, { command: 'sleep 0.2; nc 127.0.0.1 8080 </dev/null; netstat -ltn | grep -c :8080; pidof nc' });
    const [pong, listening, listenerPid] = before.stdout.trim().split('\n');
    expect([pong, listening]).toEqual(['pong', '1']);
    const c = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true });
    expect(c.body.status, c.body.error).toBe('ready');
    const oldPid = s.engine.sandbox(inst.id)!.pid;
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: c.body.id })).status).toBe(200);
    expect(s.engine.sandbox(inst.id)!.pid).not.toBe(oldPid); // it really was restored from the dump
    const after = await s.exec(inst.id, { command: 'nc 127.0.0.1 8080 </dev/null; pidof nc' });
    // The same listener process, restored with its socket: same in-sandbox pid, still answering.
    expect(after.stdout).toBe(`pong\n${listenerPid}\n`);
  });

  it('probes the kernel when a worker starts, before its request, into a cache of its own build (deploy/criu/0012)', async () => {
    const cfg = loadConfig({ env: {} });
    const dir = await mkdtemp(join(tmpdir(), 'forkpoint-criu-'));
    const cache = join(dir, 'cache');
    let w: ReturnType<typeof worker> | undefined;
    try {
      // CRIU keeps its probes only on a tmpfs, as the engine's cache directory is.
      await mkdir(cache);
      await execa('mount', ['-t', 'tmpfs', '-o', 'size=1m,mode=0711', 'forkpoint-test-kdat', cache]);
      // Another build's probes, under the name every build used to share and under a name of its own.
      const foreign = { 'criu.kdat': 'another build\'s probes', 'criu-1.kdat': 'an older build\'s probes' };
      for (const [name, text] of Object.entries(foreign)) await writeFile(join(cache, name), text);
      w = worker(cfg.agentPath, new Criu(cfg.criuPath, cache).workerCommand({ fresh: true }), join(dir, 'criu.log'));
      await w.ready();
      // Answered its version: the probes are made and kept, no request asked yet.
      const kept = (await readdir(cache)).filter((f) => /^criu-\d+\.kdat$/.test(f) && f !== 'criu-1.kdat');
      expect(kept).toHaveLength(1);
      expect((await stat(join(cache, kept[0]!))).size).toBeGreaterThan(100);
      for (const [name, text] of Object.entries(foreign)) expect(await readFile(join(cache, name), 'utf8')).toBe(text);
    } finally {
      w?.end();
      await execa('umount', [cache], { reject: false });
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('a dump leaves each task\'s signal stack as it was, and no memfd of its parasite behind (deploy/criu/0013)', async () => {
    const { id } = await s.instance();
    await runFixture(id, 'altstack', '/tmp/alt');
    // SIGUSR1 to it, and what its handler found: on its own stack, which sigaltstack still names.
    const probe = () => ask(id, 'altstack', '/tmp/alt');
    expect(await probe()).toBe('onstack=1 sp=1 size=65536');
    let checkpoint = '';
    for (let i = 0; i < 2; i++) {
      const ck = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true });
      expect(ck.body.status).toBe('ready');
      checkpoint = ck.body.id;
      // Dumped and left running: as it was, and nothing of the parasite's in any task's files.
      expect(await probe()).toBe('onstack=1 sp=1 size=65536');
      const fds = await s.exec(id, { command: 'ls -l /proc/[0-9]*/fd/ 2>/dev/null | grep -c CRIUMFD || true' });
      expect(fds.stdout.trim()).toBe('0');
    }
    // Restored from the image: the same.
    expect((await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: checkpoint })).status).toBe(200);
    expect(await probe()).toBe('onstack=1 sp=1 size=65536');
    await s.api('DELETE', `/instances/${id}`);
  });

  it('a task of five threads keeps every one running through a dump, a rollback and a fork', async () => {
    const { id } = await s.instance();
    await runFixture(id, 'threads', '/tmp/counts');
    const counts = async (on: string) => (await ask(on, 'threads', '/tmp/counts')).split(' ').map(Number);
    const running = async (on: string) => {
      const before = await counts(on);
      await sleep(50);
      const after = await counts(on);
      expect(after.length).toBe(4);
      after.forEach((n, i) => expect(n, `thread ${i + 1}: ${before} then ${after}`).toBeGreaterThan(before[i]!));
      const tasks = await s.exec(on, { command: 'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = threads ] && ls $p/task | wc -l; done' });
      expect(tasks.stdout.trim()).toBe('5');
    };
    await running(id);
    const ck = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true });
    expect(ck.body.status).toBe('ready');
    await running(id);
    expect((await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: ck.body.id })).status).toBe(200);
    await running(id);
    const fork = await s.api('POST', `/instances/${id}/fork`, { checkpoint_id: ck.body.id });
    expect(fork.status).toBe(201);
    await running(fork.body.id);
    for (const x of [fork.body.id, id]) await s.api('DELETE', `/instances/${x}`);
  });

  it('is checked when the server starts, not when its image is built: a node whose `criu check` fails serves, says why, and is not ready', async () => {
    // CRIU as an unprivileged container would have it: the right version, a kernel that says no.
    const dir = await mkdtemp(join(tmpdir(), 'forkpoint-criu-'));
    const criu = join(dir, 'criu');
    await writeFile(criu, '#!/bin/sh\n[ "$1" = --version ] && { echo "Version: 4.2.1"; exit 0; }\necho "Error (criu/cr-check.c:1): ptrace(PTRACE_SEIZE) failed: Operation not permitted" >&2\nexit 1\n');
    await chmod(criu, 0o755);
    const node = await startServer({ criuPath: criu });
    try {
      const health = await node.api('GET', '/healthz', undefined, {});
      expect(health.body.ok).toBe(false);
      expect(health.body.engine.criu).toMatchObject({ version: '4.2.1', ok: false });
      expect(health.body.engine.criu.error).toContain('PTRACE_SEIZE');
      const ready = await node.api('GET', '/readyz', undefined, {});
      expect([ready.status, ready.body.checks.engine]).toEqual([503, false]);
    } finally {
      await node.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
