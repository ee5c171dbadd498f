/**
 * Issue 4: checkpoint pause and time to ready (1 MB and 1 GB of files in the upper), rollback,
 * fork (1 and 10 at once), 1 GiB of dirty memory, storage after 100 checkpoints. Each next to
 * a baseline measured in the same run: the raw CRIU + mount steps alone, and a full copy of
 * the upper.
 */
import { mkdir, readFile, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';
import { launchUnderShim } from '../src/engine/launcher.js';
import { attempt, benchServer, sample, stats, table, time, type BenchServer, type Failed, type Stats } from './lib.js';

const N = Number(process.env.BENCH_N ?? 10);
const LARGE_MB = Number(process.env.BENCH_LARGE_MB ?? 1024);
const s = await benchServer();
const engine = s.engine;
const layout = engine.layout;
const rows: { name: string; stats: Stats | Failed; unit?: string; target?: string }[] = [];

async function instance(body: Record<string, unknown> = {}): Promise<string> {
  const r = await s.api('POST', '/instances', body);
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  return r.body.id;
}
const exec = (id: string, command: string, timeout_ms = 600_000) => s.api('POST', `/instances/${id}/exec`, { command, timeout_ms });
async function checkpoint(id: string, body: Record<string, unknown> = {}): Promise<any> {
  const t = performance.now();
  const r = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, body);
  if (r.body.status !== 'ready') throw new Error(JSON.stringify(r.body));
  return { ...r.body, readyMs: performance.now() - t };
}

/** The raw steps by hand on a running sandbox: criu dump, umount, rename, mount, criu restore.
 * On a server without networking: CRIU run by hand from the host's netns cannot dump a sandbox's
 * link (its peer is the host's: "Unknown peer net namespace"); the engine's own CRIU dumps from
 * inside the sandbox's netns and makes the link afresh at restore, which no hand step does. */
