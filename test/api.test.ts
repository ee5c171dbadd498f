import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';

const CLI = new URL('../dist/cli.js', import.meta.url).pathname;

/** Prometheus' text format, every sample by its name and labels; a line it cannot read fails. */
function parsePrometheus(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (-?[0-9.eE+-]+|NaN|\+Inf|-Inf)(?: \d+)?$/.exec(line);
    if (!m) throw new Error(`not Prometheus text: ${line}`);
    out.set(m[1]!, Number(m[2]));
  }
  return out;
}

let s: TestServer;
beforeAll(async () => {
  s = await startServer({ bodyLimitBytes: 64 * 1024 });
});
afterAll(async () => s?.close());

describe('API basics', () => {
  it('serves /healthz without a token, with version and engine parts', async () => {
    const r = await s.api('GET', '/healthz', undefined, {});
    expect(r.status).toBe(200);
    expect(r.body.ok).toBe(true);
    expect(r.body.engine.criu.ok).toBe(true);
    expect(r.body.engine.criu.version).toMatch(/^4\.\d+/);
    expect(r.body.engine.overlay).toBe(true);
  });

  it('/readyz says ready with its checks; /metrics is Prometheus text whose counters move with the API, for an operator only', async () => {
    const ready = await s.api('GET', '/readyz', undefined, {});
    expect([ready.status, ready.body]).toEqual([200, { ready: true, checks: { engine: true, database: true, draining: false } }]);
    const scrape = async () => {
      const r = await request(`${s.url}/metrics`, { headers: { authorization: `Bearer ${s.token}` } });
      expect(r.statusCode).toBe(200);
      expect(r.headers['content-type']).toMatch(/^text\/plain/);
      return parsePrometheus(await r.body.text());
    };
    const count = (m: Map<string, number>, route: string) => m.get(`forkpoint_http_request_duration_seconds_count{method="GET",route="${route}",status="200"}`) ?? 0;
    const before = await scrape();
    for (let i = 0; i < 3; i++) expect((await s.api('GET', '/instances')).status).toBe(200);
    const inst = await s.instance();
    const c = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {});
    expect([c.status, c.body.checkpoint?.status ?? c.body.status]).toEqual([200, 'ready']);
    const after = await scrape();
    expect(count(after, '/instances') - count(before, '/instances')).toBe(3);
    expect(after.get('forkpoint_checkpoint_pause_seconds_count')! - (before.get('forkpoint_checkpoint_pause_seconds_count') ?? 0)).toBe(1);
    expect(after.get('forkpoint_instances{status="running"}')).toBeGreaterThanOrEqual(1);
    expect(after.get('forkpoint_data_disk_free_bytes')).toBeGreaterThan(0);
    expect(after.has('forkpoint_job_queue_depth')).toBe(true);
    const { token } = await s.fp.store.tokens.create('not-an-operator', 'test');
    expect((await s.api('GET', '/metrics', undefined, { authorization: `Bearer ${token}` })).status).toBe(403);
    expect((await s.api('GET', '/metrics', undefined, {})).status).toBe(401);
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('needs a token: none, or a wrong one, is 401 in the envelope', async () => {
    const none = await s.api('GET', '/instances', undefined, {});
    expect(none.status).toBe(401);
    expect(none.body.error.code).toBe('UNAUTHENTICATED');
    const wrong = await s.api('GET', '/instances', undefined, { authorization: 'Bearer fpk_tok_nope.nope' });
    expect(wrong.status).toBe(401);
    expect(wrong.body).toEqual({ error: { code: 'UNAUTHENTICATED', message: expect.any(String) } });
  });

  it('accepts the token as Bearer and as X-API-Key', async () => {
    expect((await s.api('GET', '/instances')).status).toBe(200);
    expect((await s.api('GET', '/instances', undefined, { 'x-api-key': s.token })).status).toBe(200);
  });

  it('`forkpoint token create` writes where the server reads, and refuses a data directory no server has used', async () => {
    const cli = (dataDir: string) => execa(process.execPath, [CLI, 'token', 'create', '--owner', 'cli-made'], { env: { ...process.env, FORKPOINT_DATA_DIR: dataDir, FORKPOINT_CONFIG: '' }, reject: false });
    const made = await cli(s.dataDir);
    expect(made.exitCode, made.stderr).toBe(0);
    expect((await s.api('GET', '/instances', undefined, { authorization: `Bearer ${made.stdout.trim()}` })).status).toBe(200);
    const elsewhere = await mkdtemp(join(tmpdir(), 'forkpoint-nodb-'));
    try {
      const refused = await cli(elsewhere);
      expect(refused.exitCode).toBe(1);
      expect(refused.stderr).toContain('no forkpoint server has used the data directory');
      expect(await readdir(elsewhere)).toEqual([]);
    } finally {
      await rm(elsewhere, { recursive: true, force: true });
    }
  });

  it('a revoked token stops working', async () => {
    const { token, record } = await s.fp.store.tokens.create('someone', 'tmp');
    expect((await s.api('GET', '/instances', undefined, { authorization: `Bearer ${token}` })).status).toBe(200);
    await s.fp.store.tokens.revoke(record.id);
    expect((await s.api('GET', '/instances', undefined, { authorization: `Bearer ${token}` })).status).toBe(401);
  });

  it('malformed JSON is 400 INVALID_REQUEST', async () => {
    const r = await s.api('POST', '/instances', '{"name": ');
    expect(r.status).toBe(400);
    expect(r.body.error.code).toBe('INVALID_REQUEST');
  });

  it('an unknown route is 404 NOT_FOUND in the envelope', async () => {
    const r = await s.api('GET', '/no/such/thing');
    expect(r.status).toBe(404);
    expect(r.body.error.code).toBe('NOT_FOUND');
  });

  it('an oversized body is 413 PAYLOAD_TOO_LARGE', async () => {
    const r = await s.api('POST', '/instances', { name: 'x', metadata: { big: 'y'.repeat(1000) }, pad: 'z'.repeat(100 * 1024) });
    expect(r.status).toBe(413);
    expect(r.body.error.code).toBe('PAYLOAD_TOO_LARGE');
  });

  it('a schema violation is 400 with details', async () => {
    const r = await s.api('POST', '/instances', { name: 5 });
    expect(r.status).toBe(400);
    expect(r.body.error.code).toBe('INVALID_REQUEST');
    expect(r.body.error.details.issues[0]).toMatchObject({ where: 'body', path: '/name' });
  });

  it('serves the OpenAPI document and Swagger UI without a token', async () => {
    const spec = await s.api('GET', '/openapi.json', undefined, {});
    expect(spec.status).toBe(200);
    expect(spec.body.paths['/instances/{id}/exec']).toBeDefined();
    const ui = await fetch(`${s.url}/docs/`);
    expect(ui.status).toBe(200);
    expect(await ui.text()).toContain('swagger');
  });
});
