import { request } from 'undici';
import { WebSocket } from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openSse, type SseEvent } from './helpers/sse.js';
import { startServer, type TestServer } from './helpers/server.js';
import { sleep, until } from './helpers/wait.js';

let s: TestServer;
beforeAll(async () => {
  s = await startServer();
});
afterAll(async () => s?.close());

const auth = () => ({ authorization: `Bearer ${s.token}` });
const stream = (id: string, body: Record<string, unknown>) => openSse(`${s.url}/instances/${id}/exec/stream`, { method: 'POST', headers: auth(), body });
const outputOf = (events: SseEvent[], name = 'stdout') =>
  events.filter((e) => e.event === name).map((e) => Buffer.from(e.data.data, e.data.encoding === 'base64' ? 'base64' : 'utf8')).reduce((a, b) => Buffer.concat([a, b]), Buffer.alloc(0));


/** A WebSocket client that keeps what it receives and how it closed. */
function wsClient(url: string, headers: Record<string, string> = auth()) {
  const ws = new WebSocket(url, { headers });
  const received: Buffer[] = [];
  const closed = new Promise<{ code: number; reason: string }>((resolve) => ws.on('close', (code, reason) => resolve({ code, reason: reason.toString() })));
  const failed = new Promise<number>((resolve) => ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0)));
  ws.on('message', (d: Buffer) => received.push(Buffer.from(d)));
  ws.on('error', () => {});
  const opened = new Promise<void>((resolve) => ws.on('open', () => resolve()));
  return { ws, received, closed, failed, opened, text: () => Buffer.concat(received).toString('utf8') };
}

