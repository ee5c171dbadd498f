import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.js';
import { Forkpoint } from '../../src/core/forkpoint.js';
import { buildApp } from '../../src/http/app.js';
import { VERSION } from '../../src/version.js';
import { FakeEngine } from '../fakes/fake-engine.js';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';

// Each face's envelope and its auth, through `app.inject`: no root, no engine started, no
// sandbox, no socket.
let dir: string;
let fp: Forkpoint;
let app: FastifyInstance;
let owner: string;
let tenant: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'fp-unit-'));
  fp = await Forkpoint.open(loadConfig({ env: {}, flags: { dataDir: dir, bodyLimitBytes: 4096, networking: 'off' } }), pino({ level: 'silent' }), VERSION, () => new FakeEngine());
  // Started (no network: a fake engine's): E2B's volume tokens are signed with the server's key.
  await fp.start();
  owner = (await fp.store.tokens.create('default', 'unit')).token;
  tenant = (await fp.store.tokens.create('tenant', 'unit')).token;
  app = await buildApp({ forkpoint: fp, logger: false, bodyLimitBytes: 4096 });
  await app.ready();
});
afterAll(async () => {
  await app?.close();
  await fp?.close();
  await rm(dir, { recursive: true, force: true });
});

const call = async (method: 'GET' | 'POST' | 'PUT' | 'DELETE', url: string, headers: Record<string, string> = {}, payload?: string | object) => {
  const r = await app.inject({ method, url, headers: { ...(payload !== undefined ? { 'content-type': 'application/json' } : {}), ...headers }, ...(payload !== undefined ? { payload } : {}) });
  return { status: r.statusCode, body: r.body ? (JSON.parse(r.body) as Record<string, any>) : null, length: Number(r.headers['content-length']), raw: r.body };
};
const bearer = (t: string) => ({ authorization: `Bearer ${t}` });

