/**
 * Issues 8 and 19: what the confinement costs. Checkpoint pause, rollback and fork of an idle
 * sandbox as every sandbox runs (a user namespace of its own, the /proc masks, the read-only
 * /proc paths and the seccomp filter), next to the same confinement on the host's ids
 * (`user_namespace: false`, as before issue 19) and to sandboxes booted with neither, measured
 * in the same run and interleaved, so that the machine's noise falls on all alike.
 */
import { benchServer, checkpointCycle, memoryCheckpoint, stats, table, timedRollbackAndFork, type BenchServer, type CycleSamples, type Stats } from './lib.js';

// 30 rounds: the p50 of 15 moved by ±10 % from run to run here, the size of the target.
const N = Number(process.env.BENCH_N ?? 30);

const confined = await benchServer();
const unconfined = await benchServer({ unconfined: true });
// As `forkpoint serve` runs by default: warm standbys on, so that a rollback or a fork that
// finds its standby swaps it in or takes it (the user namespace's restore work done before).
const warmServer = await benchServer({ config: { warmForks: '4' } });

async function instance(s: BenchServer, userNamespace: boolean): Promise<string> {
  const r = await s.api('POST', '/instances', { user_namespace: userNamespace });
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  await s.api('POST', `/instances/${r.body.id}/exec`, { command: 'true' });
  return r.body.id;
}

type Samples = CycleSamples;

const round = checkpointCycle;

/** A checkpoint, then a rollback and a fork of it that find their standbys (each made by a
 * first, untimed rollback and fork of the checkpoint); the forks deleted after. */
async function warmRound(s: BenchServer, id: string, out: Pick<Samples, 'rollback' | 'fork'>): Promise<void> {
  const ck = await memoryCheckpoint(s, id);
  const first = await s.api('POST', `/instances/${id}/fork`, { checkpoint_id: ck.id });
  if ((await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: ck.id })).status !== 200) throw new Error('rollback');
  await s.fp.warm.settled();
  await new Promise((r) => setTimeout(r, 200));
  const warmBefore = s.fp.warm.held().length;
  const fork = await timedRollbackAndFork(s, id, ck.id, out);
  if (!fork.warm || s.fp.warm.held().length !== warmBefore - 2) throw new Error('a standby was not taken');
  await s.fp.warm.settled();
  for (const f of [first.body.id, fork.id]) await s.api('DELETE', `/instances/${f}`);
}

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
  const wa = await instance(warmServer, true);
  const wh = await instance(warmServer, false);
  const warmUserns: Pick<Samples, 'rollback' | 'fork'> = { rollback: [], fork: [] };
  const warmHost: Pick<Samples, 'rollback' | 'fork'> = { rollback: [], fork: [] };
  await warmRound(warmServer, wa, { rollback: [], fork: [] });
  await warmRound(warmServer, wh, { rollback: [], fork: [] });
  for (let i = 0; i < N; i++) {
    await warmRound(warmServer, wa, warmUserns);
    await warmRound(warmServer, wh, warmHost);
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
  table('the same with warm standbys (the server\'s default): a rollback and a fork that find their standby; idle sandbox', [
    row('rollback, warm, user namespace + confined', stats(warmUserns.rollback), '≤ 110 % of next'),
    row('  same, host ids (user_namespace: false)', stats(warmHost.rollback)),
    row('fork 1, warm, user namespace + confined', stats(warmUserns.fork), '≤ 110 % of next'),
    row('  same, host ids (user_namespace: false)', stats(warmHost.fork)),
  ]);
} finally {
  await confined.close();
  await unconfined.close();
  await warmServer.close();
}