describe('exec/stream: Server-Sent Events over raw HTTP', () => {
  it('the first line arrives within 300 ms while the command still runs; exit carries the code', async () => {
    const inst = await s.instance();
    const sse = await stream(inst.id, { command: 'echo a; sleep 2; echo b; exit 3' });
    expect(sse.status).toBe(200);
    expect(sse.headers['content-type']).toMatch(/^text\/event-stream/);
    const start = await sse.next();
    expect(start).toMatchObject({ event: 'start', data: { exec_id: expect.stringMatching(/^exec_/), pid: expect.any(Number) } });
    expect(sse.headers['x-exec-id']).toBe(start!.data.exec_id);
    const first = await sse.next();
    expect(first).toMatchObject({ event: 'stdout', data: { data: 'a\n', offset: 0 }, id: '2-0' });
    expect(first!.at).toBeLessThan(300);
    const rest = await sse.rest();
    expect(rest.map((e) => e.event)).toEqual(['stdout', 'exit']);
    expect(rest[0]!.data).toEqual({ data: 'b\n', offset: 2 });
    expect(rest[0]!.at - first!.at).toBeGreaterThan(1500); // b came when it was printed
    expect(rest[1]!.data).toMatchObject({ exit_code: 3, signal: null, timed_out: false });
    expect(rest[1]!.data.duration_ms).toBeGreaterThan(1900);
  });

  it('a client that goes away detaches: the command runs on, and reattaching by exec id (Last-Event-ID) gives the rest', async () => {
    const inst = await s.instance();
    const sse = await stream(inst.id, { command: 'echo a; sleep 1; echo b; echo err >&2; sleep 0.5; echo c' });
    const { data: started } = (await sse.next())!;
    const a = await sse.next();
    expect(a!.data.data).toBe('a\n');
    sse.close();
    await sleep(300);
    const running = await s.api('GET', `/instances/${inst.id}/exec/${started.exec_id}`);
    expect(running.body).toMatchObject({ id: started.exec_id, status: 'running', exit_code: null, stdout: 'a\n', attached: 0 });
    const again = await openSse(`${s.url}/instances/${inst.id}/exec/${started.exec_id}/stream`, { headers: { ...auth(), 'last-event-id': a!.id! } });
    expect(again.status).toBe(200);
    const rest = await again.rest();
    expect(outputOf(rest).toString()).toBe('b\nc\n'); // no a again
    expect(outputOf(rest, 'stderr').toString()).toBe('err\n');
    expect(rest.at(-1)).toMatchObject({ event: 'exit', data: { exit_code: 0 } });
    // Streaming it once more from the start replays all of it and the exit.
    const all = await openSse(`${s.url}/instances/${inst.id}/exec/${started.exec_id}/stream`, { headers: auth() });
    const replay = await all.rest();
    expect(outputOf(replay).toString()).toBe('a\nb\nc\n');
    expect(replay.at(-1)!.event).toBe('exit');
    const done = await s.api('GET', `/instances/${inst.id}/exec/${started.exec_id}`);
    expect(done.body).toMatchObject({ status: 'exited', exit_code: 0, stdout: 'a\nb\nc\n', stderr: 'err\n', truncated: false });
  });

  it('text is UTF-8 where it is valid (a character split across writes included) and base64 with a flag where it is not', async () => {
    const inst = await s.instance();
    const sse = await stream(inst.id, { command: "printf 'caf\\303'; sleep 0.2; printf '\\251 ok\\n'; sleep 0.2; printf '\\377\\376bin'" });
    const events = await sse.rest();
    const out = events.filter((e) => e.event === 'stdout');
    expect(out.filter((e) => e.data.encoding !== 'base64').map((e) => e.data.data).join('')).toBe('café ok\n');
    const bin = out.find((e) => e.data.encoding === 'base64');
    expect(Buffer.from(bin!.data.data, 'base64')).toEqual(Buffer.from([0xff, 0xfe, 0x62, 0x69, 0x6e]));
  });

  it('an idle stream gets heartbeats', async () => {
    const inst = await s.instance();
    const sse = await stream(inst.id, { command: 'sleep 1.2', heartbeat_ms: 200 });
    const events = await sse.rest();
    expect(events.map((e) => e.event)).toEqual(['start', 'exit']);
    expect(sse.comments.filter((c) => c.text.startsWith('heartbeat')).length).toBeGreaterThanOrEqual(3);
  });

  it('bad input is a JSON 4xx before any stream starts', async () => {
    const inst = await s.instance();
    expect((await s.api('POST', `/instances/${inst.id}/exec/stream`, { command: [] })).status).toBe(400);
    const bad = await stream(inst.id, { command: ['/nonexistent/binary'] });
    expect(bad.status).toBe(400);
    expect(JSON.parse(await bad.text())).toMatchObject({ error: { code: 'INVALID_REQUEST' } });
    const missing = await openSse(`${s.url}/instances/${inst.id}/exec/exec_00000001/stream`, { headers: auth() });
    expect(missing.status).toBe(404);
    expect((await s.api('GET', `/instances/${inst.id}/exec/not-an-id`)).status).toBe(404);
    expect((await s.api('GET', `/instances/${inst.id}/exec/exec_00000001`)).body.error.code).toBe('NOT_FOUND');
  });

  it('lists executions a page at a time, and long-polls one for its result', async () => {
    const inst = await s.instance();
    const ids: string[] = [];
    for (const n of [1, 2, 3]) {
      const sse = await stream(inst.id, { command: `echo ${n}` });
      ids.push((await sse.next())!.data.exec_id);
      await sse.rest();
    }
    const p1 = await s.api('GET', `/instances/${inst.id}/exec?limit=2`);
    expect(p1.body.items.map((e: any) => e.id)).toEqual([ids[2], ids[1]]);
    const p2 = await s.api('GET', `/instances/${inst.id}/exec?limit=2&cursor=${p1.body.next_cursor}`);
    expect(p2.body).toMatchObject({ items: [{ id: ids[0], status: 'exited', exit_code: 0, command: ['/bin/sh', '-c', 'echo 1'] }], next_cursor: null });
    const slow = await stream(inst.id, { command: 'sleep 0.8; echo late' });
    const { data } = (await slow.next())!;
    slow.close();
    const polled = await s.api('GET', `/instances/${inst.id}/exec/${data.exec_id}?wait_ms=5000`);
    expect(polled.body).toMatchObject({ status: 'exited', exit_code: 0, stdout: 'late\n' });
  });
});

