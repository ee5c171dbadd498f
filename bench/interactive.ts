/**
 * Issue 10: the interactive half. First byte of a streamed command (next to a plain exec's whole
 * round trip), a keystroke's round trip through a terminal's WebSocket (next to a WebSocket echo
 * on the same loopback), hibernate time and the RAM it frees, and wake-to-first-exec (next to an
 * exec on a running sandbox). All measured in the same run.
 */
import { request as httpRequest } from 'node:http';
import { WebSocket, WebSocketServer } from 'ws';
import { benchServer, stats, table, type Stats } from './lib.js';

const N = Number(process.env.BENCH_N ?? 20);
const s = await benchServer();
const auth = { authorization: `Bearer ${s.token}` };

async function instance(body: Record<string, unknown> = {}): Promise<string> {
  const r = await s.api('POST', '/instances', body);
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  return r.body.id;
}

/** ms from sending `POST exec/stream` to the first stdout event. */
function firstByte(id: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const t = performance.now();
    const req = httpRequest(`${s.url}/instances/${id}/exec/stream`, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' } });
    req.on('error', reject);
    req.on('response', (res) => {
      let buf = '';
      let done = false;
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        buf += c;
        if (!done && buf.includes('event: stdout')) {
          done = true;
          resolve(performance.now() - t);
        }
      });
      res.on('end', () => !done && reject(new Error(buf)));
    });
    req.end(JSON.stringify({ command: 'echo x' }));
  });
}

/** Round trips of one byte through a WebSocket that echoes it back. */
async function wsRoundTrips(url: string, headers: Record<string, string>, n: number, settle: (ws: WebSocket) => Promise<void>): Promise<number[]> {
  const ws = new WebSocket(url, { headers });
  await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
  await settle(ws);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    const echoed = new Promise<void>((r) => ws.once('message', () => r()));
    ws.send('x');
    await echoed;
    out.push(performance.now() - t);
  }
  ws.close();
  return out;
}

try {
  const id = await instance();
  await s.api('POST', `/instances/${id}/exec`, { command: 'true' });

  // --- first byte of a streamed command, and a plain exec as the baseline ---
  for (let i = 0; i < 3; i++) await firstByte(id);
  const fb: number[] = [];
  const plain: number[] = [];
  for (let i = 0; i < N; i++) {
    fb.push(await firstByte(id));
    const t = performance.now();
    await s.api('POST', `/instances/${id}/exec`, { command: 'echo x' });
    plain.push(performance.now() - t);
  }

  // --- a keystroke through a terminal (`cat -u` on a PTY in raw mode echoes it once) ---
  const pty = await s.api('POST', `/instances/${id}/pty`, { rows: 24, cols: 80, command: ['/bin/sh', '-c', 'stty raw -echo; exec cat -u'] });
  const ptyTrips = await wsRoundTrips(`${s.url.replace('http', 'ws')}/instances/${id}/pty/${pty.body.id}`, auth, N * 5, async () => {
    await new Promise((r) => setTimeout(r, 200));
  });
  const echo = new WebSocketServer({ host: '127.0.0.1', port: 0 });
  echo.on('connection', (c) => c.on('message', (m) => c.send(m)));
  await new Promise((r) => echo.once('listening', r));
  const port = (echo.address() as { port: number }).port;
  const echoTrips = await wsRoundTrips(`ws://127.0.0.1:${port}`, {}, N * 5, async () => {});
  echo.close();

  // --- hibernate, RAM freed, wake to first exec ---
  const hib: number[] = [];
  const freedIdle: number[] = [];
  const wakeExec: number[] = [];
  const runningExec: number[] = [];
  const idle = await instance();
  await s.api('POST', `/instances/${idle}/exec`, { command: 'true' });
  for (let i = 0; i < N; i++) {
    let t = performance.now();
    await s.api('POST', `/instances/${idle}/exec`, { command: 'true' });
    runningExec.push(performance.now() - t);
    const before = await s.engine.memoryInUse(idle);
    t = performance.now();
    const h = await s.api('POST', `/instances/${idle}/hibernate`);
    if (h.body.status !== 'hibernated') throw new Error(JSON.stringify(h.body));
    hib.push(performance.now() - t);
    freedIdle.push((before - (await s.engine.memoryInUse(idle))) / 2 ** 20);
    t = performance.now();
    const r = await s.api('POST', `/instances/${idle}/exec`, { command: 'true' });
    if (r.status !== 200) throw new Error(JSON.stringify(r.body));
    wakeExec.push(performance.now() - t);
  }
  // A sandbox holding 64 MiB in a shell variable.
  const big = await instance();
  await s.api('POST', `/instances/${big}/processes`, { command: 'x=$(head -c 67108864 /dev/zero | tr "\\0" a); while :; do sleep 100000; done' });
  await new Promise((r) => setTimeout(r, 2500));
  const freedBig: number[] = [];
  const hibBig: number[] = [];
  const wakeBig: number[] = [];
  for (let i = 0; i < Math.max(3, N / 4); i++) {
    const before = await s.engine.memoryInUse(big);
    let t = performance.now();
    await s.api('POST', `/instances/${big}/hibernate`);
    hibBig.push(performance.now() - t);
    freedBig.push((before - (await s.engine.memoryInUse(big))) / 2 ** 20);
    t = performance.now();
    await s.api('POST', `/instances/${big}/exec`, { command: 'true' });
    wakeBig.push(performance.now() - t);
  }

  const row = (name: string, st: Stats, unit = 'ms', target?: string) => ({ name, stats: st, unit, ...(target ? { target } : {}) });
  table('interactive sandboxes (issue 10)', [
    row('exec/stream: first stdout event', stats(fb)),
    row('  baseline: POST /exec, whole answer', stats(plain)),
    row('terminal WebSocket: keystroke echoed', stats(ptyTrips)),
    row('  baseline: loopback WebSocket echo', stats(echoTrips)),
    row('hibernate, idle sandbox', stats(hib)),
    row('  RAM freed', stats(freedIdle), 'MiB'),
    row('wake + first exec, idle sandbox', stats(wakeExec), 'ms', '≤ 40'),
    row('  baseline: exec on a running sandbox', stats(runningExec)),
    row('hibernate, 64 MiB in use', stats(hibBig)),
    row('  RAM freed', stats(freedBig), 'MiB'),
    row('wake + first exec, 64 MiB in use', stats(wakeBig)),
  ]);
} finally {
  await s.close();
}
