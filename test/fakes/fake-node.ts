import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { loadConfig, type ConfigInput } from '../../src/config.js';
import { Forkpoint } from '../../src/core/forkpoint.js';
import { buildApp } from '../../src/http/app.js';
import { VERSION } from '../../src/version.js';
import { FakeEngine, FakeHost } from './fake-engine.js';

/** A server over the fake engine, answered through `app.inject`: no root, no socket. */
export interface FakeNode {
  fp: Forkpoint;
  app: FastifyInstance;
  engine: FakeEngine;
  host: FakeHost;
  dataDir: string;
  token: string;
  /** JSON through `app.inject` with the node's token (or the given headers). */
  call(method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE', url: string, payload?: object | string, headers?: Record<string, string>): Promise<{ status: number; body: any; raw: string; headers: Record<string, unknown> }>;
  /** A command's standard output, trimmed, through the exec route (an error unless it answers 200). */
  sh(id: string, command: string): Promise<string>;
  /** Stops this server (its sandboxes run on, on the fake host) and starts another on the same
   * data directory and host (with these system images, if given). */
  restart(images?: string[]): Promise<FakeNode>;
  close(): Promise<void>;
}

export async function startFakeNode(config: Partial<ConfigInput> = {}, reuse?: { dataDir: string; host: FakeHost; token: string }, images?: string[]): Promise<FakeNode> {
  const dataDir = reuse?.dataDir ?? (await mkdtemp(join(tmpdir(), 'fp-unit-')));
  const host = reuse?.host ?? new FakeHost();
  const cfg = loadConfig({ env: {}, flags: { dataDir, networking: 'off', logLevel: 'silent', ...config } });
  const engine = new FakeEngine(host, images);
  const fp = await Forkpoint.open(cfg, pino({ level: process.env.FORKPOINT_TEST_LOG ?? 'silent' }), VERSION, () => engine);
  await fp.start();
  const token = reuse?.token ?? (await fp.store.tokens.create('default', 'unit')).token;
  const app = await buildApp({ forkpoint: fp, logger: false, bodyLimitBytes: cfg.bodyLimitBytes });
  await app.ready();
  let closed = false;
  const stop = async () => {
    if (closed) return;
    closed = true;
    await app.close();
    await fp.close();
  };
  const node: FakeNode = {
    fp, app, engine, host, dataDir, token,
    async call(method, url, payload, headers) {
      const r = await app.inject({
        method, url,
        headers: { authorization: `Bearer ${token}`, ...(payload !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
        ...(payload !== undefined ? { payload } : {}),
      });
      let body: any = null;
      try {
        body = r.body ? JSON.parse(r.body) : null;
      } catch {
        body = r.body;
      }
      return { status: r.statusCode, body, raw: r.body, headers: r.headers };
    },
    async sh(id, command) {
      const r = await node.call('POST', `/instances/${id}/exec`, { command });
      if (r.status !== 200) throw new Error(`exec ${command} in ${id}: ${r.status} ${JSON.stringify(r.body)}`);
      return (r.body.stdout as string).trim();
    },
    async restart(nextImages) {
      await stop();
      return startFakeNode(config, { dataDir, host, token }, nextImages ?? images);
    },
    async close() {
      await stop();
      await rm(dataDir, { recursive: true, force: true });
    },
  };
  return node;
}
