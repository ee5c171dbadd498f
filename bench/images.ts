/**
 * Issue 12: a template's instance, up with its server running, against what it replaces: a
 * fork of the same checkpoint (the floor), and a plain create that starts the server and waits
 * for it (what a user does without templates). Also an unchanged Dockerfile rebuild (every step
 * cached) against its first build. Interleaved, in one run.
 */
import { benchServer, stats, table } from './lib.js';

const N = Number(process.env.BENCH_N ?? 15);
const s = await benchServer();
// A server that takes a while to start, as real ones do: Python's, on the Debian image.
const IMAGE = 'debian';
const START = 'mkdir -p /srv && echo up > /srv/index.html && cd /srv && exec python3 -m http.server 8080';
const ASK = 'curl -sf http://127.0.0.1:8080/index.html';

async function ok<T>(p: Promise<{ status: number; body: T }>, want: number): Promise<T> {
  const r = await p;
  if (r.status !== want) throw new Error(`${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

const fromTemplate: number[] = [];
const fork: number[] = [];
const plain: number[] = [];
const firstBuild: number[] = [];
const cachedBuild: number[] = [];
try {
  await ok(s.api('POST', '/templates', { name: 'web', from_image: IMAGE, start_command: START, ready_command: ASK }), 201);
  const src = await ok<{ id: string }>(s.api('POST', '/instances', { image: IMAGE }), 201);
  await ok(s.api('POST', `/instances/${src.id}/processes`, { command: START }), 201);
  for (let i = 0; i < 100; i++) {
    const r = await ok<{ exit_code: number }>(s.api('POST', `/instances/${src.id}/exec`, { command: ASK }), 200);
    if (r.exit_code === 0) break;
  }
  const cp = await ok<{ id: string }>(s.api('POST', `/instances/${src.id}/checkpoints?wait=true`, {}), 200);

  const answered = async (id: string) => {
    const r = await ok<{ exit_code: number; stdout: string }>(s.api('POST', `/instances/${id}/exec`, { command: ASK }), 200);
    return r.exit_code === 0 && r.stdout === 'up\n';
  };
  for (let i = 0; i <= N; i++) {
    let t = performance.now();
    const a = await ok<{ id: string }>(s.api('POST', '/instances', { template: 'web' }), 201);
    if (!(await answered(a.id))) throw new Error('the template\'s server did not answer');
    const ta = performance.now() - t;

    t = performance.now();
    const f = await ok<{ id: string }>(s.api('POST', `/instances/${src.id}/fork`, { checkpoint_id: cp.id }), 201);
    if (!(await answered(f.id))) throw new Error('the fork\'s server did not answer');
    const tf = performance.now() - t;

    t = performance.now();
    const p = await ok<{ id: string }>(s.api('POST', '/instances', { image: IMAGE }), 201);
    await ok(s.api('POST', `/instances/${p.id}/processes`, { command: START }), 201);
    let up = false;
    for (let k = 0; k < 1000 && !up; k++) up = await answered(p.id);
    if (!up) throw new Error('the plain instance\'s server did not answer');
    const tp = performance.now() - t;

    const dockerfile = `FROM default\nRUN echo ${i} > /round\nRUN mkdir -p /app && echo built > /app/x\nENV A=${i}\nWORKDIR /app\n`;
    t = performance.now();
    await ok(s.api('POST', '/images', { name: `round-${i}`, dockerfile }), 201);
    const tb = performance.now() - t;
    t = performance.now();
    await ok(s.api('POST', '/images', { name: `round-${i}`, dockerfile }), 201);
    const tc = performance.now() - t;

    for (const id of [a.id, f.id, p.id]) await s.api('DELETE', `/instances/${id}`);
    await s.api('DELETE', `/images/round-${i}`);
    if (i === 0) continue; // warm-up
    fromTemplate.push(ta);
    fork.push(tf);
    plain.push(tp);
    firstBuild.push(tb);
    cachedBuild.push(tc);
  }
  table('templates and builds (issue 12): ms until a Python HTTP server inside answers (Debian image); builds of a 4-step Dockerfile', [
    { name: 'create from a template + first exec answered', stats: stats(fromTemplate), target: '≈ fork' },
    { name: '  baseline: fork of the same checkpoint + exec', stats: stats(fork) },
    { name: '  baseline: create, start the server, poll until up', stats: stats(plain) },
    { name: 'rebuild, every step cached', stats: stats(cachedBuild), target: 'near-instant' },
    { name: '  baseline: the first build', stats: stats(firstBuild) },
  ]);
  await s.api('DELETE', '/templates/web');
  await s.api('DELETE', `/instances/${src.id}`);
} finally {
  await s.close();
}
