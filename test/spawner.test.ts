import { execFile } from 'node:child_process';
import { existsSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { Spawner } from '../src/engine/spawner.js';
import { eventually, startServer, type TestServer } from './helpers/server.js';

// The engine's processes are started by `fp-agent spawner` (native/spawner.c): a shim, a CRIU
// worker or a command forked by a small process instead of by the server, whose own fork stalls
// its event loop. What it starts must behave as if Node had spawned it, and nobody but the
// server may ask it for anything: it runs whatever it is asked, as root.

const agentPath = loadConfig({ env: {} }).agentPath;
const run = promisify(execFile);

let dir: string;
let spawner: Spawner;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'forkpoint-spawner-'));
  spawner = new Spawner(agentPath, join(dir, 'private', 'socket'), join(dir, 'spawner.log'), process.env);
  await spawner.start();
});
afterAll(async () => {
  spawner?.close();
  await rm(dir, { recursive: true, force: true });
});

/** A command that writes its pid to a marker file and then sleeps, killed: it answers with a
 * failure and is gone (or a zombie left to its reaper). */
async function expectKillEnds(name: string, start: (marker: string) => { kill(): void; result: Promise<{ code: number }> }): Promise<void> {
  const marker = join(dir, name);
  const run = start(marker);
  await eventually(async () => existsSync(marker) && readFileSync(marker, 'utf8').trim() !== '');
  const pid = Number(readFileSync(marker, 'utf8'));
  run.kill();
  expect((await run.result).code).not.toBe(0);
  await eventually(async () => !existsSync(`/proc/${pid}`) || readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z '));
}

describe('the spawner', () => {
  it('is up, alone in a directory only root can enter', async () => {
    expect(spawner.available, readFileSync(join(dir, 'spawner.log'), 'utf8')).toBe(true);
    expect(statSync(join(dir, 'private')).mode & 0o777).toBe(0o700);
  });

  it('runs a command as run.ts does: its exit code, its stderr, its working directory; a command that cannot start is 127 with why', async () => {
    expect(await spawner.run('sh', ['-c', 'echo to-stdout; echo oops >&2; exit 3'])).toEqual({ code: 3, stderr: 'oops\n' });
    expect(await spawner.run('sh', ['-c', 'pwd >&2'], dir)).toEqual({ code: 0, stderr: `${dir}\n` });
    const missing = await spawner.run('/nonexistent/forkpoint-command', []);
    expect(missing.code).toBe(127);
    expect(missing.stderr).toMatch(/No such file/);
    expect((await spawner.run('sh', ['-c', 'kill -9 $$'])).code).toBe(128 + 9);
    // Many at once, each its own answer.
    const many = await Promise.all(Array.from({ length: 40 }, (_, i) => spawner.run('sh', ['-c', `echo ${i} >&2; exit ${i % 7}`])));
    expect(many).toEqual(Array.from({ length: 40 }, (_, i) => ({ code: i % 7, stderr: `${i}\n` })));
  });

  it('feeds a command its stdin later (nft -f -), and a kill by its waiter\'s pid ends the command too', async () => {
    const fed = spawner.piped('sh', ['-c', 'cat >&2; exit 4']);
    await new Promise((r) => setTimeout(r, 50));
    expect(fed.ended).toBe(false);
    fed.feed('line one\nline two\n');
    expect(await fed.result).toEqual({ code: 4, stderr: 'line one\nline two\n' });
    expect(fed.ended).toBe(true);

    await expectKillEnds('fed-pid', (marker) => {
      const stuck = spawner.piped('sh', ['-c', `echo $$ > ${marker}; cat >/dev/null; exec sleep 600`]);
      stuck.feed('');
      return stuck;
    });
  });

  it('runs a command for its stdout (du, find): its stdout in the answer, its stderr nowhere; a kill ends it', async () => {
    expect(await spawner.output('sh', ['-c', 'echo out; echo noise >&2; exit 2']).result).toEqual({ code: 2, stdout: 'out\n' });
    expect((await spawner.output('/nonexistent/forkpoint-command', []).result).code).toBe(127);
    // At most 64 KiB of it.
    expect((await spawner.output('sh', ['-c', 'head -c 200000 /dev/zero | tr "\\0" x']).result).stdout.length).toBe(64 * 1024);
    await expectKillEnds('output-pid', (marker) => spawner.output('sh', ['-c', `echo $$ > ${marker}; exec sleep 600`]));
  });

  it('starts a shim whose command talks frames on the connection and whose exit comes as a frame; its stdout is not the connection', async () => {
    const log = join(dir, 'shim.log');
    const s = spawner.shim(['shim', '--exit-frame', '--', 'sh', '-c', 'echo noise; printf "\\003\\000\\000\\000Khi" >&3; echo err >&2; exit 5'], log);
    const frames: Buffer[] = [];
    s.output.on('data', (b: Buffer) => frames.push(b));
    expect(await s.pid).toBeGreaterThan(0);
    expect(await s.exit).toBe(5);
    expect(Buffer.concat(frames)).toEqual(Buffer.from([3, 0, 0, 0, 0x4b, 0x68, 0x69]));
    expect(readFileSync(log, 'utf8')).toContain('err');
  });

  it('takes a stream that is not frames (a length past the relay\'s bound) for the end of the process, and keeps none of it', async () => {
    const s = spawner.shim(['shim', '--exit-frame', '--', 'sh', '-c', 'printf "\\377\\377\\377\\177K" >&3; sleep 5'], join(dir, 'shim2.log'));
    expect(await s.exit).toBe(127);
    expect(s.socket.destroyed).toBe(true);
    process.kill(-(await s.pid), 'SIGKILL');
  });

  it('attack: another process of the host that reaches the socket gets nothing run and its connection closed', async () => {
    const marker = join(dir, 'should-not-exist');
    // A separate process (not the spawner's parent) asking for a command, as a local attacker
    // who found the socket would.
    const script = `
      const net = require('node:net');
      const body = Buffer.from(['', 'touch', ${JSON.stringify(marker)}].join('\\0'));
      const head = Buffer.alloc(5); head.writeUInt32LE(body.length + 1, 0); head[4] = 'C'.charCodeAt(0);
      const s = net.connect(${JSON.stringify(join(dir, 'private', 'socket'))});
      let got = 0;
      s.on('data', (d) => { got += d.length; });
      s.on('error', () => {});
      s.on('close', () => { console.log('closed', got); });
      s.write(Buffer.concat([head, body]));`;
    const { stdout } = await run(process.execPath, ['-e', script], { timeout: 10_000 });
    expect(stdout.trim()).toBe('closed 0');
    await new Promise((r) => setTimeout(r, 100));
    expect(existsSync(marker)).toBe(false);
    // And the spawner serves its server on.
    expect((await spawner.run('true', [])).code).toBe(0);
  });
});

describe('a server\'s engine', () => {
  let s: TestServer;
  beforeAll(async () => {
    s = await startServer();
  });
  afterAll(async () => s?.close());

  const parentOf = (pid: number) => Number(readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /, '').split(' ')[1]);
  const cmdline = (pid: number) => readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');

  it('starts its sandboxes\' shims through its spawner, and spawns them itself once the spawner is gone', async () => {
    const a = await s.instance();
    const shim = parentOf(s.engine.sandbox(a.id)!.pid);
    expect(cmdline(shim).slice(1, 2)).toEqual(['shim']);
    const spawnerPid = parentOf(shim);
    expect(cmdline(spawnerPid).slice(1, 2)).toEqual(['spawner']);
    expect(readlinkSync(`/proc/${spawnerPid}/exe`)).toBe(agentPath);
    // A fork's restore too (its CRIU worker's shim parents the fork).
    const ck = await s.api('POST', `/instances/${a.id}/checkpoints?wait=true`, { memory: true });
    const f = await s.api('POST', `/instances/${a.id}/fork`, { checkpoint_id: ck.body.id });
    expect(f.status, JSON.stringify(f.body)).toBe(201);
    // (its CRIU, the fork's parent until it exits, goes once the worker is let go)
    await eventually(async () => parentOf(parentOf(s.engine.sandbox(f.body.id)!.pid)) === spawnerPid);

    process.kill(spawnerPid, 'SIGKILL');
    await new Promise((r) => setTimeout(r, 100));
    const b = await s.instance();
    expect((await s.exec(b.id, { command: 'echo ok' })).stdout).toBe('ok\n');
    expect(parentOf(parentOf(s.engine.sandbox(b.id)!.pid))).toBe(process.pid);
    // What the spawner started outlived it.
    expect((await s.exec(a.id, { command: 'echo still' })).stdout).toBe('still\n');
  });
});
