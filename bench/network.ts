/**
 * Issue 11: what networking costs. Create + first exec, checkpoint pause, rollback and fork of an
 * idle sandbox with its network link, firewall entry and resolver, the DELETE of that fork and a
 * fork asked right after it (issue 25: a deleted sandbox's firewall entry goes in a quiet moment),
 * next to the same on a server with networking off (loopback only), in the same run and
 * interleaved.
 */
import { benchServer, memoryCheckpoint, stats, table, timedRollbackAndFork, type BenchServer, type Stats } from './lib.js';

const N = Number(process.env.BENCH_N ?? 15);
const on = await benchServer({ networking: 'on' });
const off = await benchServer({ networking: 'off' });

interface Samples {
  create: number[];
  pause: number[];
  rollback: number[];
  fork: number[];
  delete: number[];
  forkAfterDelete: number[];
}

async function timed<T>(into: number[], fn: () => Promise<{ status: number; body: T }>, status: number): Promise<T> {
  const t = performance.now();
  const r = await fn();
  into.push(performance.now() - t);
  if (r.status !== status) throw new Error(JSON.stringify(r.body));
  return r.body;
}

async function round(s: BenchServer, out: Samples): Promise<void> {
  let t = performance.now();
  const r = await s.api('POST', '/instances', {});
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  await s.api('POST', `/instances/${r.body.id}/exec`, { command: 'true' });
  out.create.push(performance.now() - t);
  const id = r.body.id;
  const ck = await memoryCheckpoint(s, id);
  out.pause.push(ck.pause_ms);
  const fork = await timedRollbackAndFork(s, id, ck.id, out);
  await timed(out.delete, () => s.api('DELETE', `/instances/${fork.id}`), 204);
  const next = await timed<{ id: string }>(out.forkAfterDelete, () => s.api('POST', `/instances/${id}/fork`, { checkpoint_id: ck.id }), 201);
  await s.api('DELETE', `/instances/${next.id}`);
  await s.api('DELETE', `/instances/${id}`);
}

const empty = (): Samples => ({ create: [], pause: [], rollback: [], fork: [], delete: [], forkAfterDelete: [] });
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
    row('DELETE of that fork, network on', stats(a.delete)),
    row('  baseline: networking off', stats(b.delete)),
    row('fork asked right after the DELETE, network on', stats(a.forkAfterDelete)),
    row('  baseline: networking off', stats(b.forkAfterDelete)),
  ]);
} finally {
  await on.close();
  await off.close();
}
