/**
 * Issue 25: checkpoint pause, rollback and fork of an idle sandbox while the host's CPUs are
 * busy, next to the same on idle CPUs, in the same run and interleaved. Busy two ways: one
 * spinning sandbox per CPU (other tenants' work, inside their CPU groups), and one spinning
 * host process per CPU (the host's own work, outside any sandbox group).
 */
import { spawn } from 'node:child_process';
import { setPriority } from 'node:os';
import { availableParallelism } from 'node:os';
import { benchServer, checkpointCycle, stats, table, type CycleSamples, type Stats } from './lib.js';

const N = Number(process.env.BENCH_N ?? 10);
/** Spinners per CPU, of each kind. */
const PER_CPU = Number(process.env.BENCH_LOAD_PER_CPU ?? 4);
const s = await benchServer();

async function instance(body: Record<string, unknown> = {}): Promise<string> {
  const r = await s.api('POST', '/instances', body);
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  await s.api('POST', `/instances/${r.body.id}/exec`, { command: 'true' });
  return r.body.id;
}

type Samples = CycleSamples;

const round = (id: string, out: Samples) => checkpointCycle(s, id, out);

try {
  const target = await instance();
  const cpus = availableParallelism();
  const spinners: string[] = [];
  for (let i = 0; i < cpus * PER_CPU; i++) {
    const id = await instance({ limits: { cpu_percent: 100 } });
    await s.api('POST', `/instances/${id}/processes`, { command: 'while :; do :; done' });
    spinners.push(id);
  }
  const spin = async (on: boolean) => {
    for (const id of spinners) await (on ? s.engine.thaw(id) : s.engine.freeze(id));
  };
  // At the default priority, as other host processes are (the bench runs at the server's).
  const hogs = Array.from({ length: cpus * PER_CPU }, () => {
    const hog = spawn('sh', ['-c', 'while :; do :; done'], { stdio: 'ignore' });
    if (hog.pid) setPriority(hog.pid, 0);
    return hog;
  });
  const hog = (on: boolean) => {
    for (const h of hogs) h.kill(on ? 'SIGCONT' : 'SIGSTOP');
  };
  const idle: Samples = { pause: [], rollback: [], fork: [] };
  const tenants: Samples = { pause: [], rollback: [], fork: [] };
  const host: Samples = { pause: [], rollback: [], fork: [] };
  const settle = () => new Promise((r) => setTimeout(r, 200)); // the spinners have the CPUs
  try {
    hog(false);
    await spin(false);
    await round(target, { pause: [], rollback: [], fork: [] }); // warm-up
    for (let i = 0; i < N; i++) {
      await round(target, idle);
      await spin(true);
      await settle();
      await round(target, tenants);
      await spin(false);
      hog(true);
      await settle();
      await round(target, host);
      hog(false);
    }
  } finally {
    for (const h of hogs) h.kill('SIGKILL');
    await spin(true); // thawed, so that they can be deleted
  }
  const row = (name: string, st: Stats, target?: string) => ({ name, stats: st, ...(target ? { target } : {}) });
  table(`under load (issue 25): idle sandbox; the host's ${cpus} CPUs idle, or each busy with ${PER_CPU} spinning sandbox(es), or with ${PER_CPU} spinning host process(es)`, [
    row('checkpoint pause, CPUs idle', stats(idle.pause)),
    row('  CPUs busy with sandboxes', stats(tenants.pause), '≤ 2× idle'),
    row('  CPUs busy with host processes', stats(host.pause), '≤ 2× idle'),
    row('rollback, CPUs idle', stats(idle.rollback)),
    row('  CPUs busy with sandboxes', stats(tenants.rollback), '≤ 2× idle'),
    row('  CPUs busy with host processes', stats(host.rollback), '≤ 2× idle'),
    row('fork 1, CPUs idle', stats(idle.fork)),
    row('  CPUs busy with sandboxes', stats(tenants.fork), '≤ 2× idle'),
    row('  CPUs busy with host processes', stats(host.fork), '≤ 2× idle'),
  ]);
} finally {
  await s.close();
}
