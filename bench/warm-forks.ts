/**
 * Issue 25: a fork + its first exec (a rollback + its first exec, a create + its first exec), warm (a standby restored ahead from the checkpoint and held
 * frozen, taken and thawed) next to cold (restored by CRIU on the call), in the same run,
 * interleaved: each round checkpoints a sandbox with a 2 ms ticker (bench/fixtures/ticker.c, the
 * peers bench's workload: it sleeps 2 ms at a time and spawns nothing), forks it once (cold: the
 * first fork of a checkpoint finds no standby), waits for the standby that fork leaves, and forks
 * again (warm). Timed over HTTP from the fork's request to its first exec's answer.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { benchServer, buildTicker, memoryCheckpoint, startTicker, stats, table } from './lib.js';

const N = Number(process.env.BENCH_N ?? 15);
const s = await benchServer({ config: { warmForks: '4' } });
const work = await mkdtemp(join(process.env.FORKPOINT_BENCH_DIR ?? tmpdir(), 'forkpoint-warm-'));
const ticker = await buildTicker(work);

async function exec(id: string, command: string): Promise<string> {
  const r = await s.api('POST', `/instances/${id}/exec`, { command, timeout_ms: 60_000 });
  if (r.status !== 200 || r.body.exit_code !== 0) throw new Error(`${command}: ${JSON.stringify(r.body)}`);
  return r.body.stdout;
}

/** Fork + first exec, in ms; the fork's id and whether a standby was taken. */
async function forkAndExec(source: string, checkpointId: string): Promise<{ ms: number; id: string; warm: boolean }> {
  const standby = s.fp.warm.held().find((h) => h.key === checkpointId)?.id;
  const t = performance.now();
  const f = await s.api('POST', `/instances/${source}/fork`, { checkpoint_id: checkpointId });
  if (f.status !== 201) throw new Error(JSON.stringify(f.body));
  await exec(f.body.id, 'true');
  return { ms: performance.now() - t, id: f.body.id, warm: f.body.id === standby };
}

/** Rollback + first exec, in ms; whether a standby was swapped in (the `rollback` event's `warm`). */
const rollbackWarmth: boolean[] = [];
s.fp.events.tap((e) => e.type === 'rollback' && rollbackWarmth.push(e.data.warm === true));
async function rollbackAndExec(id: string, checkpointId: string): Promise<{ ms: number; warm: boolean }> {
  const t = performance.now();
  const r = await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: checkpointId });
  if (r.status !== 200) throw new Error(JSON.stringify(r.body));
  await exec(id, 'true');
  return { ms: performance.now() - t, warm: rollbackWarmth.at(-1) === true };
}

/** Create + first exec, in ms; whether a standby was taken. */
async function createAndExec(): Promise<{ ms: number; id: string; warm: boolean }> {
  const t = performance.now();
  const c = await s.api('POST', '/instances', {});
  if (c.status !== 201) throw new Error(JSON.stringify(c.body));
  await exec(c.body.id, 'true');
  return { ms: performance.now() - t, id: c.body.id, warm: c.body.warm_fork === true };
}

try {
  const source = (await s.api('POST', '/instances', {})).body.id as string;
  await startTicker(s, source, ticker);
  const cold: number[] = [];
  const warm: number[] = [];
  const unwarm: number[] = [];
  const execOnly: number[] = [];
  for (let i = -1; i < N; i++) {
    // Round -1 warms up (page cache, the restorer pool).
    const ck = await memoryCheckpoint(s, source);
    const first = await forkAndExec(source, ck.id);
    await s.fp.warm.settled();
    // Let the pool's restorers refill, as between forks a user makes.
    await new Promise((r) => setTimeout(r, 200));
    const second = await forkAndExec(source, ck.id);
    await s.fp.warm.settled();
    for (const id of [first.id, second.id]) await s.api('DELETE', `/instances/${id}`);
    const t = performance.now();
    await exec(source, 'true');
    const execMs = performance.now() - t;
    if (i < 0) continue;
    execOnly.push(execMs);
    if (first.warm) throw new Error('the first fork of a checkpoint found a standby');
    cold.push(first.ms);
    (second.warm ? warm : unwarm).push(second.ms);
  }
  if (unwarm.length) console.log(`${unwarm.length} of ${N} second forks found no standby ready (taken cold)`);
  // Rollbacks: the first to a new checkpoint restores (cold); it leaves a standby of that
  // checkpoint, which the second swaps in (warm).
  const rollbackCold: number[] = [];
  const rollbackWarm: number[] = [];
  const rollbackUnwarm: number[] = [];
  for (let i = -1; i < N; i++) {
    const ck = await memoryCheckpoint(s, source);
    // The last round's standby goes first: its removal is not the cold rollback's to pay.
    await s.fp.warm.dropRollbackOf(source);
    await new Promise((r) => setTimeout(r, 200));
    const first = await rollbackAndExec(source, ck.id);
    await s.fp.warm.settled();
    await new Promise((r) => setTimeout(r, 200));
    const second = await rollbackAndExec(source, ck.id);
    await s.fp.warm.settled();
    if (i < 0) continue;
    if (first.warm) throw new Error('the first rollback to a checkpoint found a standby');
    rollbackCold.push(first.ms);
    (second.warm ? rollbackWarm : rollbackUnwarm).push(second.ms);
  }
  if (rollbackUnwarm.length) console.log(`${rollbackUnwarm.length} of ${N} second rollbacks found no standby ready (restored)`);
  // Creates: one that finds the standby the last left (warm), and one right after it, before the
  // next is made (cold).
  const createWarm: number[] = [];
  const createCold: number[] = [];
  for (let i = -1; i < N; i++) {
    await s.fp.warm.settled();
    await new Promise((r) => setTimeout(r, 200));
    const a = await createAndExec();
    const b = await createAndExec();
    await s.fp.warm.settled();
    for (const id of [a.id, b.id]) await s.api('DELETE', `/instances/${id}`);
    if (i < 0) continue;
    if (b.warm) throw new Error('a create right after another found a standby');
    if (a.warm) createWarm.push(a.ms);
    createCold.push(b.ms);
  }
  table('fork + first exec, warm next to cold (same run, interleaved)', [
    { name: 'fork + first exec, warm (standby taken)', stats: stats(warm), target: '≤ 5' },
    { name: '  baseline: fork + first exec, cold (CRIU restore)', stats: stats(cold) },
    { name: '  floor: one exec on a running sandbox', stats: stats(execOnly) },
  ]);
  table('rollback + first exec, warm next to cold (same run, interleaved)', [
    { name: 'rollback + first exec, warm (standby swapped in)', stats: stats(rollbackWarm), target: '≤ 5' },
    { name: '  baseline: rollback + first exec, cold (CRIU restore)', stats: stats(rollbackCold) },
    { name: '  floor: one exec on a running sandbox', stats: stats(execOnly) },
  ]);
  table('create + first exec, warm next to cold (same run, interleaved)', [
    { name: 'create + first exec, warm (standby taken)', stats: stats(createWarm) },
    { name: '  baseline: create + first exec, cold (boot)', stats: stats(createCold) },
  ]);
} finally {
  await s.close();
  await rm(work, { recursive: true, force: true });
}
