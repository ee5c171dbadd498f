/**
 * Issue 25: 100 forks of one memory checkpoint, each with a first exec, wall clock from the first
 * fork request to the last exec's answer (two requests, `count` being at most 64), next to
 * baselines in the same run: one fork + first exec, and 100 creates + first exec. Also what the
 * forks cost: the host's CPU time used (all processes, from /proc/stat) per fork, and the memory
 * the 100 forks hold (the sum of their memory cgroups' usage, and the host's MemAvailable drop)
 * next to one sandbox's. The source runs a sleeping process (a ticker in each of 100 forks would
 * be the forks' own load, not the forking's). BENCH_FORKS sets the count; BENCH_PROFILE=FILE
 * records the host with `perf` during the first round's forks (`perf report -i FILE --sort comm`).
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { benchServer, memoryCheckpoint, stats, table } from './lib.js';

const N = Number(process.env.BENCH_N ?? 3);
const FORKS = Number(process.env.BENCH_FORKS ?? 100);
const PROFILE = process.env.BENCH_PROFILE;
const s = await benchServer();

async function exec(id: string, command: string): Promise<string> {
  const r = await s.api('POST', `/instances/${id}/exec`, { command, timeout_ms: 60_000 });
  if (r.status !== 200 || r.body.exit_code !== 0) throw new Error(`${command}: ${JSON.stringify(r.body)}`);
  return r.body.stdout;
}

/** The host's CPU time used so far, all CPUs, in ms (USER_HZ is 100 on Linux): user, nice,
 * system, irq and softirq; not idle, I/O wait, nor the time the hypervisor stole. */
function cpuBusyMs(): number {
  const [user, nice, system, , , irq, softirq] = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  return (user! + nice! + system! + irq! + softirq!) * 10;
}
const memAvailableMiB = () => Number(/MemAvailable:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))![1]) / 1024;

/** The memory an instance's memory cgroup charges, in MiB (its usage: pages and kernel memory). */
const memoryMiB = async (id: string) => (await s.engine.usage(id)).memoryBytes / 2 ** 20;

const source = (await s.api('POST', '/instances', { image: 'default' })).body.id as string;
await s.api('POST', `/instances/${source}/processes`, { command: 'sleep 1000000' });
await exec(source, 'true');
const ck = await memoryCheckpoint(s, source);

/** `total` forks of the checkpoint (at most 64 a request, the requests at once), a first exec on each. */
async function forkMany(total: number): Promise<string[]> {
  const counts: number[] = [];
  for (let left = total; left > 0; left -= 64) counts.push(Math.min(64, left));
  const answers = await Promise.all(counts.map((count) => s.api('POST', `/instances/${source}/fork`, { checkpoint_id: ck.id, count })));
  const ids = answers.flatMap((a) => {
    if (a.status !== 201) throw new Error(`fork: ${a.status} ${JSON.stringify(a.body)}`);
    return (a.body.instances ?? [a.body]).map((i: { id: string }) => i.id);
  });
  await Promise.all(ids.map((id: string) => exec(id, 'true')));
  return ids;
}

async function createMany(total: number): Promise<string[]> {
  const ids = await Promise.all(Array.from({ length: total }, async () => {
    const r = await s.api('POST', '/instances', { image: 'default' });
    if (r.status !== 201) throw new Error(`create: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body.id as string;
  }));
  await Promise.all(ids.map((id) => exec(id, 'true')));
  return ids;
}

const deleteAll = (ids: string[]) => Promise.all(ids.map((id) => s.api('DELETE', `/instances/${id}`)));

/** `perf record` of the whole host, from now until the returned stop is called (BENCH_PROFILE=FILE). */
async function profileHost(file: string): Promise<() => Promise<void>> {
  const perf = spawn('perf', ['record', '-F', '1000', '-a', '-g', '-o', file], { stdio: 'ignore' });
  await new Promise((r) => setTimeout(r, 500));
  return async () => {
    perf.kill('SIGINT');
    await new Promise((r) => perf.once('exit', r));
  };
}

const one: number[] = [];
const many: number[] = [];
const creates: number[] = [];
const cpuPerFork: number[] = [];
const cpuPerCreate: number[] = [];
const memEach: number[] = [];
const memAvailDrop: number[] = [];
let sourceMem = 0;
try {
  sourceMem = await memoryMiB(source);
  // A round untimed first: the server's code compiled, the uid ranges and addresses used once.
  await deleteAll(await forkMany(FORKS));
  for (let round = 0; round < N; round++) {
    for (let i = 0; i < 5; i++) {
      const t = performance.now();
      const [id] = await forkMany(1);
      one.push(performance.now() - t);
      await deleteAll([id!]);
    }

    const stopProfile = PROFILE && round === 0 ? await profileHost(PROFILE) : undefined;
    const availBefore = memAvailableMiB();
    let cpu = cpuBusyMs();
    let t = performance.now();
    const forks = await forkMany(FORKS);
    many.push(performance.now() - t);
    cpuPerFork.push((cpuBusyMs() - cpu) / FORKS);
    await stopProfile?.();
    memAvailDrop.push((availBefore - memAvailableMiB()) / FORKS);
    const mems = await Promise.all(forks.map(memoryMiB));
    memEach.push(mems.reduce((a, b) => a + b, 0) / FORKS);
    await deleteAll(forks);

    cpu = cpuBusyMs();
    t = performance.now();
    const made = await createMany(FORKS);
    creates.push(performance.now() - t);
    cpuPerCreate.push((cpuBusyMs() - cpu) / FORKS);
    await deleteAll(made);
  }
} finally {
  await s.close();
}

table(`Fork ×${FORKS} (bench/fork-many.ts)`, [
  { name: `fork ×${FORKS} + first exec each (wall)`, stats: stats(many), target: '≤ 1000' },
  { name: '  baseline: fork ×1 + first exec', stats: stats(one) },
  { name: `  baseline: create ×${FORKS} + first exec each (wall)`, stats: stats(creates) },
  { name: '  host CPU time per fork', stats: stats(cpuPerFork) },
  { name: '  host CPU time per create', stats: stats(cpuPerCreate) },
  { name: `memory per fork (cgroup usage, mean of ${FORKS})`, stats: stats(memEach), unit: 'MiB' },
  { name: '  host MemAvailable drop per fork', stats: stats(memAvailDrop), unit: 'MiB' },
  { name: '  baseline: the source sandbox (cgroup usage)', stats: stats([sourceMem]), unit: 'MiB' },
]);
