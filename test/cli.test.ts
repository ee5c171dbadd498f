import { createHash, randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import pty from 'node-pty';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';
import { until } from './helpers/wait.js';

/** The client CLI as a user runs it: the built command, pointed at a server by its variables. */
const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
let s: TestServer;
let work: string;
let env: Record<string, string>;
const fp = (args: string[], opts: { input?: string; token?: string } = {}) =>
  execa(process.execPath, [CLI, ...args], { env: { ...env, ...(opts.token ? { FORKPOINT_TOKEN: opts.token } : {}) }, reject: false, ...(opts.input !== undefined ? { input: opts.input } : {}) });

beforeAll(async () => {
  s = await startServer();
  work = await mkdtemp(join(tmpdir(), 'fp-cli-'));
  // Its own config home: no login of the machine's user is read or written.
  env = { ...(process.env as Record<string, string>), FORKPOINT_URL: s.url, FORKPOINT_TOKEN: s.token, XDG_CONFIG_HOME: join(work, 'config'), NO_COLOR: '1' };
});
afterAll(async () => {
  await s?.close();
  await rm(work, { recursive: true, force: true });
});

async function created(name: string): Promise<string> {
  const r = await fp(['create', '--name', name, '--json']);
  expect(r.exitCode, r.stderr).toBe(0);
  return (JSON.parse(r.stdout) as { id: string }).id;
}

async function treeSums(dir: string, rel = ''): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const e of await readdir(join(dir, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) Object.assign(out, { [`${r}/`]: 'dir' }, await treeSums(dir, r));
    else out[r] = createHash('sha256').update(await readFile(join(dir, r))).digest('hex');
  }
  return out;
}

