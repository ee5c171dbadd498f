/**
 * Issues 8 and 19: what the confinement costs. Checkpoint pause, rollback and fork of an idle
 * sandbox as every sandbox runs (a user namespace of its own, the /proc masks, the read-only
 * /proc paths and the seccomp filter), next to the same confinement on the host's ids
 * (`user_namespace: false`, as before issue 19) and to sandboxes booted with neither, measured
 * in the same run and interleaved, so that the machine's noise falls on all alike.
 */
import { benchServer, checkpointCycle, stats, table, type BenchServer, type CycleSamples, type Stats } from './lib.js';

const N = Number(process.env.BENCH_N ?? 15);

const confined = await benchServer();
const unconfined = await benchServer({ unconfined: true });

async function instance(s: BenchServer, userNamespace: boolean): Promise<string> {
  const r = await s.api('POST', '/instances', { user_namespace: userNamespace });
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  await s.api('POST', `/instances/${r.body.id}/exec`, { command: 'true' });
  return r.body.id;
}

type Samples = CycleSamples;

const round = checkpointCycle;

try {
  const a = await instance(confined, true);
  const h = await instance(confined, false);
  const b = await instance(unconfined, false);
  const userns: Samples = { pause: [], rollback: [], fork: [] };
  const on: Samples = { pause: [], rollback: [], fork: [] };
  const off: Samples = { pause: [], rollback: [], fork: [] };
  // Warm-up: page cache, JIT, the restorer pools.
  await round(confined, a, { pause: [], rollback: [], fork: [] });
  await round(confined, h, { pause: [], rollback: [], fork: [] });
  await round(unconfined, b, { pause: [], rollback: [], fork: [] });
  for (let i = 0; i < N; i++) {
    await round(confined, a, userns);
    await round(confined, h, on);
    await round(unconfined, b, off);
  }
  const row = (name: string, s: Stats, target?: string) => ({ name, stats: s, ...(target ? { target } : {}) });
  table('confinement: user namespace (issue 19); masked /proc, read-only /proc/sys, seccomp filter (issue 8); idle sandbox', [
    row('checkpoint pause, user namespace + confined', stats(userns.pause), '≤ 110 % of next'),
    row('  same, host ids (user_namespace: false)', stats(on.pause), '≤ 60'),
    row('  baseline: host ids, unconfined', stats(off.pause)),
    row('rollback, user namespace + confined', stats(userns.rollback), '≤ 110 % of next'),
    row('  same, host ids (user_namespace: false)', stats(on.rollback), '≤ 40'),
    row('  baseline: host ids, unconfined', stats(off.rollback)),
    row('fork 1, user namespace + confined', stats(userns.fork), '≤ 110 % of next'),
    row('  same, host ids (user_namespace: false)', stats(on.fork), '≤ 40'),
    row('  baseline: host ids, unconfined', stats(off.fork)),
  ]);
} finally {
  await confined.close();
  await unconfined.close();
}