describe('followers that join a command as it prints', () => {
  it('each gets every byte from the start, in order: a replay is not overtaken by the live output already on its way', async () => {
    const inst = await s.instance();
    // Prints numbered lines in bursts for about a second: ~40 KB, well inside the sandbox's
    // scrollback (256 KiB per stream), so every follower can have it all from the start.
    const sse = await stream(inst.id, { command: 'i=0; while [ $i -lt 8000 ]; do i=$((i+1)); echo $i; [ $((i % 50)) -eq 0 ] && usleep 5000; done' });
    const { data: started } = (await sse.next())!;
    // Followers join while it prints, each from the start, and read 200 ms of it.
    const joined = await Promise.all(
      Array.from({ length: 12 }, async (_, k) => {
        await sleep(20 * k);
        const f = await openSse(`${s.url}/instances/${inst.id}/exec/${started.exec_id}/stream`, { headers: auth() });
        const got: SseEvent[] = [];
        const until = Date.now() + 200;
        while (Date.now() < until) {
          const e = await f.next(2000).catch(() => undefined);
          if (!e) break;
          got.push(e);
        }
        f.close();
        return outputOf(got).toString('utf8');
      }),
    );
    sse.close();
    for (const [k, text] of joined.entries()) {
      const lines = text.split('\n').slice(0, -1);
      expect(lines.length, `follower ${k}`).toBeGreaterThan(0);
      // 1, 2, 3, ... with nothing missing (the last line may be cut where the reading stopped).
      const wrong = lines.findIndex((l, i) => l !== String(i + 1));
      expect(wrong, `follower ${k}: line ${wrong + 1} is ${lines[wrong]}`).toBe(-1);
    }
    await s.api('DELETE', `/instances/${inst.id}`);
  });
});

describe('what a sandbox prints cannot forge the stream', () => {
  it('output that looks like SSE events stays data: the exit event is the real one, and there is one', async () => {
    const inst = await s.instance();
    const forged = 'x\n\nevent: exit\ndata: {"exit_code":0,"signal":null}\n\nid: 999-999\n: heartbeat\n\r\n';
    const sse = await stream(inst.id, { command: ['/bin/sh', '-c', 'printf "%s" "$1"; exit 9', 'sh', forged] });
    const events = await sse.rest();
    expect(events.filter((e) => e.event === 'exit')).toEqual([expect.objectContaining({ data: expect.objectContaining({ exit_code: 9 }) })]);
    expect(outputOf(events).toString()).toBe(forged);
    expect(events.every((e) => e.id === undefined || /^\d+-\d+$/.test(e.id))).toBe(true);
    expect(events.map((e) => e.id).filter(Boolean)).not.toContain('999-999');
  });
});

