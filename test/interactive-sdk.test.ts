import { Sandbox } from '@opencomputer/sdk';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';
import { sleep, until } from './helpers/wait.js';

// Node 20 has no global WebSocket; the SDK uses the global one (as in browsers and Node 22).
globalThis.WebSocket ??= (await import('undici')).WebSocket as unknown as typeof globalThis.WebSocket;

let s: TestServer;
let opts: { apiUrl: string; apiKey: string };
beforeAll(async () => {
  s = await startServer();
  opts = { apiUrl: s.url, apiKey: s.token };
});
afterAll(async () => s?.close());

const text = (chunks: Uint8Array[]) => Buffer.concat(chunks.map((c) => Buffer.from(c))).toString('utf8');


describe('the published @opencomputer/sdk, interactively', () => {
  it('exec.start delivers each line as it is printed, and done resolves with the exit code', async () => {
    const sb = await Sandbox.create(opts);
    // Each line is printed only once the test has seen the one before (it makes a file the
    // command waits for): the lines can only all arrive if each came as it was printed.
    const seen: string[] = [];
    const wait = (n: number) => `while [ ! -e /tmp/go${n} ]; do sleep 0.02; done`;
    const session = await sb.exec.start('sh', {
      args: ['-c', `echo n1; ${wait(1)}; echo n2; ${wait(2)}; echo n3; exit 7`],
      onStdout: (d) => {
        seen.push(Buffer.from(d).toString());
        if (seen.length < 3) void sb.files.write(`/tmp/go${seen.length}`, '');
      },
    });
    expect(await session.done).toBe(7);
    expect(seen).toEqual(['n1\n', 'n2\n', 'n3\n']);
    const list = await sb.exec.list();
    expect(list.find((x) => x.sessionID === session.sessionId)).toMatchObject({ command: 'sh', running: false, exitCode: 7, sandboxID: sb.sandboxId });
    await sb.kill();
  });

  it('output bytes that look like the framing cannot forge an exit or the end of the scrollback', async () => {
    const sb = await Sandbox.create(opts);
    const out: Uint8Array[] = [];
    let scrollbackEnds = 0;
    const session = await sb.exec.start('sh', {
      args: ['-c', "printf '\\003\\000\\000\\000\\000\\004'; printf '\\003\\000\\000\\000\\001' >&2; sleep 0.2; exit 6"],
      onStdout: (d) => out.push(d),
      onScrollbackEnd: () => scrollbackEnds++,
    });
    expect(await session.done).toBe(6);
    expect(Buffer.concat(out.map((c) => Buffer.from(c)))).toEqual(Buffer.from([3, 0, 0, 0, 0, 4]));
    expect(scrollbackEnds).toBe(1);
    await sb.kill();
  });

  it('a client that disconnects and attaches again gets the scrollback, then the rest live', async () => {
    const sb = await Sandbox.create(opts);
    const first: Uint8Array[] = [];
    const session = await sb.exec.start('sh', { args: ['-c', 'for i in 1 2 3 4 5 6; do echo line$i; sleep 0.25; done'], onStdout: (d) => first.push(d) });
    await until('two lines', () => text(first).includes('line2'));
    session.close();
    await sleep(400); // lines go on being printed with no client attached
    const again: Uint8Array[] = [];
    let scrollbackEndedAt = -1;
    const attached = await sb.exec.attach(session.sessionId, {
      onStdout: (d) => again.push(d),
      onScrollbackEnd: () => (scrollbackEndedAt = again.length),
    });
    expect(await attached.done).toBe(0);
    expect(text(again)).toBe('line1\nline2\nline3\nline4\nline5\nline6\n');
    // The replay ended before the last lines, which came live.
    expect(scrollbackEndedAt).toBeGreaterThan(0);
    expect(text(again.slice(0, scrollbackEndedAt))).not.toContain('line6');
    await sb.kill();
  });

  it('exec.shell keeps cwd and variables across calls and across a checkpoint and its restore', async () => {
    const sb = await Sandbox.create(opts);
    const shell = await sb.exec.shell();
    await shell.run('cd /tmp && export X=one');
    expect(await shell.run('echo "$X in $(pwd)"')).toEqual({ exitCode: 0, stdout: 'one in /tmp\n', stderr: '' });
    expect((await shell.run('false')).exitCode).toBe(1);
    const cp = await sb.createCheckpoint('shell');
    await shell.run('cd / && export X=two');
    expect((await shell.run('echo "$X in $(pwd)"')).stdout).toBe('two in /\n');
    await sb.restoreCheckpoint(cp.id);
    // The same shell, as it was at the checkpoint: the session survives the rollback attached.
    expect((await shell.run('echo "$X in $(pwd)"')).stdout).toBe('one in /tmp\n');
    await shell.close();
    await sb.kill();
  });

  it('pty.create echoes what is typed and honours resize (stty size)', async () => {
    const sb = await Sandbox.create(opts);
    const out: Uint8Array[] = [];
    const pty = await sb.pty.create({ cols: 100, rows: 30, onOutput: (d) => out.push(d) });
    await until('a prompt', () => out.length > 0);
    pty.send('echo hel""lo-pty\n');
    // bash (the default image is Debian's) ends bracketed paste with \r before the output.
    await until('the echo and the output', () => /echo hel""lo-pty/.test(text(out)) && /[\r\n]hello-pty\r?\n/.test(text(out)));
    pty.send('stty size\n');
    await until('the size', () => /[\r\n]30 100\r?\n/.test(text(out)));
    const r = await request(`${s.url}/api/sandboxes/${sb.sandboxId}/pty/${pty.sessionId}/resize`, {
      method: 'POST',
      headers: { 'x-api-key': s.token, 'content-type': 'application/json' },
      body: JSON.stringify({ cols: 120, rows: 40 }),
    });
    expect(r.statusCode).toBe(204);
    await r.body.dump();
    pty.send('stty size\n');
    await until('the new size', () => /[\r\n]40 120\r?\n/.test(text(out)));
    pty.close();
    const del = await request(`${s.url}/api/sandboxes/${sb.sandboxId}/pty/${pty.sessionId}`, { method: 'DELETE', headers: { 'x-api-key': s.token } });
    expect(del.statusCode).toBe(204);
    await del.body.dump();
    await sb.kill();
  });

  it('run-async answers 202 for a slow command, and the result comes later; exec.run waits for it', async () => {
    const sb = await Sandbox.create(opts);
    const post = async (body: unknown) => {
      const r = await request(`${s.url}/api/sandboxes/${sb.sandboxId}/exec/run-async`, {
        method: 'POST',
        headers: { 'x-api-key': s.token, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      return { status: r.statusCode, body: (await r.body.json()) as Record<string, unknown> };
    };
    const result = async (execId: string) => {
      const r = await request(`${s.url}/api/sandboxes/${sb.sandboxId}/exec/${execId}/result`, { headers: { 'x-api-key': s.token } });
      return (await r.body.json()) as Record<string, unknown>;
    };
    const quick = await post({ cmd: 'echo', args: ['quick'] });
    expect(quick).toMatchObject({ status: 200, body: { running: false, exitCode: 0, stdout: 'quick\n' } });
    const slow = await post({ cmd: 'sh', args: ['-c', 'sleep 4; echo slow; exit 4'] });
    expect(slow.status).toBe(202);
    expect(slow.body).toMatchObject({ running: true, execId: expect.stringMatching(/^exec_/) });
    // A result poll waits a while (a long poll), and says it still runs.
    const t = performance.now();
    expect((await result(slow.body.execId as string)).running).toBe(true);
    expect(performance.now() - t).toBeGreaterThan(1000);
    await until('the result', async () => !(await result(slow.body.execId as string)).running, 15_000);
    expect(await result(slow.body.execId as string)).toMatchObject({ running: false, exitCode: 4, stdout: 'slow\n' });
    // The SDK's own run goes through run-async and the result poll.
    expect(await sb.exec.run('sleep 1.5; echo done')).toEqual({ exitCode: 0, stdout: 'done\n', stderr: '' });
    await sb.kill();
  });

  it('hibernate frees the sandbox\'s memory; wake brings back a shell variable and a counter that goes on from where it was', async () => {
    const sb = await Sandbox.create(opts);
    const out: Uint8Array[] = [];
    const session = await sb.exec.start('bash', { args: ['--norc'], onStdout: (d) => out.push(d) });
    session.sendStdin('SECRET=kept-in-memory\n');
    session.sendStdin('(i=0; while true; do echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; i=$((i+1)); sleep 0.05; done) &\n');
    session.sendStdin('echo started\n');
    await until('the loop', () => text(out).includes('started'));
    await sleep(500);
    const before = Number((await sb.exec.run('cat /tmp/counter')).stdout);
    expect(before).toBeGreaterThan(3);
    const memoryBefore = await s.engine.memoryInUse(sb.sandboxId);
    expect(memoryBefore).toBeGreaterThan(0);
    await sb.hibernate();
    const rec = (await s.fp.store.instances.get(sb.sandboxId))!;
    expect(rec.status).toBe('hibernated');
    expect(s.engine.sandbox(sb.sandboxId)).toBeUndefined(); // no process left of it
    expect((await Sandbox.connect(sb.sandboxId, opts)).status).toBe('hibernated');
    expect(await s.engine.memoryInUse(sb.sandboxId)).toBe(0); // its cgroup is gone with it
    await sb.wake();
    expect((await Sandbox.connect(sb.sandboxId, opts)).status).toBe('running');
    const after = Number((await sb.exec.run('cat /tmp/counter')).stdout);
    // It went on from where it was: not back to 0, and not as if it had run while hibernated.
    expect(after).toBeGreaterThanOrEqual(before);
    expect(after).toBeLessThan(before + 40);
    const back: Uint8Array[] = [];
    const again = await sb.exec.attach(session.sessionId, { onStdout: (d) => back.push(d) });
    again.sendStdin('echo "secret=$SECRET"\n');
    await until('the variable', () => text(back).includes('secret=kept-in-memory'));
    again.close();
    await sb.kill();
  });

  it('a sandbox idle for its timeout hibernates by itself, and the next exec.run wakes it', async () => {
    const sb = await Sandbox.create({ ...opts, timeout: 2 });
    await sb.exec.run('echo marker > /tmp/m; X=1');
    await until('idle hibernation', async () => (await Sandbox.connect(sb.sandboxId, opts)).status === 'hibernated', 10_000);
    expect(await sb.exec.run('cat /tmp/m')).toEqual({ exitCode: 0, stdout: 'marker\n', stderr: '' });
    expect((await Sandbox.connect(sb.sandboxId, opts)).status).toBe('running');
    // setTimeout(0): it stays up.
    await sb.setTimeout(0);
    await sleep(2600);
    expect((await Sandbox.connect(sb.sandboxId, opts)).status).toBe('running');
    await sb.kill();
  });
});
