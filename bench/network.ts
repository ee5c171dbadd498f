/**
 * Issue 11: what networking costs. Create + first exec, checkpoint pause, rollback and fork of an
 * idle sandbox with its network link, firewall entry and resolver, next to the same on a server
 * with networking off (loopback only), in the same run and interleaved.
 */
import { benchServer, checkpointCycle, stats, table, type BenchServer, type Stats } from './lib.js';

const N = Number(process.env.BENCH_N ?? 15);
const on = await benchServer({ networking: 'on' });
const off = await benchServer({ networking: 'off' });

interface Samples {
  create: number[];
  pause: number[];
  rollback: number[];
  fork: number[];
}

async function round(s: BenchServer, out: Samples): Promise<void> {
  let t = performance.now();
  const r = await s.api('POST', '/instances', {});
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  await s.api('POST', `/instances/${r.body.id}/exec`, { command: 'true' });
  out.create.push(performance.now() - t);
  const id = r.body.id;
  await checkpointCycle(s, id, out);
  await s.api('DELETE', `/instances/${id}`);
}

const empty = (): Samples => ({ create: [], pause: [], rollback: [], fork: [] });
try {
  await round(on, empty());
  await round(off, empty());
  const a = empty();
  const b = empty();
  for (let i = 0; i < N; i++) {
    await round(on, a);
    await round(off, b);
  }
  const row = (name: string, s: Stats, target?: string) => ({ name, stats: s, ...(target ? { target } : {}) });
  table('networking: a routed veth, the firewall, the resolver (issue 11), idle sandbox', [
    row('create + first exec, network on', stats(a.create)),
    row('  baseline: networking off', stats(b.create)),
    row('checkpoint pause, network on', stats(a.pause), '≤ 60'),
    row('  baseline: networking off', stats(b.pause)),
    row('rollback, network on', stats(a.rollback), '≤ 40'),
    row('  baseline: networking off', stats(b.rollback)),
    row('fork 1, network on', stats(a.fork), '≤ 40'),
    row('  baseline: networking off', stats(b.fork)),
  ]);
} finally {
  await on.close();
  await off.close();
}