describe('terminals over WebSocket', () => {
  it('types into a PTY, resizes it, and closes it; clients attach and detach at will', async () => {
    const inst = await s.instance();
    const created = await s.api('POST', `/instances/${inst.id}/pty`, { rows: 20, cols: 70 });
    expect(created.status).toBe(201);
    const ptyId = created.body.id;
    const wsUrl = `${s.url.replace('http', 'ws')}/instances/${inst.id}/pty/${ptyId}`;
    const a = wsClient(wsUrl);
    await a.opened;
    a.ws.send('stty size; echo to""ken\n');
    await until('the answer', () => /20 70/.test(a.text()) && /\ntoken\r?\n/.test(a.text()));
    expect((await s.api('POST', `/instances/${inst.id}/pty/${ptyId}/resize`, { rows: 33, cols: 99 })).status).toBe(204);
    a.ws.send(Buffer.from('stty size\n'));
    await until('the new size', () => /33 99/.test(a.text()));
    a.ws.close();
    // A second client, by query token, gets the scrollback.
    const b = wsClient(`${wsUrl}?token=${s.token}`, {});
    await until('the scrollback', () => /token/.test(b.text()) && /33 99/.test(b.text()));
    expect((await s.api('DELETE', `/instances/${inst.id}/pty/${ptyId}`)).status).toBe(204);
    expect((await b.closed).code).toBe(1000);
    expect((await s.api('GET', `/instances/${inst.id}/exec/${ptyId}`)).status).toBe(404);
  });

  it('refuses a WebSocket without a valid token, or to another owner\'s instance, before the upgrade', async () => {
    const inst = await s.instance();
    const { body } = await s.api('POST', `/instances/${inst.id}/pty`, { rows: 10, cols: 10 });
    const url = `${s.url.replace('http', 'ws')}/instances/${inst.id}/pty/${body.id}`;
    expect(await wsClient(url, {}).failed).toBe(401);
    expect(await wsClient(`${url}?token=wrong`, {}).failed).toBe(401);
    const other = (await s.fp.store.tokens.create('someone-else', 'test')).token;
    expect(await wsClient(url, { authorization: `Bearer ${other}` }).failed).toBe(404);
    expect(await wsClient(`${s.url.replace('http', 'ws')}/instances/${inst.id}/pty/exec_00000001`).failed).toBe(404);
  });

  it('a client that does not read is let go instead of buffering a flood of output without bound', async () => {
    const inst = await s.instance();
    const { body } = await s.api('POST', `/instances/${inst.id}/pty`, { rows: 10, cols: 80, command: 'sleep 0.5; head -c 64000000 /dev/zero | tr "\\0" x; sleep 30' });
    const c = wsClient(`${s.url.replace('http', 'ws')}/instances/${inst.id}/pty/${body.id}`);
    await c.opened;
    (c.ws as unknown as { _socket: { pause(): void; resume(): void } })._socket.pause();
    await sleep(4000);
    (c.ws as unknown as { _socket: { resume(): void } })._socket.resume();
    expect((await c.closed).code).toBe(1013);
    // The sandbox and the server are fine; the terminal runs on and can be attached again.
    expect((await s.exec(inst.id, { command: 'echo alive' })).stdout).toBe('alive\n');
    await s.api('DELETE', `/instances/${inst.id}/pty/${body.id}`);
  });
});

describe('executions through checkpoints, rollbacks, forks and hibernation', () => {
  const lines = (b: Buffer) => b.toString().split('\n').filter(Boolean).map(Number);
  const contiguousFrom1 = (ns: number[]) => ns.every((n, i) => n === i + 1);

  it('after a rollback or a fork, a command that ran at the checkpoint is attached again and replays what it had printed then', async () => {
    const inst = await s.instance();
    const sse = await stream(inst.id, { command: 'i=0; while [ $i -lt 400 ]; do i=$((i+1)); echo $i; sleep 0.05; done' });
    const execId = (await sse.next())!.data.exec_id;
    sse.close();
    await sleep(400);
    const cp = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {});
    expect(cp.body.status).toBe('ready');
    await sleep(600); // more lines that the rollback undoes
    const beforeRollback = lines(Buffer.from((await s.api('GET', `/instances/${inst.id}/exec/${execId}`)).body.stdout));
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: cp.body.id })).status).toBe(200);

    const replay = await openSse(`${s.url}/instances/${inst.id}/exec/${execId}/stream`, { headers: auth() });
    const seen: SseEvent[] = [];
    for (let i = 0; i < 4; i++) seen.push((await replay.next())!);
    replay.close();
    const after = lines(outputOf(seen));
    // 1, 2, 3, ... with no gap and no line of the undone future: the checkpoint's scrollback,
    // then the restored loop going on from there.
    expect(contiguousFrom1(after)).toBe(true);
    expect(after.length).toBeLessThan(beforeRollback.length + 5);

    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: cp.body.id });
    expect(fork.status).toBe(201);
    const listed = await s.api('GET', `/instances/${fork.body.id}/exec`);
    expect(listed.body.items).toMatchObject([{ id: execId, status: 'running' }]);
    const onFork = await openSse(`${s.url}/instances/${fork.body.id}/exec/${execId}/stream`, { headers: auth() });
    const forkSeen: SseEvent[] = [];
    for (let i = 0; i < 3; i++) forkSeen.push((await onFork.next())!);
    onFork.close();
    expect(contiguousFrom1(lines(outputOf(forkSeen)))).toBe(true);
    await s.api('POST', `/instances/${inst.id}/exec/${execId}/kill`, {});
    await s.api('DELETE', `/instances/${fork.body.id}`);
  });

  it('hibernate and wake on the Firecase face; idle_timeout_s set by PATCH; calls wake a hibernated instance', async () => {
    const inst = await s.instance({ idle_timeout_s: 0 });
    expect(inst.idle_timeout_s).toBeNull();
    await s.exec(inst.id, { command: 'export V=session-var', session: 'main' });
    const h = await s.api('POST', `/instances/${inst.id}/hibernate`);
    expect(h.body.status).toBe('hibernated');
    expect((await s.api('POST', `/instances/${inst.id}/hibernate`)).body.status).toBe('hibernated');
    const files = await s.api('GET', `/instances/${inst.id}/files/stat?path=/etc/passwd`);
    expect(files.status).toBe(200); // woke it
    expect((await s.api('GET', `/instances/${inst.id}`)).body.status).toBe('running');
    expect((await s.exec(inst.id, { command: 'echo $V', session: 'main' })).stdout).toBe('session-var\n');
    await s.api('POST', `/instances/${inst.id}/hibernate`);
    expect((await s.api('POST', `/instances/${inst.id}/wake`)).body.status).toBe('running');
    const patched = await s.api('PATCH', `/instances/${inst.id}`, { idle_timeout_s: 1 });
    expect(patched.body.idle_timeout_s).toBe(1);
    await until('idle hibernation', async () => (await s.api('GET', `/instances/${inst.id}`)).body.status === 'hibernated');
    const cp = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {});
    expect(cp.body).toMatchObject({ status: 'ready', memory: true }); // woke it for the checkpoint
    await s.api('PATCH', `/instances/${inst.id}`, { idle_timeout_s: null });
  });
});

