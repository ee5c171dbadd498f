import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { request } from 'undici';
import { loadConfig, type ConfigInput } from '../../src/config.js';
import { testSubnet } from './subnets.js';
import { Forkpoint } from '../../src/core/forkpoint.js';
import type { Engine } from '../../src/engine/engine.js';
import { localEngine } from '../../src/local.js';
import { buildApp } from '../../src/http/app.js';
import { VERSION } from '../../src/version.js';

export interface Reply<T = any> {
  status: number;
  body: T;
}

export interface TestServer {
  url: string;
  token: string;
  dataDir: string;
  fp: Forkpoint;
  /** The real engine under the core, for what only the host can show (pids, mounts, files). */
  engine: Engine;
  app: FastifyInstance;
  /** JSON over real HTTP with the server's token (or the given headers). */
  api<T = any>(method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<Reply<T>>;
  /** Creates a running instance; fails the test if that does not work. */
  instance(body?: Record<string, unknown>): Promise<any>;
  exec(id: string, body: Record<string, unknown>): Promise<any>;
  /** Stops the server (and with `keepSandboxes`, leaves the sandboxes for a restart). */
  close(opts?: { keepSandboxes?: boolean; keepData?: boolean }): Promise<void>;
}

/** A real server on loopback over a fresh data directory, as root, with the real engine. */
export async function startServer(config: Partial<ConfigInput> = {}, existingDataDir?: string, opts: { logFile?: string } = {}): Promise<TestServer> {
  const dataDir = existingDataDir ?? (await mkdtemp(join(tmpdir(), 'forkpoint-test-')));
  // Warm forks only where a test asks for them (test/warm-forks.test.ts): elsewhere each fork
  // would start a restore in the background that the test does not look at.
  const cfg = loadConfig({ env: {}, flags: { dataDir, port: 0, networkCidr: testSubnet(dataDir), logLevel: 'silent', warmForks: 0, ...config } });
  // `logFile`: everything the server logs, at debug, for a test that reads its log.
  const log = opts.logFile ? pino({ level: 'debug' }, pino.destination({ dest: opts.logFile, sync: true })) : pino({ level: process.env.FORKPOINT_TEST_LOG ?? 'silent' });
  let engine!: Engine;
  const fp = await Forkpoint.open(cfg, log, VERSION, (nodeId) => (engine = localEngine(cfg, log, nodeId)));
  await fp.start().catch(async (err: unknown) => {
    // A server that fails to start (its firewall refused, say) leaves nothing behind either.
    await fp.close().catch(() => {});
    if (!existingDataDir) await rm(dataDir, { recursive: true, force: true });
    throw err;
  });
  const token = (await fp.ensureInitialToken()) ?? (await readFile(fp.layout.initialTokenFile, 'utf8')).trim();
  let app: FastifyInstance;
  let url: string;
  try {
    app = await buildApp({ forkpoint: fp, logger: false, bodyLimitBytes: cfg.bodyLimitBytes });
    url = await app.listen({ host: '127.0.0.1', port: 0 });
  } catch (err) {
    // A server that cannot be built leaves nothing behind either.
    await fp.destroyAll().catch(() => {});
    await fp.close().catch(() => {});
    if (!existingDataDir) await rm(dataDir, { recursive: true, force: true });
    throw err;
  }

  const api = async (method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<Reply> => {
    const res = await request(url + path, {
      method: method as 'GET',
      headers: {
        ...(headers ?? { authorization: `Bearer ${token}` }),
        ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
      },
      body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    });
    const text = await res.body.text();
    return { status: res.statusCode, body: text ? JSON.parse(text) : null };
  };

  const server: TestServer = {
    url,
    token,
    dataDir,
    fp,
    engine,
    app,
    api,
    async instance(body = {}) {
      const r = await api('POST', '/instances', body);
      if (r.status !== 201) throw new Error(`create instance: ${r.status} ${JSON.stringify(r.body)}`);
      return r.body;
    },
    async exec(id, body) {
      const r = await api('POST', `/instances/${id}/exec`, body);
      if (r.status !== 200) throw new Error(`exec: ${r.status} ${JSON.stringify(r.body)}`);
      return r.body;
    },
    async close(opts = {}) {
      await app.close();
      if (!opts.keepSandboxes) {
        await fp.destroyAll();
      }
      await fp.close();
      if (!opts.keepSandboxes) {
        const left = await overlaysUnder(dataDir);
        if (left.length) throw new Error(`still mounted after close: ${left.join(', ')}`);
      }
      if (!opts.keepData && !opts.keepSandboxes) await rm(dataDir, { recursive: true, force: true });
    },
  };
  return server;
}

/** Overlay mounts of this data directory still in the host's mount table. */
export async function overlaysUnder(dir: string): Promise<string[]> {
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  return text
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(dir + '/'));
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls until `fn` returns a truthy value, or throws after `ms`. */
export async function eventually<T>(fn: () => Promise<T | undefined | false>, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await sleep(50);
  }
}

/** `Promise.all` of two set-ups that undoes the one that worked when the other fails, so that a
 * failed beforeAll leaves nothing behind (a fresh clone's run left an attack kit's directory when
 * its server could not start). */
export async function bothOrUndo<A, B>(a: Promise<A>, b: Promise<B>, undoA: (a: A) => Promise<unknown>, undoB: (b: B) => Promise<unknown>): Promise<[A, B]> {
  const [ra, rb] = await Promise.allSettled([a, b]);
  if (ra.status === 'fulfilled' && rb.status === 'fulfilled') return [ra.value, rb.value];
  if (ra.status === 'fulfilled') await undoA(ra.value).catch(() => {});
  if (rb.status === 'fulfilled') await undoB(rb.value).catch(() => {});
  throw ra.status === 'rejected' ? ra.reason : (rb as PromiseRejectedResult).reason;
}
