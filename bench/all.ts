/**
 * `npm run bench`: every bench, one after another, each to its end whatever the others did; then
 * which ran through and which did not. A bench prints its own tables (each with its baseline, from
 * the same run); one that fails is named here with its exit status, and the rest still run.
 */
import { execa } from 'execa';

const BENCHES = ['exec', 'checkpoint', 'warm-forks', 'fork-many', 'lazy-restore', 'files-only', 'under-load', 'peers', 'confinement', 'interactive', 'network', 'images', 'durable', 'cluster', 'cli'];
/** A bench that has not ended in this long is stopped (its own sandboxes go with its server). */
const DEADLINE_MS = Number(process.env.BENCH_DEADLINE_S ?? 1800) * 1000;

const only = process.argv.slice(2);
const results: { bench: string; status: string; seconds: number }[] = [];
for (const bench of BENCHES.filter((b) => only.length === 0 || only.includes(b))) {
  const t = performance.now();
  console.log(`\n## bench/${bench}.ts`);
  const r = await execa('npx', ['--no-install', 'tsx', `bench/${bench}.ts`], { stdio: 'inherit', reject: false, timeout: DEADLINE_MS, forceKillAfterDelay: 10_000 });
  const status = r.timedOut ? `stopped after ${DEADLINE_MS / 1000} s` : r.exitCode === 0 ? 'ran through' : `FAILED (exit ${r.exitCode ?? r.signal})`;
  results.push({ bench, status, seconds: (performance.now() - t) / 1000 });
}

console.log('\n### the benches of this run\n');
console.log('| bench | result | wall, s |');
console.log('|---|---|---:|');
for (const r of results) console.log(`| ${r.bench} | ${r.status} | ${r.seconds.toFixed(0)} |`);
process.exitCode = results.every((r) => r.status === 'ran through') ? 0 : 1;