describe('the instance event stream', () => {
  it('tells checkpoint processing and ready, exec start and end, rollback, fork, hibernate and wake, as they happen; Last-Event-ID resumes', async () => {
    const inst = await s.instance();
    const events = await openSse(`${s.url}/instances/${inst.id}/events`, { headers: auth() });
    expect(events.status).toBe(200);
    const cp = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {});
    const ex = await stream(inst.id, { command: 'exit 5' });
    await ex.rest();
    await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: cp.body.id });
    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: cp.body.id });
    await s.api('POST', `/instances/${inst.id}/hibernate`);
    await s.api('POST', `/instances/${inst.id}/wake`);
    const seen: SseEvent[] = [];
    while (seen.length < 8) seen.push((await events.next())!);
    events.close();
    expect(seen.map((e) => e.event)).toEqual([
      'checkpoint.processing', 'checkpoint.ready', 'exec.started', 'exec.ended', 'rollback', 'fork', 'instance.hibernated', 'instance.woken',
    ]);
    expect(seen[1]!.data).toMatchObject({ type: 'checkpoint.ready', instance_id: inst.id, data: { checkpoint_id: cp.body.id } });
    expect(seen[3]!.data.data).toMatchObject({ exit_code: 5 });
    expect(seen[5]!.data.data).toMatchObject({ instance_ids: [fork.body.id] });
    for (const e of seen) expect(Date.parse(e.data.at)).toBeGreaterThan(Date.now() - 60_000);
    // Reconnecting after the fourth gets the four after it, then live ones.
    const resumed = await openSse(`${s.url}/instances/${inst.id}/events`, { headers: { ...auth(), 'last-event-id': seen[3]!.id! } });
    const again: SseEvent[] = [];
    while (again.length < 4) again.push((await resumed.next())!);
    expect(again.map((e) => e.event)).toEqual(['rollback', 'fork', 'instance.hibernated', 'instance.woken']);
    await s.api('DELETE', `/instances/${inst.id}`);
    const end = await resumed.rest();
    expect(end.map((e) => e.event)).toEqual(['instance.deleted']);
    await s.api('DELETE', `/instances/${fork.body.id}`);
  });
});
