import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { request } from 'undici';
import { execa } from 'execa';
import { loadConfig } from '../src/config.js';
import { subnetFor } from '../src/lib/ipv4.js';
import { Forkpoint } from '../src/core/forkpoint.js';
import type { Engine } from '../src/engine/engine.js';
import { localEngine } from '../src/local.js';
import { buildApp } from '../src/http/app.js';
import { VERSION } from '../src/version.js';
import { raiseServerPriority } from '../src/lib/server-priority.js';

export interface Stats {
  n: number;
  min: number;
  p50: number;
  p95: number;
}

export function stats(samples: number[]): Stats {
  const s = [...samples].sort((a, b) => a - b);
  const q = (p: number) => s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
  return { n: s.length, min: s[0]!, p50: q(0.5), p95: q(0.95) };
}

export async function time(fn: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await fn();
  return performance.now() - t;
}

export async function sample(n: number, fn: () => Promise<number | void>): Promise<Stats> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    const own = await fn();
    out.push(typeof own === 'number' ? own : performance.now() - t);
  }
  return stats(out);
}

const f = (x: number) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));

/** A measurement that could not be made: its row says why, and the bench goes on. */
export interface Failed {
  failed: string;
}

/** Runs a measurement; one that throws becomes a row that says so, not the end of the bench. */
export async function attempt(fn: () => Promise<Stats>): Promise<Stats | Failed> {
  try {
    return await fn();
  } catch (err) {
    const line = ((err as Error).message ?? String(err)).split('\n').find((l) => l.trim()) ?? 'failed';
    return { failed: line.slice(0, 160) };
  }
}

/** Prints rows of `name | what | n | min | p50 | p95 | target`. */
export function table(title: string, rows: { name: string; stats: Stats | Failed; unit?: string; target?: string }[]): void {
  const head = ['operation', 'n', 'min', 'p50', 'p95', 'unit', 'target'];
  const body = rows.map((r) =>
    'failed' in r.stats
      ? [r.name, '0', '-', '-', '-', r.unit ?? 'ms', `FAILED: ${r.stats.failed}`]
      : [r.name, String(r.stats.n), f(r.stats.min), f(r.stats.p50), f(r.stats.p95), r.unit ?? 'ms', r.target ?? '']);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const line = (cells: string[]) => '| ' + cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ') + ' |';
  console.log(`\n### ${title}\n`);
  console.log(line(head));
  console.log('|' + widths.map((w, i) => (i === 0 ? '-'.repeat(w + 2) : '-'.repeat(w + 1) + ':')).join('|') + '|');
  for (const b of body) console.log(line(b));
}

/** Samples of the checkpoint cycle on one sandbox. */
export interface CycleSamples {
  pause: number[];
  rollback: number[];
  fork: number[];
}

/** A memory checkpoint (its pause), a rollback to it and a fork of it (each timed over HTTP),
 * the fork deleted after; the instance's older checkpoints make room (delete_oldest). */
export async function checkpointCycle(s: BenchServer, id: string, out: CycleSamples): Promise<void> {
  const ck = await memoryCheckpoint(s, id);
  out.pause.push(ck.pause_ms);
  const fork = await timedRollbackAndFork(s, id, ck.id, out);
  await s.api('DELETE', `/instances/${fork.id}`);
}

/** A memory checkpoint of the instance, ready (its older ones make room: delete_oldest). */
export async function memoryCheckpoint(s: BenchServer, id: string): Promise<{ id: string; pause_ms: number }> {
  const ck = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true, retention: { mode: 'delete_oldest' } });
  if (ck.body.status !== 'ready') throw new Error(JSON.stringify(ck.body));
  return ck.body;
}

/** A rollback of the instance to the checkpoint and a fork of it, each timed over HTTP; the
 * fork, and whether it took a standby. */
export async function timedRollbackAndFork(s: BenchServer, id: string, checkpointId: string, out: Pick<CycleSamples, 'rollback' | 'fork'>): Promise<{ id: string; warm: boolean }> {
  let t = performance.now();
  const rb = await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: checkpointId });
  if (rb.status !== 200) throw new Error(JSON.stringify(rb.body));
  out.rollback.push(performance.now() - t);
  t = performance.now();
  const f = await s.api('POST', `/instances/${id}/fork`, { checkpoint_id: checkpointId });
  if (f.status !== 201) throw new Error(JSON.stringify(f.body));
  out.fork.push(performance.now() - t);
  return { id: f.body.id, warm: f.body.warm_fork === true };
}