async function rawCycle(srv: BenchServer, id: string): Promise<number> {
  const { engine, fp } = srv;
  const layout = engine.layout;
  const sb = engine.sandbox(id)!;
  await sb.close();
  const rec = (await fp.store.instances.get(id))!;
  const images = join(layout.root, 'raw-images', String(Math.random()).slice(2));
  await mkdir(images, { recursive: true });
  const t = performance.now();
  await execa(engine.criu.path, ['dump', '-t', String(sb.pid), '-D', images, '--network-lock', 'skip', '--manage-cgroups=ignore', '-o', 'dump.log']);
  while (await execa('umount', [layout.merged(id)], { reject: false }).then((r) => r.exitCode !== 0)) await new Promise((r) => setTimeout(r, 1));
  const layer = `raw_${Math.random().toString(36).slice(2)}`;
  await rename(layout.upper(id), layout.layer(layer));
  await mkdir(layout.upper(id));
  await rm(layout.work(id), { recursive: true });
  await mkdir(layout.work(id));
  const lowers = [layout.relative(layout.layer(layer)), ...rec.layers.map((l) => layout.relative(layout.layer(l))), layout.relative(layout.image(rec.image)), layout.relative(layout.agentLayer(rec.agentLayer))];
  await execa('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowers.join(':')},upperdir=${layout.relative(layout.upper(id))},workdir=${layout.relative(layout.work(id))}`, layout.merged(id)], { cwd: layout.root });
  const run = layout.run(id);
  await rm(join(run, 'pid'), { force: true });
  await mkdir(join(run, 'criu'), { recursive: true });
  const launched = await launchUnderShim({
    agentPath: fp.config.agentPath,
    command: [fp.config.agentPath, 'criu-run', '--cache', fp.config.criuCacheDir, '--', engine.criu.path, 'restore', '-d', '-D', images, '-W', join(run, 'criu'),
      '-o', 'restore.log', '--root', layout.merged(id), '--pidfile', join(run, 'pid'), '--manage-cgroups=ignore'],
    // In the sandbox's own groups, as the engine restores it: CRIU puts each task back in the
    // groups the image names, which a dump's end removed.
    pidfile: join(run, 'pid'), statusFile: join(run, 'status'), logFile: join(run, 'shim.log'), cgroupProcs: await engine.cgroups.create(id, rec.limits), failure: 'RESTORE_FAILED',
  }).catch(async (err: unknown) => {
    // CRIU says why in its own log: its first error line is the row's reason (what follows it
    // is the rest of CRIU going down, cgroupd's lost socket among it).
    const log = await readFile(join(run, 'criu', 'restore.log'), 'utf8').catch(() => '');
    const why = log.split('\n').find((l) => l.includes('Error') && !l.includes('RLIMIT_NOFILE')); // that one is harmless here
    throw new Error(`criu restore: ${why ?? (err as Error).message}`);
  });
  const ms = performance.now() - t;
  sb.pid = launched.pid;
  sb.startTime = launched.startTime;
  await sb.connect();
  await fp.store.instances.update(id, { layers: [layer, ...rec.layers], pid: launched.pid, pidStart: launched.startTime });
  await fp.store.layers.add(layer);
  await fp.store.layers.setRefs(`instance:${id}`, [layer, ...rec.layers]);
  return ms;
}

// --- pause and time to ready, small and large uppers ---
const small = await instance();
await exec(small, 'true');
const smallRuns = [];
for (let i = 0; i < N; i++) {
  await exec(small, `head -c 1048576 /dev/urandom > /root/f${i}`);
  smallRuns.push(await checkpoint(small, { memory: true }));
}
// By hand on its own sandbox: a failed hand-made cycle leaves that sandbox unusable, not the bench.
const rawSmall = await attempt(async () => {
  const bare = await benchServer({ networking: 'off' });
  try {
    const r = await bare.api('POST', '/instances', { user_namespace: false });
    if (r.status !== 201) throw new Error(JSON.stringify(r.body));
    return await sample(N, async () => {
      await bare.api('POST', `/instances/${r.body.id}/exec`, { command: `head -c 1048576 /dev/urandom > /root/raw${Math.random()}` });
      return rawCycle(bare, r.body.id);
    });
  } finally {
    await bare.close();
  }
});
rows.push({ name: 'checkpoint pause, 1 MB in upper', stats: stats(smallRuns.map((r) => r.pause_ms)), target: '≤ 60' });
rows.push({ name: '  baseline: raw criu+mount steps, 1 MB (host ids, no network)', stats: rawSmall });
rows.push({ name: 'checkpoint request → ready, 1 MB', stats: stats(smallRuns.map((r) => r.readyMs)) });

// A sandbox with a live shell session running a loop: four processes for CRIU, not one.
const busy = await instance();
await s.api('POST', `/instances/${busy}/exec`, { session: 'main', command: 'cd /tmp; (while true; do i=$((i+1)); echo $i > /tmp/c; sleep 0.05; done) &' });
const busyRuns: { id: string; pause_ms: number }[] = [];
for (let i = 0; i < N; i++) busyRuns.push(await checkpoint(busy, { memory: true }));
const busyRollback = await sample(N, async () => {
  const t = performance.now();
  const r = await s.api('POST', `/instances/${busy}/rollback`, { checkpoint_id: busyRuns[0].id });
  if (r.status !== 200) throw new Error(JSON.stringify(r.body));
  return performance.now() - t;
});
const busyFork = await sample(N, async () => {
  const t = performance.now();
  const r = await s.api('POST', `/instances/${busy}/fork`, { checkpoint_id: busyRuns[0].id });
  const ms = performance.now() - t;
  await s.api('DELETE', `/instances/${r.body.id}`);
  return ms;
});
rows.push({ name: 'checkpoint pause, shell session + loop running', stats: stats(busyRuns.map((r) => r.pause_ms)), target: '≤ 60' });
rows.push({ name: 'rollback, shell session + loop running', stats: busyRollback, target: '≤ 40' });
rows.push({ name: 'fork 1, shell session + loop running', stats: busyFork, target: '≤ 40' });
await s.api('DELETE', `/instances/${busy}`);

const large = await instance();
const largeN = Math.max(2, Math.min(N, 3));
const largeRuns = [];
const copyLarge: number[] = [];
for (let i = 0; i < largeN; i++) {
  await exec(large, `head -c ${LARGE_MB * 1048576} /dev/urandom > /root/big${i}`);
  // Straight after the write, with its data still dirty in the page cache: the honest case.
  const ck = await checkpoint(large, { memory: true });
  largeRuns.push(ck);
  const frozen = layout.layer((await s.fp.store.checkpoints.get(ck.id))!.layers[0]!);
  const dest = join(layout.root, 'copy-baseline');
  copyLarge.push(await time(() => execa('cp', ['-a', frozen, dest])));
  await rm(dest, { recursive: true, force: true });
}
rows.push({ name: `checkpoint pause, ${LARGE_MB} MB in upper`, stats: stats(largeRuns.map((r) => r.pause_ms)), target: 'not growing' });
rows.push({ name: `checkpoint request → ready, ${LARGE_MB} MB`, stats: stats(largeRuns.map((r) => r.readyMs)) });
rows.push({ name: `  baseline: full copy of the upper (cp -a), ${LARGE_MB} MB`, stats: stats(copyLarge) });
await s.api('DELETE', `/instances/${large}`);

// --- rollback ---
const rb = await instance();
await exec(rb, 'echo base > /root/f');
const rbCk = await checkpoint(rb);
const rollback = await sample(N, async () => {
  await exec(rb, 'echo changed > /root/f');
  const t = performance.now();
  const r = await s.api('POST', `/instances/${rb}/rollback`, { checkpoint_id: rbCk.id });
  if (r.status !== 200) throw new Error(JSON.stringify(r.body));
  return performance.now() - t;
});
const rollbackFirst = await sample(N, async () => {
  const t = performance.now();
  await s.api('POST', `/instances/${rb}/rollback`, { checkpoint_id: rbCk.id });
  await exec(rb, 'cat /root/f');
  return performance.now() - t;
});
rows.push({ name: 'rollback (memory checkpoint)', stats: rollback, target: '≤ 40' });
rows.push({ name: 'rollback + first exec', stats: rollbackFirst });

// --- fork ---
const forkOne = await sample(N, async () => {
  const t = performance.now();
  const r = await s.api('POST', `/instances/${rb}/fork`, { checkpoint_id: rbCk.id });
  const ms = performance.now() - t;
  await s.api('DELETE', `/instances/${r.body.id}`);
  return ms;
});
const forkTen = await sample(Math.max(3, Math.floor(N / 2)), async () => {
  const t = performance.now();
  const r = await s.api('POST', `/instances/${rb}/fork`, { checkpoint_id: rbCk.id, count: 10 });
  const ms = performance.now() - t;
  await Promise.all(r.body.instances.map((i: { id: string }) => s.api('DELETE', `/instances/${i.id}`)));
  return ms;
});
const bootOne = await sample(N, async () => {
  const t = performance.now();
  const id = await instance();
  const ms = performance.now() - t;
  await s.api('DELETE', `/instances/${id}`);
  return ms;
});
rows.push({ name: 'fork 1 (memory checkpoint)', stats: forkOne, target: '≤ 40' });
rows.push({ name: 'fork 10 at once (wall)', stats: forkTen });
rows.push({ name: '  baseline: create a fresh instance', stats: bootOne });

// --- 1 GiB of dirty memory ---
const mem = await instance({ limits: { memory_mb: 4096 } });
await s.api('POST', `/instances/${mem}/processes`, {
  command: `awk 'BEGIN { s = sprintf("%1073741824s", ""); print "filled" > "/tmp/filled"; close("/tmp/filled"); system("sleep 100000") }'`,
});
for (;;) {
  const r = await exec(mem, 'cat /tmp/filled 2>/dev/null');
  if (r.body.stdout === 'filled\n') break;
  await new Promise((res) => setTimeout(res, 500));
}
// A small working set beside the gigabyte: 8 MiB rewritten every 100 ms.
await s.api('POST', `/instances/${mem}/processes`, { command: `awk 'BEGIN { for (;;) { s = sprintf("%8388608s", i++); system("sleep 0.1") } }'` });
// The first checkpoint copies all of it; each after it, of the same sandbox left running, only
// the pages written since the one before (incremental, when /healthz says so).
const incrementalBefore = engine.incrementalDumpCount;
const timedCheckpoint = async () => {
  const t = performance.now();
  const ck = await checkpoint(mem, { memory: true });
  return { ...ck, ready_ms: performance.now() - t };
};
const full = [await timedCheckpoint()];
const later = [];
for (let i = 0; i < 4; i++) {
  await new Promise((res) => setTimeout(res, 300));
  later.push(await timedCheckpoint());
}
const incremental = engine.incrementalDumpCount - incrementalBefore;
rows.push({ name: `checkpoint pause, 1 GiB written once + small working set (${incremental} of ${later.length} incremental)`, stats: stats(later.map((r) => r.pause_ms)), target: '≤ 100' });
rows.push({ name: '  checkpoint request → ready (image made whole)', stats: stats(later.map((r) => r.ready_ms)) });
rows.push({ name: '  baseline: first checkpoint pause (all of it copied)', stats: stats(full.map((r) => r.pause_ms)) });
rows.push({ name: '  baseline: first checkpoint request → ready', stats: stats(full.map((r) => r.ready_ms)) });
rows.push({ name: '  memory image size', stats: stats([...full, ...later].map((r) => r.memory_bytes / 1048576)), unit: 'MiB' });
await s.api('DELETE', `/instances/${mem}`);

// --- storage after 100 checkpoints of 1 MB each ---
const st = await instance({ max_checkpoints: 1000 });
const before = await engine.diskUsage(layout.root);
let memoryImages = 0;
for (let i = 0; i < 100; i++) {
  await exec(st, `head -c 1048576 /dev/urandom > /root/c${i}`);
  memoryImages += (await checkpoint(st, { memory: true })).memory_bytes;
}
const grown = (await engine.diskUsage(layout.root)) - before;
const own = (await s.fp.store.instances.get(st))!;
let ownBytes = 0;
for (const l of own.layers) ownBytes += await engine.diskUsage(layout.layer(l));
for (const c of await s.fp.store.checkpoints.forInstance(st)) ownBytes += await engine.diskUsage(layout.checkpoint(c.id));
const changed = 100 * 1048576;
const fullCopies = Array.from({ length: 100 }, (_, i) => (i + 1) * 1048576).reduce((a, b) => a + b, 0);
const mib = (n: number) => `${(n / 1048576).toFixed(1)} MiB`;
console.log(`\nstorage after 100 checkpoints of a 1 MB change each (memory checkpoints):`);
console.log(`  changed bytes ${mib(changed)} + memory images ${mib(memoryImages)} = ${mib(changed + memoryImages)}`);
console.log(`  the instance's layers + checkpoint images: ${mib(ownBytes)} (ratio ${(ownBytes / (changed + memoryImages)).toFixed(3)}, target ≤ 1.2)`);
console.log(`  data directory growth: ${mib(grown)} (ratio ${(grown / (changed + memoryImages)).toFixed(3)}; includes the store, logs and the trash still being emptied)`);
console.log(`  baseline, a full copy of the upper per checkpoint: ${mib(fullCopies)}`);

table('checkpoint, rollback, fork (issue 4)', rows);
await s.close();