describe('the Firecase face: {"error": {"code", "message", "details"}}', () => {
  it('answers every failure in its envelope with a stable code, under / and /v1', async () => {
    for (const base of ['', '/v1']) {
      const none = await call('GET', `${base}/instances`);
      expect([none.status, none.body?.error.code]).toEqual([401, 'UNAUTHENTICATED']);
      expect((await call('GET', `${base}/instances`, bearer(owner))).body).toEqual({ items: [], next_cursor: null });
      const missing = await call('GET', `${base}/instances/inst_nope`, bearer(owner));
      expect([missing.status, missing.body?.error]).toEqual([404, { code: 'NOT_FOUND', message: 'instance inst_nope not found', details: { instance: 'inst_nope' } }]);
      const invalid = await call('POST', `${base}/instances`, bearer(owner), { name: 5 });
      expect([invalid.status, invalid.body?.error.code, invalid.body?.error.details.issues[0].path]).toEqual([400, 'INVALID_REQUEST', '/name']);
      const malformed = await call('POST', `${base}/instances`, bearer(owner), '{"name": ');
      expect([malformed.status, malformed.body?.error.code]).toEqual([400, 'INVALID_REQUEST']);
      const large = await call('POST', `${base}/instances`, bearer(owner), { metadata: { big: 'x'.repeat(5000) } });
      expect([large.status, large.body?.error.code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
      const nodes = await call('GET', `${base}/nodes`, bearer(tenant));
      expect([nodes.status, nodes.body?.error.code]).toEqual([403, 'FORBIDDEN']);
    }
    const notDurable = await call('GET', '/instances/inst_x/checkpoints/ckpt_y?wait=durable', bearer(owner));
    expect([notDurable.status, notDurable.body?.error.details]).toEqual([409, { reason: 'NO_OBJECT_STORE' }]);
    const unknown = await call('GET', '/no/such/route', bearer(owner));
    expect([unknown.status, unknown.body?.error.code]).toEqual([404, 'NOT_FOUND']);
  });

  it('an answer carries exactly the bytes it announces', async () => {
    for (const [method, url] of [['GET', '/instances'], ['GET', '/instances/inst_nope'], ['GET', '/openapi.json']] as const) {
      const r = await call(method, url, bearer(owner));
      expect(r.length, url).toBe(Buffer.byteLength(r.raw));
    }
  });
});

describe('the OpenComputer face: {"error": "message"}', () => {
  it('answers its failures in its own envelope', async () => {
    const none = await call('GET', '/api/sandboxes');
    expect([none.status, typeof none.body?.error]).toEqual([401, 'string']);
    const missing = await call('GET', '/api/sandboxes/inst_nope', bearer(owner));
    expect([missing.status, missing.body]).toEqual([404, { error: 'instance inst_nope not found' }]);
    const invalid = await call('POST', '/api/sandboxes', bearer(owner), { timeout: 'soon' });
    expect([invalid.status, typeof invalid.body?.error]).toEqual([400, 'string']);
    expect((await call('GET', '/api/sandboxes', bearer(owner))).body).toEqual([]);
  });
});

describe('OpenComputer\'s secret stores', () => {
  it('keep values to themselves, check what they are given, and are each owner\'s own', async () => {
    const key = { 'x-api-key': owner };
    const made = await call('POST', '/api/secret-stores', key, { name: 'unit-store', egressAllowlist: ['API.example.com', '10.0.0.0/8'] });
    expect([made.status, made.body?.name, made.body?.egressAllowlist]).toEqual([201, 'unit-store', ['api.example.com', '10.0.0.0/8']]);
    const id = made.body!.id as string;
    expect((await call('POST', '/api/secret-stores', key, { name: 'unit-store' })).status).toBe(409);
    expect((await call('POST', '/api/secret-stores', key, { name: 'bad name!' })).status).toBe(400);
    const other = await call('POST', '/api/secret-stores', key, { name: 'other-store' });
    expect((await call('PUT', `/api/secret-stores/${id}`, key, { name: 'other-store' })).status).toBe(409);
    expect((await call('DELETE', `/api/secret-stores/${other.body!.id}`, key)).status).toBe(204);
    expect((await call('POST', '/api/secret-stores', key, { name: 'x', egressAllowlist: ['http://nope'] })).status).toBe(400);
    const set = await call('PUT', `/api/secret-stores/${id}/secrets/API_KEY`, key, { value: 'sk-unit-secret', allowedHosts: ['api.example.com'] });
    expect([set.status, set.body]).toEqual([200, { name: 'API_KEY', status: 'set', refreshed: 0 }]);
    expect((await call('PUT', `/api/secret-stores/${id}/secrets/1BAD`, key, { value: 'v' })).status).toBe(400);
    expect((await call('PUT', `/api/secret-stores/${id}/secrets/OK`, key, { value: 'line\nbreak' })).status).toBe(400);
    expect((await call('PUT', `/api/secret-stores/${id}/secrets/OK`, key, { value: 'v', allowedHosts: ['10.0.0.1'] })).status).toBe(400); // a host name, not an address
    const listed = await call('GET', `/api/secret-stores/${id}/secrets`, key);
    expect(listed.body).toEqual([expect.objectContaining({ name: 'API_KEY', storeId: id, allowedHosts: ['api.example.com'] })]);
    for (const url of ['/api/secret-stores', `/api/secret-stores/${id}`, `/api/secret-stores/${id}/secrets`]) expect((await call('GET', url, key)).raw).not.toContain('sk-unit-secret');
    // Another owner's store does not exist for them, not even to overwrite a secret in.
    const theirs = { 'x-api-key': tenant };
    expect((await call('GET', `/api/secret-stores/${id}`, theirs)).status).toBe(404);
    expect((await call('PUT', `/api/secret-stores/${id}/secrets/API_KEY`, theirs, { value: 'stolen' })).status).toBe(404);
    expect((await call('GET', '/api/secret-stores', theirs)).body).toEqual([]);
    // Without the sandboxes' network (this server has none) a secret cannot reach its host: refused.
    const sb = await call('POST', '/api/sandboxes', key, { templateID: 'default', secretStore: 'unit-store' });
    expect([sb.status, sb.body?.error], JSON.stringify(sb.body)).toEqual([400, expect.stringMatching(/network/)]);
    expect((await call('DELETE', `/api/secret-stores/${id}/secrets/API_KEY`, key)).status).toBe(204);
    expect((await call('DELETE', `/api/secret-stores/${id}/secrets/API_KEY`, key)).status).toBe(404);
    expect((await call('DELETE', `/api/secret-stores/${id}`, key)).status).toBe(204);
    expect((await call('GET', `/api/secret-stores/${id}`, key)).status).toBe(404);
  });
});

describe('the E2B face: {"code": status, "message"}', () => {
  it('answers its control plane and envd failures as E2B does', async () => {
    const none = await call('GET', '/sandboxes');
    expect([none.status, none.body?.code, typeof none.body?.message]).toEqual([401, 401, 'string']);
    const missing = await call('GET', '/sandboxes/inst_nope', { 'x-api-key': owner });
    expect([missing.status, missing.body?.code]).toEqual([404, 404]);
    const invalid = await call('POST', '/sandboxes', { 'x-api-key': owner }, {});
    expect([invalid.status, invalid.body?.code]).toEqual([400, 400]);
    const envd = await call('GET', '/files?path=/etc/passwd', { 'x-api-key': owner });
    expect([envd.status, envd.body?.code]).toEqual([403, 403]);
    // A sandbox id that names nothing is E2B's proxy's 502, answered before any token is read.
    const gone = await call('GET', '/files?path=/etc/passwd', { 'e2b-sandbox-id': 'inst_nope', 'x-access-token': 'tok_x.y' });
    expect([gone.status, gone.body?.code]).toEqual([502, 502]);
    expect((await call('GET', '/v2/sandboxes', { 'x-api-key': owner })).body).toEqual([]);
    // envd's processes and files speak Connect: its error codes are Connect's.
    const rpc = await call('POST', '/process.Process/List', { 'x-api-key': owner }, {});
    expect([rpc.status, rpc.body]).toEqual([403, { code: 'permission_denied', message: expect.any(String) }]);
    const rpcNone = await call('POST', '/filesystem.Filesystem/Stat', {}, { path: '/' });
    expect([rpcNone.status, rpcNone.body?.code]).toEqual([401, 'unauthenticated']);
  });

  it('refuses a forged access token on a sandbox that exists', async () => {
    const n = await startFakeNode();
    try {
      const made = await n.call('POST', '/sandboxes', { templateID: 'default' }, { 'x-api-key': n.token });
      expect(made.status, made.raw).toBe(201);
      const forged = await n.call('GET', '/files?path=/etc/passwd', undefined, { authorization: '', 'e2b-sandbox-id': made.body.sandboxID, 'x-access-token': 'tok_x.y' });
      expect([forged.status, forged.body?.code]).toEqual([401, 401]);
    } finally {
      await n.close();
    }
  });
});

/** An E2B sandbox on a fake node with a file in /w (the fake's directories are what holds
 * files): envd's filesystem calls and file writes with its access token. */
async function envdSandbox(n: FakeNode) {
  const made = await n.call('POST', '/sandboxes', { templateID: 'default' }, { 'x-api-key': n.token });
  expect(made.status, made.raw).toBe(201);
  const envd = { authorization: '', 'e2b-sandbox-id': made.body.sandboxID, 'x-access-token': made.body.envdAccessToken, 'connect-protocol-version': '1' };
  const write = (path: string) => n.app.inject({ method: 'POST', url: `/files?path=${path}`, headers: { ...envd, 'content-type': 'application/octet-stream' }, payload: 'x' });
  expect((await write('/w/a.txt')).statusCode).toBe(200);
  return {
    sandbox: n.engine.sandbox(made.body.sandboxID)!,
    rpc: (method: string, body: object) => n.call('POST', `/filesystem.Filesystem/${method}`, body, envd),
    write,
  };
}

describe('envd\'s polled watcher (E2B\'s sync Python SDK)', () => {
  it('a fetch right after a write through envd has every event of it, in order, each with its entry, however long the entries take to look up (it had those described by then: the chmod, not the write)', async () => {
    const n = await startFakeNode();
    try {
      const { sandbox, rpc, write } = await envdSandbox(n);
      const created = await rpc('CreateWatcher', { path: '/w', includeEntry: true });
      expect(created.status, created.raw).toBe(200);
      sandbox.statDelayMs = 20;
      const put = await write('/w/f.txt');
      expect(put.statusCode, put.body).toBe(200);
      const got = await rpc('GetWatcherEvents', { watcherId: created.body.watcherId });
      const events = (got.body.events ?? []) as { type: string; name: string; entry?: { name: string } }[];
      expect(events.map((e) => [e.type, e.name, e.entry?.name])).toEqual([
        ['EVENT_TYPE_CREATE', 'f.txt', 'f.txt'],
        ['EVENT_TYPE_CHMOD', 'f.txt', 'f.txt'],
        ['EVENT_TYPE_WRITE', 'f.txt', 'f.txt'],
      ]);
    } finally {
      await n.close();
    }
  });
});

describe('a write through the API and the watches of its sandbox', () => {
  it('answers once the watches that report it have told it, however late their events come (a poll the moment it answered found nothing)', async () => {
    const n = await startFakeNode();
    try {
      const { sandbox, rpc, write } = await envdSandbox(n);
      const watchers = [await rpc('CreateWatcher', { path: '/w' }), await rpc('CreateWatcher', { path: '/', recursive: true })];
      sandbox.watchDelayMs = 30;
      expect((await write('/w/f.txt')).statusCode).toBe(200);
      const [here, below] = await Promise.all(watchers.map(async (w) => ((await rpc('GetWatcherEvents', { watcherId: w.body.watcherId })).body.events ?? []) as { type: string; name: string }[]));
      expect(here!.map((e) => `${e.type} ${e.name}`)).toEqual(['EVENT_TYPE_CREATE f.txt', 'EVENT_TYPE_CHMOD f.txt', 'EVENT_TYPE_WRITE f.txt']);
      expect(below!.map((e) => `${e.type} ${e.name}`)).toEqual(['EVENT_TYPE_CREATE w/f.txt', 'EVENT_TYPE_CHMOD w/f.txt', 'EVENT_TYPE_WRITE w/f.txt']);
    } finally {
      await n.close();
    }
  });
});

describe('one path, two faces: /volumes', () => {
  it('answers E2B\'s SDKs (`publisher: e2b`) in E2B\'s shapes and everyone else in forkpoint\'s, whichever token header', async () => {
    const e2b = { publisher: 'e2b', 'x-api-key': owner };
    const made = await call('POST', '/volumes', e2b, { name: 'Shared_1' });
    expect(made.status, made.raw).toBe(201);
    expect(Object.keys(made.body!).sort()).toEqual(['name', 'token', 'volumeID']);
    expect((await call('GET', '/volumes', e2b)).body).toEqual([{ volumeID: made.body!.volumeID, name: 'Shared_1' }]);
    expect((await call('GET', `/volumes/${made.body!.volumeID}`, e2b)).body).toEqual(made.body);
    // forkpoint's own, with either header: by name, its envelope.
    for (const headers of [bearer(owner), { 'x-api-key': owner }]) {
      const mine = await call('GET', '/volumes', headers);
      expect(mine.body!.items.map((v: { name: string }) => v.name)).toEqual(['Shared_1']);
      expect((await call('GET', '/volumes/Shared_1', headers)).body!.id).toBe(made.body!.volumeID);
    }
    // Another owner's SDK: E2B's not-found, in E2B's envelope.
    const theirs = await call('GET', `/volumes/${made.body!.volumeID}`, { publisher: 'e2b', 'x-api-key': tenant });
    expect([theirs.status, theirs.body]).toEqual([404, { code: 404, message: `volume ${made.body!.volumeID} not found` }]);
    expect((await call('DELETE', `/volumes/${made.body!.volumeID}`, e2b)).status).toBe(204);
    expect((await call('GET', '/volumes', e2b)).body).toEqual([]);
  });
});

describe('public routes', () => {
  it('serve the documents and health without a token; readiness says what is missing', async () => {
    const doc = await call('GET', '/openapi.json');
    expect([doc.status, doc.body?.openapi]).toEqual([200, '3.1.0']);
    const health = await call('GET', '/healthz');
    expect([health.status, health.body?.version]).toEqual([200, VERSION]);
    const ready = await call('GET', '/readyz');
    expect(ready.body?.checks.database).toBe(true);
    expect(ready.status).toBe(ready.body?.ready ? 200 : 503);
  });
});