describe('the client CLI', () => {
  it('create, ls as a table with headers and as JSON that parses, rm', async () => {
    const id = await created('cli-ls');
    const table = await fp(['ls']);
    expect(table.exitCode).toBe(0);
    expect(table.stdout.split('\n')[0]).toMatch(/^ID\s+NAME\s+IMAGE\s+STATUS\s+ADDRESS\s+CREATED$/);
    expect(table.stdout).toMatch(new RegExp(`${id}\\s+cli-ls\\s+default\\s+running`));
    const json = JSON.parse((await fp(['ls', '--json'])).stdout) as { id: string }[];
    expect(json.map((i) => i.id)).toContain(id);
    expect((await fp(['rm', id])).exitCode).toBe(0);
    expect((await fp(['ls', '--json'])).stdout).not.toContain(id);
  });

  it('exec streams a slow command\'s lines as they come, forwards stdin, and exits with the command\'s status', async () => {
    const id = await created('cli-exec');
    const child = execa(process.execPath, [CLI, 'exec', id, '--', 'sh', '-c', 'echo one; sleep 1; echo two >&2; sleep 1; echo three; exit 7'], { env, reject: false });
    const seen: { line: string; at: number }[] = [];
    const t0 = Date.now();
    child.stdout!.on('data', (d: Buffer) => seen.push({ line: d.toString(), at: Date.now() - t0 }));
    const r = await child;
    expect(r.exitCode).toBe(7);
    expect(r.stdout).toBe('one\nthree');
    expect(r.stderr).toBe('two');
    // "one" came a second or more before "three": streamed, not held to the end.
    const one = seen.find((x) => x.line.includes('one'))!;
    const three = seen.find((x) => x.line.includes('three'))!;
    expect(three.at - one.at).toBeGreaterThan(1500);
    const upper = await fp(['exec', '-i', id, '--', 'tr', 'a-z', 'A-Z'], { input: 'piped in\n' });
    expect([upper.exitCode, upper.stdout]).toEqual([0, 'PIPED IN']);
    const json = JSON.parse((await fp(['exec', id, '--json', '--', 'sh', '-c', 'echo out; exit 2'])).stdout) as { exit_code: number; stdout: string };
    expect(json).toMatchObject({ exit_code: 2, stdout: 'out\n' });
  });

  it('exec --detach starts a background process; ps lists it; logs prints and follows what it printed; kill ends it', async () => {
    const id = await created('cli-bg');
    const started = await fp(['exec', '--detach', id, '--', 'sh', '-c', 'echo first; echo oops >&2; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo last; exit 3']);
    expect(started.exitCode, started.stderr).toBe(0);
    const execId = started.stdout.trim();
    expect(execId).toMatch(/^exec_[0-9a-f]{8}$/);
    const ps = await fp(['ps', id]);
    expect(ps.stdout.split('\n')[0]).toMatch(/^EXEC ID\s+KIND\s+PID\s+STATUS\s+EXIT\s+STARTED\s+COMMAND$/);
    expect(ps.stdout).toMatch(new RegExp(`${execId}\\s+exec\\s+\\d+\\s+running\\s+-`));
    await until('its first lines printed', async () => (await fp(['logs', id, execId])).stdout === 'first', 10_000);
    expect((await fp(['logs', id, execId])).stderr).toBe('oops');
    // -f replays, then follows to the end.
    const follow = execa(process.execPath, [CLI, 'logs', '-f', id, execId], { env, reject: false });
    await until('the follower attached', async () => ((await s.api('GET', `/instances/${id}/exec/${execId}`)).body.attached as number) > 0, 10_000);
    expect((await fp(['exec', id, '--', 'touch', '/tmp/go'])).exitCode).toBe(0);
    const followed = await follow;
    expect([followed.exitCode, followed.stdout, followed.stderr]).toEqual([0, 'first\nlast', 'oops']);
    const listed = JSON.parse((await fp(['ps', id, '--json'])).stdout) as { id: string; status: string; exit_code: number }[];
    expect(listed.find((e) => e.id === execId)).toMatchObject({ status: 'exited', exit_code: 3 });
    // kill: a signal by name to a second one's whole group.
    const sleeper = (await fp(['exec', '--detach', id, '--', 'sleep 600'])).stdout.trim();
    expect((await fp(['kill', '-s', 'TERM', id, sleeper])).exitCode).toBe(0);
    await until('the sleeper ended by its signal', async () => (await s.api('GET', `/instances/${id}/exec/${sleeper}`)).body.signal === 15, 10_000);
    const usage = await fp(['exec', '--detach', '-t', '5', id, '--', 'true']);
    expect([usage.exitCode, usage.stderr]).toEqual([2, expect.stringContaining('--timeout')]);
    expect((await fp(['kill', '-s', 'NOPE', id, sleeper])).exitCode).toBe(2);
  });

  it('cp round-trips a directory tree, byte for byte', async () => {
    const id = await created('cli-cp');
    const src = join(work, 'tree');
    await mkdir(join(src, 'a/b'), { recursive: true });
    await mkdir(join(src, 'empty'));
    await writeFile(join(src, 'top.txt'), 'top\n');
    await writeFile(join(src, 'a/b/big.bin'), randomBytes(3 << 20));
    await writeFile(join(src, 'a/small'), randomBytes(100));
    await writeFile(join(src, 'run.sh'), '#!/bin/sh\necho ran\n', { mode: 0o755 });
    const up = await fp(['cp', src, `${id}:/root/`]);
    expect(up.exitCode, up.stderr).toBe(0);
    expect((await s.exec(id, { command: 'ls -R /root/tree | head -20' })).stdout).toContain('big.bin');
    const back = join(work, 'back');
    const down = await fp(['cp', `${id}:/root/tree`, back]);
    expect(down.exitCode, down.stderr).toBe(0);
    expect(await treeSums(back)).toEqual(await treeSums(src));
    // Modes go both ways: a script copied in runs there, and comes back executable.
    expect((await s.exec(id, { command: '/root/tree/run.sh' })).stdout).toBe('ran\n');
    expect((await stat(join(back, 'run.sh'))).mode & 0o777).toBe(0o755);
    expect((await stat(join(back, 'top.txt'))).mode & 0o777).toBe(0o644);
    // One file, into a directory that is there: under its own name.
    await mkdir(join(work, 'one'));
    expect((await fp(['cp', `${id}:/root/tree/top.txt`, join(work, 'one')])).exitCode).toBe(0);
    expect(await readFile(join(work, 'one/top.txt'), 'utf8')).toBe('top\n');
    expect((await stat(join(work, 'one/top.txt'))).size).toBe(4);
  });

  it('checkpoint (followed until ready), rollback, fork -n 2, and lineage drawn as a tree', async () => {
    const id = await created('cli-tree');
    await s.exec(id, { command: 'echo before > /root/state' });
    const ck = await fp(['checkpoint', id, '--label', 'before']);
    expect(ck.exitCode, ck.stderr).toBe(0);
    expect(ck.stdout).toMatch(/^ckpt_\w+ ready \(paused [\d.]+ ms/);
    const ckId = ck.stdout.split(' ')[0]!;
    await s.exec(id, { command: 'echo after > /root/state' });
    expect((await fp(['rollback', id, ckId])).exitCode).toBe(0);
    expect((await s.exec(id, { command: 'cat /root/state' })).stdout).toBe('before\n');
    const forks = await fp(['fork', id, ckId, '-n', '2', '--name', 'twin']);
    expect(forks.stdout.trim().split('\n')).toHaveLength(2);
    const tree = (await fp(['lineage', id])).stdout;
    expect(tree).toMatch(new RegExp(`^● cli-tree ${id} running\\n└── ◆ before ${ckId} ready\\n    ├── ● twin-1 inst_\\w+ running\\n    └── ● twin-2 inst_\\w+ running$`));
    const json = JSON.parse((await fp(['lineage', id, '--json'])).stdout) as { children: { children: unknown[] }[] };
    expect(json.children[0]!.children).toHaveLength(2);
    const list = (await fp(['checkpoints', id])).stdout;
    expect(list.split('\n')[0]).toMatch(/^ID\s+LABEL\s+STATUS/);
    expect(list).toContain(ckId);
  });

  it('hibernate and wake, the events they left, a preview link, images and templates', async () => {
    const id = await created('cli-more');
    expect((await fp(['hibernate', id])).stdout).toBe(`${id} hibernated`);
    expect((await fp(['wake', id])).stdout).toBe(`${id} running`);
    const events = await fp(['events', id]);
    expect(events.exitCode, events.stderr).toBe(0);
    expect(events.stdout).toMatch(/instance\.hibernated[\s\S]*instance\.woken/);
    const json = (await fp(['events', id, '--json'])).stdout.split('\n').map((l) => JSON.parse(l) as { type: string });
    expect(json.map((e) => e.type)).toEqual(expect.arrayContaining(['instance.hibernated', 'instance.woken']));
    expect((await fp(['preview', id, '8080'])).stdout).toMatch(new RegExp(`^http://8080-${id}\\.localhost:\\d+/\\?fp_preview=`));
    expect((await fp(['ports', id])).stdout.split('\n')[0]).toMatch(/^ID\s+GUEST\s+HOST\s+LABEL$/);
    const images = JSON.parse((await fp(['images', '--json'])).stdout) as { name: string }[];
    expect(images.map((i) => i.name)).toContain('default');
    expect(JSON.parse((await fp(['templates', '--json'])).stdout)).toEqual(expect.any(Array));
  });

  it('a bad token is one clear line with the server\'s code, and a non-zero exit; so is a usage error', async () => {
    const r = await fp(['ls'], { token: 'not-a-token' });
    expect(r.exitCode).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^forkpoint: UNAUTHENTICATED: /);
    const missing = await fp(['rollback', 'inst_nosuchthing', 'ckpt_none']);
    expect([missing.exitCode, missing.stderr]).toEqual([1, expect.stringMatching(/^forkpoint: NOT_FOUND: /)]);
    const usage = await fp(['exec']);
    expect(usage.exitCode).toBe(2);
    const unreachable = await execa(process.execPath, [CLI, 'ls', '--url', 'http://127.0.0.1:9'], { env, reject: false });
    expect([unreachable.exitCode, unreachable.stderr]).toEqual([3, expect.stringMatching(/^forkpoint: UNREACHABLE: cannot reach http:\/\/127\.0\.0\.1:9/)]);
  });

  it('login keeps the URL and token in a file of mode 0600 that later commands use', async () => {
    const bare = { ...env };
    delete bare.FORKPOINT_URL;
    delete bare.FORKPOINT_TOKEN;
    const login = await execa(process.execPath, [CLI, 'login', '--url', s.url, '--token', s.token], { env: bare, reject: false });
    expect(login.exitCode, login.stderr).toBe(0);
    const file = join(work, 'config/forkpoint/cli.json');
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    const ls = await execa(process.execPath, [CLI, 'ls', '--json'], { env: bare, reject: false });
    expect(ls.exitCode, ls.stderr).toBe(0);
    expect(Array.isArray(JSON.parse(ls.stdout))).toBe(true);
  });

  it('shell: a real terminal (node-pty): a prompt, typed commands, its size followed, and the shell\'s exit status', async () => {
    const id = await created('cli-shell');
    const term = pty.spawn(process.execPath, [CLI, 'shell', id], { name: 'xterm', cols: 80, rows: 24, env });
    let out = '';
    term.onData((d) => (out += d));
    const exited = new Promise<number>((resolve) => term.onExit(({ exitCode }) => resolve(exitCode)));
    try {
      await until('a prompt', () => /[#$] $/.test(out), 15_000);
      term.write('echo typed-$((6*7))\r');
      await until('the command\'s output', () => out.includes('typed-42'), 10_000);
      term.write('stty size\r');
      await until('the first size', () => out.includes('24 80'), 10_000);
      term.resize(100, 30);
      await new Promise((r) => setTimeout(r, 300));
      term.write('stty size\r');
      await until('the new size', () => out.includes('30 100'), 10_000);
      term.write('exit 3\r');
      expect(await exited).toBe(3);
    } finally {
      try {
        term.kill();
      } catch {
        // already gone
      }
    }
  });

  it('completion scripts for bash, zsh and fish name the commands', async () => {
    for (const shell of ['bash', 'zsh', 'fish']) {
      const r = await fp(['completion', shell]);
      expect(r.exitCode).toBe(0);
      expect(r.stdout).toContain('checkpoint');
      expect(r.stdout).toContain('rollback');
    }
    const bash = await execa('bash', ['-c', `source <(${process.execPath} ${CLI} completion bash) && complete -p forkpoint`], { env });
    expect(bash.stdout).toContain('_forkpoint');
  });
});
