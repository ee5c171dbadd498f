/**
 * Issue 24: the client CLI answers at once. `forkpoint --help` and `forkpoint ls` (a real
 * server, a few instances) wall time, next to `node -e 0` (the floor: starting Node.js) in the
 * same run.
 */
import { execa } from 'execa';
import { benchServer, sample, table } from './lib.js';

const N = Number(process.env.BENCH_N ?? 20);
const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
const s = await benchServer();
for (let i = 0; i < 3; i++) await s.api('POST', '/instances', { name: `bench-${i}` });
const env = { ...process.env, FORKPOINT_URL: s.url, FORKPOINT_TOKEN: s.token, NO_COLOR: '1' };
const run = (args: string[]) => async () => void (await execa(process.execPath, args, { env }));

await run([CLI, '--help'])(); // warm the page cache
const floor = await sample(N, run(['-e', '0']));
const help = await sample(N, run([CLI, '--help']));
const ls = await sample(N, run([CLI, 'ls']));
const lsJson = await sample(N, run([CLI, 'ls', '--json']));
table('the client CLI: wall time of a whole command (issue 24)', [
  { name: 'node -e 0 (baseline)', stats: floor },
  { name: 'forkpoint --help', stats: help, target: 'near the baseline' },
  { name: 'forkpoint ls (3 instances)', stats: ls },
  { name: 'forkpoint ls --json', stats: lsJson },
]);
await s.close();