export interface BenchServer {
  fp: Forkpoint;
  /** The real engine under the core. */
  engine: Engine;
  url: string;
  token: string;
  api<T = any>(method: string, path: string, body?: unknown): Promise<{ status: number; body: T }>;
  close(): Promise<void>;
}

/** FORKPOINT_CRIU points a bench at another CRIU (one built without forkpoint's patches, say). */
const criuFromEnv = () => (process.env.FORKPOINT_CRIU ? { criuPath: process.env.FORKPOINT_CRIU } : {});

export async function benchServer(opts: { unconfined?: boolean; networking?: 'on' | 'off'; config?: Record<string, string> } = {}): Promise<BenchServer> {
  const dataDir = await mkdtemp(join(process.env.FORKPOINT_BENCH_DIR ?? tmpdir(), 'forkpoint-bench-'));
  const cfg = loadConfig({ env: {}, flags: { dataDir, port: 0, networkCidr: subnetFor(dataDir), networking: opts.networking ?? 'on', logLevel: 'silent', maxCheckpointsPerInstance: 1000, warmForks: 0, ...criuFromEnv(), ...opts.config } });
  // BENCH_LOG=FILE: the servers' debug log (the engine's per-step timings) goes there.
  const log = process.env.BENCH_LOG ? pino({ level: 'debug' }, pino.destination({ dest: process.env.BENCH_LOG, append: true, sync: false })) : pino({ level: 'silent' });
  // As `forkpoint serve` runs (the bench's own processes with it: its host load is set back to 0).
  raiseServerPriority(cfg.serverNice);
  let engine!: Engine;
  const fp = await Forkpoint.open(cfg, log, VERSION, (nodeId) => (engine = localEngine(cfg, log, nodeId, { unconfinedForBenchmarks: opts.unconfined ?? false })));
  await fp.start();
  const token = (await fp.ensureInitialToken())!;
  const app = await buildApp({ forkpoint: fp, logger: false, bodyLimitBytes: cfg.bodyLimitBytes });
  const url = await app.listen({ host: '127.0.0.1', port: 0 });
  const close = async () => {
    await app.close();
    await fp.destroyAll();
    await fp.close();
    await rm(dataDir, { recursive: true, force: true });
  };
  // A bench that throws at top level still takes its sandboxes and mounts with it.
  process.once('uncaughtException', (err) => {
    console.error(err);
    void close().finally(() => process.exit(1));
  });
  return {
    fp,
    engine,
    url,
    token,
    async api(method, path, body) {
      const res = await request(url + path, {
        method: method as 'GET',
        headers: { authorization: `Bearer ${token}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.body.text();
      return { status: res.statusCode, body: text ? JSON.parse(text) : null };
    },
    close,
  };
}

const TICKER_SOURCE = new URL('./fixtures/ticker.c', import.meta.url).pathname;

/** bench/fixtures/ticker.c built static into `dir` (the workload: a program that wakes
 * every 2 ms, spawning nothing); its path. */
export async function buildTicker(dir: string): Promise<string> {
  const path = join(dir, 'ticker');
  await execa('cc', ['-static', '-O2', '-o', path, TICKER_SOURCE]);
  return path;
}

/** Puts the ticker built at `binary` into the instance as /ticker/ticker and starts it there,
 * keeping its window in /ticker. */
export async function startTicker(s: BenchServer, id: string, binary: string): Promise<void> {
  const up = await request(`${s.url}/instances/${id}/files?path=/ticker/ticker`, { method: 'PUT', headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/octet-stream' }, body: await readFile(binary) });
  await up.body.dump();
  if (up.statusCode !== 200 && up.statusCode !== 201 && up.statusCode !== 204) throw new Error(`ticker upload: ${up.statusCode}`);
  const chmod = await s.api('POST', `/instances/${id}/exec`, { command: 'chmod 755 /ticker/ticker' });
  if (chmod.status !== 200 || chmod.body.exit_code !== 0) throw new Error(`chmod: ${JSON.stringify(chmod.body)}`);
  const started = await s.api('POST', `/instances/${id}/processes`, { command: 'exec /ticker/ticker /ticker' });
  if (started.status !== 201 && started.status !== 200) throw new Error(`ticker start: ${JSON.stringify(started.body)}`);
}
