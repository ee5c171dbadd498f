/**
 * Issue 3: create → first exec, and exec round trip; through HTTP, next to the same
 * operations done directly on the engine in the same run (the baseline).
 */
import { execOnce } from '../src/core/process/exec-once.js';
import { benchServer, sample, table } from './lib.js';

const N = Number(process.env.BENCH_N ?? 30);
const s = await benchServer();
const engine = s.engine;
const spec = (id: string) => ({
  id,
  hostname: id.replace('_', '-'),
  image: 'default',
  layers: [],
  baseLayer: false,
  agentLayer: engine.currentAgentLayer,
  limits: { memoryMb: 512, pids: 256, cpuPercent: 100 },
  diskMb: null,
  network: null, // the baseline: no network link
  uidBase: null,
  volumes: [],
  ownMounts: [],
});
const echo = { argv: ['/bin/echo', 'hi'], env: ['PATH=/bin'], cwd: '/', timeoutMs: 5000, maxOutputBytes: 1 << 20, spillDir: engine.layout.spill };

// Warm-up: page cache, JIT, first cgroup directories.
for (let i = 0; i < 3; i++) {
  const r = await s.api('POST', '/instances', {});
  await s.api('POST', `/instances/${r.body.id}/exec`, { command: ['/bin/true'] });
  await s.api('DELETE', `/instances/${r.body.id}`);
}

let k = 0;
const engineCreate = await sample(N, async () => {
  const id = `bench_${k++}`;
  const t = performance.now();
  const sb = await engine.boot(spec(id), { freshUpper: true });
  await execOnce(sb, echo);
  const ms = performance.now() - t;
  await engine.destroy(id);
  return ms;
});
const httpCreate = await sample(N, async () => {
  const t = performance.now();
  const r = await s.api('POST', '/instances', {});
  await s.api('POST', `/instances/${r.body.id}/exec`, { command: ['/bin/echo', 'hi'] });
  const ms = performance.now() - t;
  await s.api('DELETE', `/instances/${r.body.id}`);
  return ms;
});

const inst = (await s.api('POST', '/instances', {})).body;
const sb = engine.sandbox(inst.id)!;
const engineExec = await sample(N * 10, async () => void (await execOnce(sb, echo)));
const httpExec = await sample(N * 10, async () => void (await s.api('POST', `/instances/${inst.id}/exec`, { command: ['/bin/echo', 'hi'] })));
await s.api('POST', `/instances/${inst.id}/exec`, { command: 'true', session: 'main' });
const httpSession = await sample(N * 10, async () => void (await s.api('POST', `/instances/${inst.id}/exec`, { command: 'echo hi', session: 'main' })));

table('create → first exec, and exec round trip (issue 3)', [
  { name: 'engine: boot + first exec (baseline)', stats: engineCreate },
  { name: 'HTTP: POST /instances + first exec', stats: httpCreate, target: '≤ 50' },
  { name: 'engine: exec round trip (baseline)', stats: engineExec },
  { name: 'HTTP: exec round trip', stats: httpExec, target: '≤ 3 over engine' },
  { name: 'HTTP: exec in a shell session', stats: httpSession },
]);
console.log(`\nHTTP exec over engine: p50 +${(httpExec.p50 - engineExec.p50).toFixed(2)} ms, p95 +${(httpExec.p95 - engineExec.p95).toFixed(2)} ms`);
await s.close();
