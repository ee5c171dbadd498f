/**
 * Issue 25: forkpoint next to its peers on the same workload, the same CRIU and the same machine,
 * in one run: runc (Debian's) checkpointing with `--leave-running` and restoring, driving the CRIU
 * forkpoint uses. The workload: the default image with a ticker that wakes every 2 ms and keeps
 * the longest gap it saw (bench/fixtures/ticker.c), so a pause is measured as the program inside
 * saw it. A runc "rollback" kills the container and restores the image in its place (runc has no
 * notion of the container's files; CRIU brings the processes back); a runc "fork" restores the
 * image as a new container on an overlay of its own over a copy of the source's upper taken at
 * the checkpoint (copied before the clock starts).
 */
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { execa } from 'execa';
import { benchServer, buildTicker, startTicker, stats, table, time, type Stats } from './lib.js';

const N = Number(process.env.BENCH_N ?? 10);
const IMAGE = '/opt/forkpoint/images/default';

const s = await benchServer();
const work = await mkdtemp(join(process.env.FORKPOINT_BENCH_DIR ?? tmpdir(), 'forkpoint-peers-'));
const ticker = await buildTicker(work);
const runcEnv = { PATH: `${dirname(s.engine.criu.path)}:${process.env.PATH}` };
const runc = (...args: string[]) => execa('runc', args, { env: runcEnv, stdin: 'ignore' });

/** A ticker's window: `reset` asks for a new one (the ticker takes the file), `read` gives its
 * longest gap so far, in microseconds. */
interface TickerDir {
  reset(): Promise<void>;
  taken(): Promise<boolean>;
  read(): Promise<number>;
}

/** The longest gap the ticker saw while `during` ran, in ms. */
async function gapDuring(t: TickerDir, during: () => Promise<unknown>): Promise<number> {
  await t.reset();
  for (let i = 0; !(await t.taken()); i++) {
    if (i > 200) throw new Error('the ticker does not tick');
    await new Promise((r) => setTimeout(r, 5));
  }
  await during();
  await new Promise((r) => setTimeout(r, 30)); // a few ticks after it
  return (await t.read()) / 1000;
}

/** Seen from the host, through a directory that reaches the sandbox's /ticker. */
const hostTicker = (dir: string): TickerDir => ({
  reset: () => writeFile(join(dir, 'reset'), ''),
  taken: async () => (await readFile(join(dir, 'reset')).catch(() => undefined)) === undefined,
  read: async () => Number(await readFile(join(dir, 'max'), 'utf8')),
});

// --- forkpoint ---
async function fpInstance(): Promise<string> {
  const r = await s.api('POST', '/instances', {});
  if (r.status !== 201) throw new Error(JSON.stringify(r.body));
  const id = r.body.id as string;
  await startTicker(s, id, ticker);
  return id;
}
async function fpExec(id: string, command: string): Promise<string> {
  const r = await s.api('POST', `/instances/${id}/exec`, { command });
  if (r.status !== 200 || r.body.exit_code !== 0) throw new Error(`${command}: ${JSON.stringify(r.body)}`);
  return r.body.stdout;
}
/** Through the sandbox's agent: the host cannot create files in the view of a sandbox in a user
 * namespace (its root is no id there). */
const fpTickerOf = (id: string): TickerDir => ({
  reset: () => fpExec(id, 'touch /ticker/reset').then(() => undefined),
  taken: async () => (await fpExec(id, 'test -e /ticker/reset && echo no || echo yes')) === 'yes\n',
  read: async () => Number(await fpExec(id, 'cat /ticker/max')),
});

// --- runc ---
class RuncBox {
  private constructor(
    readonly id: string,
    readonly dir: string,
  ) {}

  get rootfs(): string {
    return join(this.dir, 'rootfs');
  }
  get upper(): string {
    return join(this.dir, 'up');
  }

  /** A container on an overlay over `lowers`; `prepare` fills its upper first (not timed by callers). */
  static async prepare(id: string, lowers: string[], withTicker: boolean): Promise<RuncBox> {
    const dir = join(work, id);
    for (const d of ['up', 'wk', 'rootfs', 'bundle']) await mkdir(join(dir, d), { recursive: true });
    if (withTicker) {
      await mkdir(join(dir, 'up/ticker'), { recursive: true });
      await cp(ticker, join(dir, 'up/ticker/ticker'));
    }
    const box = new RuncBox(id, dir);
    await writeFile(join(dir, 'lowers'), lowers.join(':'));
    return box;
  }

  async mount(): Promise<void> {
    const lowers = await readFile(join(this.dir, 'lowers'), 'utf8');
    await execa('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowers},upperdir=${this.upper},workdir=${join(this.dir, 'wk')}`, this.rootfs]);
    await execa('runc', ['spec', '--bundle', join(this.dir, 'bundle')]);
    const file = join(this.dir, 'bundle/config.json');
    const spec = JSON.parse(await readFile(file, 'utf8'));
    spec.process.terminal = false;
    // Its stdio is the sandbox's own /dev/null: CRIU cannot dump a host file held open.
    spec.process.args = ['sh', '-c', 'exec </dev/null >/dev/null 2>&1; exec /ticker/ticker /ticker'];
    spec.root = { path: this.rootfs, readonly: false };
    await writeFile(file, JSON.stringify(spec));
  }

  run = () => runc('run', '-d', '--bundle', join(this.dir, 'bundle'), this.id);
  exec = (...argv: string[]) => runc('exec', this.id, ...argv);
  checkpoint = (images: string) => runc('checkpoint', '--leave-running', '--image-path', images, this.id);
  restore = (images: string) => runc('restore', '-d', '--image-path', images, '--bundle', join(this.dir, 'bundle'), this.id);
  async kill(): Promise<void> {
    await runc('kill', this.id, 'KILL').catch(() => {});
    await runc('delete', '-f', this.id).catch(() => {});
  }
  async destroy(): Promise<void> {
    await this.kill();
    await execa('umount', [this.rootfs]).catch(() => {});
    await rm(this.dir, { recursive: true, force: true });
  }
}

const rows: { name: string; stats: Stats; target?: string }[] = [];
const pair = (what: string, fp: number[], peer: number[]) => {
  const a = stats(fp);
  const b = stats(peer);
  rows.push({ name: `${what}: forkpoint`, stats: a, target: `${((a.p50 / b.p50) * 100).toFixed(0)} % of runc` });
  rows.push({ name: `  runc + CRIU`, stats: b });
};

const boxes: RuncBox[] = [];
let serial = 0;
const runcId = () => `fp-peer-${process.pid}-${++serial}`;
try {
  const fpCreate: number[] = [], rcCreate: number[] = [];
  const fpExecRt: number[] = [], rcExecRt: number[] = [];
  const fpPause: number[] = [], rcPause: number[] = [];
  const fpRollback: number[] = [], rcRollback: number[] = [];
  const fpFork: number[] = [], rcFork: number[] = [];

  const fp = await fpInstance();
  const fpTicker = fpTickerOf(fp);
  const rc = await RuncBox.prepare(runcId(), [IMAGE], true);
  boxes.push(rc);
  await rc.mount();
  await rc.run();
  const rcTicker = hostTicker(join(rc.rootfs, 'ticker'));
  await new Promise((r) => setTimeout(r, 100));

  for (let i = -1; i < N; i++) {
    const keep = i >= 0; // round -1 warms up
    // create + first exec
    let made = '';
    let t = await time(async () => {
      const r = await s.api('POST', '/instances', {});
      made = r.body.id;
      await fpExec(made, 'true');
    });
    await s.api('DELETE', `/instances/${made}`);
    const fresh = await RuncBox.prepare(runcId(), [IMAGE], true);
    const u = await time(async () => {
      await fresh.mount();
      await fresh.run();
      await fresh.exec('true');
    });
    await fresh.destroy();
    if (keep) {
      fpCreate.push(t);
      rcCreate.push(u);
    }
    // exec round trip
    t = await time(() => fpExec(fp, 'true'));
    const e = await time(() => rc.exec('true'));
    if (keep) {
      fpExecRt.push(t);
      rcExecRt.push(e);
    }
    // the pause the ticker saw
    let ck = '';
    const pf = await gapDuring(fpTicker, async () => {
      const r = await s.api('POST', `/instances/${fp}/checkpoints?wait=true`, { memory: true, retention: { mode: 'delete_oldest' } });
      if (r.body.status !== 'ready') throw new Error(JSON.stringify(r.body));
      ck = r.body.id;
    });
    const images = join(work, `images-${i + 1}`);
    const pr = await gapDuring(rcTicker, () => rc.checkpoint(images));
    const frozenUpper = join(work, `upper-${i + 1}`);
    await execa('cp', ['-a', rc.upper, frozenUpper]);
    if (keep) {
      fpPause.push(pf);
      rcPause.push(pr);
    }
    // rollback + first exec
    t = await time(async () => {
      const r = await s.api('POST', `/instances/${fp}/rollback`, { checkpoint_id: ck });
      if (r.status !== 200) throw new Error(JSON.stringify(r.body));
      await fpExec(fp, 'true');
    });
    const rb = await time(async () => {
      await rc.kill();
      await rc.restore(images);
      await rc.exec('true');
    });
    if (keep) {
      fpRollback.push(t);
      rcRollback.push(rb);
    }
    // fork + first exec
    let forked = '';
    t = await time(async () => {
      const r = await s.api('POST', `/instances/${fp}/fork`, { checkpoint_id: ck });
      if (r.status !== 201) throw new Error(JSON.stringify(r.body));
      forked = r.body.id;
      await fpExec(forked, 'true');
    });
    await s.api('DELETE', `/instances/${forked}`);
    const child = await RuncBox.prepare(runcId(), [frozenUpper, IMAGE], false);
    const fk = await time(async () => {
      await child.mount();
      await child.restore(images);
      await child.exec('true');
    });
    await child.destroy();
    await rm(frozenUpper, { recursive: true, force: true });
    await rm(images, { recursive: true, force: true });
    if (keep) {
      fpFork.push(t);
      rcFork.push(fk);
    }
  }
  // The same pause with about 40 processes in each sandbox: the ticker and sleepers.
  await s.api('POST', `/instances/${fp}/processes`, { command: 'for i in $(seq 38); do sleep 1000000 & done; wait' });
  await rc.exec('sh', '-c', 'for i in $(seq 39); do sleep 1000000 </dev/null >/dev/null 2>&1 & done');
  await new Promise((r) => setTimeout(r, 300));
  const count = 'ls -d /proc/[0-9]* | wc -l';
  const fpProcs = Number((await fpExec(fp, count)).trim()) - 1; // not the ls
  const rcProcs = Number((await rc.exec('sh', '-c', count)).stdout.trim()) - 1;
  /** N pauses each, as the tickers saw them, after one untimed round; runc's images dropped. */
  const pauses = async (name: string): Promise<[number[], number[]]> => {
    const fpSeen: number[] = [], rcSeen: number[] = [];
    for (let i = -1; i < N; i++) {
      const pf = await gapDuring(fpTicker, async () => {
        const r = await s.api('POST', `/instances/${fp}/checkpoints?wait=true`, { memory: true, retention: { mode: 'delete_oldest' } });
        if (r.body.status !== 'ready') throw new Error(JSON.stringify(r.body));
      });
      const images = join(work, `${name}-images-${i + 1}`);
      const pr = await gapDuring(rcTicker, () => rc.checkpoint(images));
      await rm(images, { recursive: true, force: true });
      if (i >= 0) {
        fpSeen.push(pf);
        rcSeen.push(pr);
      }
    }
    return [fpSeen, rcSeen];
  };
  const [fpBusy, rcBusy] = await pauses('busy');
  // And with 512 MiB written once beside a working set (8 MiB rewritten every 100 ms): forkpoint
  // copies what was written since its last checkpoint (incremental, README "Behaviour"); runc
  // copies it all each time (its --pre-dump needs soft-dirty bits, which this kernel lacks).
  const fill = `awk 'BEGIN { s = sprintf("%536870912s", ""); print "filled" > "/tmp/filled"; close("/tmp/filled"); system("sleep 1000000") }'`;
  const churn = `awk 'BEGIN { for (;;) { s = sprintf("%8388608s", i++); system("sleep 0.1") } }'`;
  await s.api('POST', `/instances/${fp}/processes`, { command: `${fill} & ${churn} & wait` });
  await rc.exec('sh', '-c', `(${fill} & ${churn}) </dev/null >/dev/null 2>&1 &`);
  for (let i = 0; (await fpExec(fp, 'cat /tmp/filled 2>/dev/null || true')) !== 'filled\n' || (await rc.exec('sh', '-c', 'cat /tmp/filled 2>/dev/null || true')).stdout !== 'filled'; i++) {
    if (i > 600) throw new Error('the 512 MiB were not written within a minute');
    await new Promise((r) => setTimeout(r, 100));
  }
  const incrementalBefore = s.engine.incrementalDumpCount;
  const [fpLarge, rcLarge] = await pauses('large');
  const incremental = s.engine.incrementalDumpCount - incrementalBefore;
  pair('create + first exec', fpCreate, rcCreate);
  pair('exec round trip', fpExecRt, rcExecRt);
  pair('checkpoint, pause seen inside (ticker)', fpPause, rcPause);
  pair('rollback + first exec', fpRollback, rcRollback);
  pair('fork + first exec', fpFork, rcFork);
  pair(`checkpoint, pause seen inside, ${fpProcs} processes (runc: ${rcProcs})`, fpBusy, rcBusy);
  pair(`checkpoint, pause seen inside, + 512 MiB written once, 8 MiB working set (${incremental} of ${N + 1} incremental)`, fpLarge, rcLarge);
  table('peers (issue 25): forkpoint and runc 1.1 + the same CRIU, the same workload (a 2 ms ticker), same run', rows);
} finally {
  for (const b of boxes) await b.destroy();
  await s.close();
  await rm(work, { recursive: true, force: true });
}
