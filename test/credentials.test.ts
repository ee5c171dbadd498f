import { getSignature } from 'e2b';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';

// Every credential kind against every route of every face: each opens its one scope.
let s: TestServer;
beforeAll(async () => {
  s = await startServer();
});
afterAll(async () => s?.close());

/** E2B's control plane and envd: not in forkpoint's documents (their contract is E2B's). */
const E2B_CONTROL: [string, string][] = [
  ['POST', '/sandboxes'],
  ['GET', '/sandboxes'],
  ['POST', '/v2/sandboxes'],
  ['GET', '/v2/sandboxes'],
  ['GET', '/sandboxes/{id}'],
  ['DELETE', '/sandboxes/{id}'],
  ['POST', '/sandboxes/{id}/timeout'],
  ['POST', '/sandboxes/{id}/pause'],
  ['POST', '/sandboxes/{id}/connect'],
  ['POST', '/v2/sandboxes/{id}/connect'],
  ['POST', '/sandboxes/{id}/resume'],
  ['POST', '/sandboxes/{id}/snapshots'],
  ['GET', '/snapshots'],
  ['POST', '/sandboxes/{id}/fork'],
  ['GET', '/sandboxes/{id}/metrics'],
  // E2B's volumes (its SDKs' /volumes: `publisher: e2b`) and its volume content API.
  ['GET', '/volumes/{volumeID}'],
  ['GET', '/volumecontent/{volumeID}/path?path=/'],
  ['DELETE', '/volumecontent/{volumeID}/path?path=/f'],
  ['GET', '/volumecontent/{volumeID}/dir?path=/'],
  ['POST', '/volumecontent/{volumeID}/dir?path=/d'],
  ['GET', '/volumecontent/{volumeID}/file?path=/f'],
  ['PUT', '/volumecontent/{volumeID}/file?path=/f'],
];

/** Every owner's route: the documented ones (both faces), the Firecase face again under /v1,
 * and E2B's control plane. */
async function ownerRoutes(): Promise<[string, string][]> {
  const doc = (await s.api('GET', '/openapi.json', undefined, {})).body as { paths: Record<string, Record<string, { security?: unknown[] }>> };
  const routes: [string, string][] = [];
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      if (Array.isArray(op.security) && op.security.length === 0) continue; // public
      routes.push([method.toUpperCase(), path]);
      if (!path.startsWith('/api/')) routes.push([method.toUpperCase(), `/v1${path}`]);
    }
  }
  return [...routes, ...E2B_CONTROL];
}

const fill = (path: string, id: string) => path.replace(/\{(id|sandboxID)\}/g, id).replace(/\{port\}/g, '8080').replace(/\{[^}]+\}/g, 'x1');

async function call(method: string, path: string, headers: Record<string, string>) {
  const init: RequestInit = { method, headers: { ...headers, ...(method === 'GET' || method === 'DELETE' ? {} : { 'content-type': 'application/json' }) } };
  if (method !== 'GET' && method !== 'DELETE') init.body = '{}';
  const r = await fetch(`${s.url}${path}`, init);
  const text = await r.text();
  return { status: r.status, text };
}

describe('credentials × routes', () => {
  it('a sandbox\'s access token opens its envd and its own ports and nothing else, on every route of every face', async () => {
    const a = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 120 }, { 'x-api-key': s.token });
    const b = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 120 }, { 'x-api-key': s.token });
    expect(a.status).toBe(201);
    const A: string = a.body.sandboxID;
    const B: string = b.body.sandboxID;
    const access = { 'e2b-sandbox-id': A, 'x-access-token': a.body.envdAccessToken as string };
    try {
      const routes = await ownerRoutes();
      expect(routes.length).toBeGreaterThan(100);
      const opened: string[] = [];
      for (const [method, path] of routes) {
        for (const id of [A, B]) {
          const r = await call(method, fill(path, id), access);
          if (r.status !== 403) opened.push(`${method} ${fill(path, id)} → ${r.status} ${r.text.slice(0, 120)}`);
        }
      }
      expect(opened).toEqual([]);
      // Nothing was done on the way: both sandboxes are there, running, with no checkpoint.
      for (const id of [A, B]) {
        expect((await s.api('GET', `/instances/${id}`)).body.status).toBe('running');
        expect((await s.api('GET', `/instances/${id}/checkpoints`)).body.items).toEqual([]);
      }
      expect((await s.api('GET', '/instances')).body.items.map((i: { id: string }) => i.id).sort()).toEqual([A, B].sort());

      // What it does open: its own envd and its own ports.
      expect((await call('GET', '/health', access)).status).toBe(204);
      expect((await call('GET', '/files?path=/etc/passwd', access)).status).toBe(200);
      expect((await call('POST', '/process.Process/List', access)).status).toBe(200);
      expect((await call('GET', `/instances/${A}/ports/8080/`, access)).status).toBe(503); // in, and nothing listens
      expect((await call('GET', `/instances/${B}/ports/8080/`, access)).status).toBe(403);
      // And with another sandbox's id it is no credential at all.
      const crossed = { 'e2b-sandbox-id': B, 'x-access-token': access['x-access-token'] };
      for (const [method, path] of [['GET', '/health'], ['GET', '/files?path=/etc/passwd'], ['POST', '/process.Process/List'], ['GET', `/instances/${B}/ports/8080/`]] as const) {
        expect((await call(method, path, crossed)).status, path).toBe(401);
      }
      // An API token is not an envd credential either: envd is the sandbox's own.
      expect((await call('POST', '/process.Process/List', { 'x-api-key': s.token })).status).toBe(403);
    } finally {
      for (const id of [A, B]) await s.api('DELETE', `/instances/${id}`);
    }
  });

  it('a sandbox\'s traffic token (E2B-Traffic-Access-Token) opens its own ports and nothing else, on every route', async () => {
    const a = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 120 }, { 'x-api-key': s.token });
    const b = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 120 }, { 'x-api-key': s.token });
    const A: string = a.body.sandboxID;
    const B: string = b.body.sandboxID;
    const traffic = { 'e2b-sandbox-id': A, 'e2b-traffic-access-token': a.body.trafficAccessToken as string };
    try {
      const opened: string[] = [];
      for (const [method, path] of await ownerRoutes()) {
        for (const id of [A, B]) {
          const r = await call(method, fill(path, id), traffic);
          if (r.status !== 401) opened.push(`${method} ${fill(path, id)} → ${r.status}`);
        }
      }
      expect(opened).toEqual([]);
      for (const [method, path] of [['GET', '/health'], ['GET', '/files?path=/etc/passwd'], ['POST', '/process.Process/List']] as const) {
        expect((await call(method, path, traffic)).status, path).toBe(401);
        expect((await call(method, path, { 'e2b-sandbox-id': A, 'x-access-token': traffic['e2b-traffic-access-token'] })).status, path).toBe(401);
      }
      expect((await call('GET', `/instances/${A}/ports/8080/`, traffic)).status).toBe(503); // in, and nothing listens
      expect((await call('GET', `/instances/${B}/ports/8080/`, traffic)).status).toBe(403);
      expect((await call('GET', `/instances/${B}/ports/8080/`, { ...traffic, 'e2b-sandbox-id': B })).status).toBe(401);
    } finally {
      for (const id of [A, B]) await s.api('DELETE', `/instances/${id}`);
    }
  });

  it('a volume\'s content token (E2B\'s volume token) opens that volume\'s files and nothing else, on every route', async () => {
    const e2b = { publisher: 'e2b', 'x-api-key': s.token };
    const a = await s.api('POST', '/volumes', { name: 'cred-a' }, e2b);
    const b = await s.api('POST', '/volumes', { name: 'cred-b' }, e2b);
    expect([a.status, b.status]).toEqual([201, 201]);
    const token = { authorization: `Bearer ${a.body.token as string}` };
    try {
      const opened: string[] = [];
      for (const [method, path] of await ownerRoutes()) {
        for (const id of [a.body.volumeID as string, b.body.volumeID as string]) {
          const filled = fill(path.replace('{volumeID}', id), id);
          const r = await call(method, filled, token);
          const own = id === a.body.volumeID && filled.startsWith('/volumecontent/');
          if (!own && r.status !== 401 && r.status !== 403) opened.push(`${method} ${filled} → ${r.status} ${r.text.slice(0, 120)}`);
        }
      }
      expect(opened).toEqual([]);
      expect((await call('GET', `/volumecontent/${a.body.volumeID}/dir?path=/`, token)).status).toBe(200);
      expect((await call('GET', `/volumecontent/${b.body.volumeID}/dir?path=/`, token)).status).toBe(401);
      // An API token opens the content of its owner's volumes too; a sandbox's access token none.
      expect((await call('GET', `/volumecontent/${b.body.volumeID}/dir?path=/`, { 'x-api-key': s.token })).status).toBe(200);
    } finally {
      for (const v of [a, b]) await s.api('DELETE', `/volumes/${v.body.volumeID}`, undefined, e2b);
    }
  });

  it('a signed file link (OpenComputer\'s downloadUrl) reads its file and opens nothing else, on every route', async () => {
    const inst = await s.instance();
    try {
      await s.exec(inst.id, { command: 'echo secret-ish > /root/f' });
      const made = await s.api('POST', `/api/sandboxes/${inst.id}/files/download-url`, { path: '/root/f', expiresIn: 60 });
      expect(made.status, JSON.stringify(made.body)).toBe(200);
      const link = new URL(made.body.url as string);
      const signature = link.searchParams.get('signature')!;
      const opened: string[] = [];
      for (const [method, path] of await ownerRoutes()) {
        const url = fill(path, inst.id);
        const r = await call(method, `${url}${url.includes('?') ? '&' : '?'}path=%2Froot%2Ff&signature=${encodeURIComponent(signature)}`, {});
        if (r.status !== 401 && !(method === 'GET' && path === '/api/sandboxes/{id}/files/signed')) opened.push(`${method} ${url} → ${r.status}`);
      }
      expect(opened).toEqual([]);
      expect((await call('GET', `${link.pathname}${link.search}`, {})).text).toBe('secret-ish\n');
    } finally {
      await s.api('DELETE', `/instances/${inst.id}`);
    }
  });

  it('a URL E2B\'s SDK signed (downloadUrl) reads its file on envd\'s /files and opens nothing else, on every route', async () => {
    const made = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 120, secure: true }, { 'x-api-key': s.token });
    expect(made.status).toBe(201);
    const id: string = made.body.sandboxID;
    try {
      await s.exec(id, { command: 'echo secret-ish > /tmp/f' });
      const { signature, expiration } = await getSignature({ path: '/tmp/f', operation: 'read', user: undefined, expirationInSeconds: 60, envdAccessToken: made.body.envdAccessToken });
      const query = `path=%2Ftmp%2Ff&signature=${encodeURIComponent(signature)}&signature_expiration=${expiration}`;
      const opened: string[] = [];
      for (const [method, path] of [...(await ownerRoutes()), ['POST', '/files'] as [string, string]]) {
        const url = fill(path, id);
        const r = await call(method, `${url}${url.includes('?') ? '&' : '?'}${query}`, {});
        if (r.status !== 401) opened.push(`${method} ${url} → ${r.status}`);
      }
      expect(opened).toEqual([]);
      expect((await call('GET', `/files?${query}`, {})).text).toBe('secret-ish\n');
    } finally {
      await s.api('DELETE', `/instances/${id}`);
    }
  });

  it('a preview link opens its port and nothing else, on every route', async () => {
    const inst = await s.instance();
    try {
      const link = await s.api('POST', `/instances/${inst.id}/ports/8080/preview`, { ttl_s: 60 });
      expect(link.status).toBe(200);
      const signed = new URL(link.body.url as string).searchParams.get('fp_preview')!;
      expect(signed).toBeTruthy();
      const opened: string[] = [];
      for (const [method, path] of await ownerRoutes()) {
        const url = fill(path, inst.id);
        const r = await call(method, `${url}${url.includes('?') ? '&' : '?'}fp_preview=${signed}`, { cookie: `fp_preview=${signed}` });
        if (r.status !== 401) opened.push(`${method} ${url} → ${r.status}`);
      }
      expect(opened).toEqual([]);
      // On its own host name it opens its port, and no other.
      const on = async (host: string) => (await request(`${s.url}/?fp_preview=${signed}`, { headers: { host } })).statusCode;
      expect(await on(`8080-${inst.id}.localhost`)).toBe(503); // in, and nothing listens
      expect(await on(`8081-${inst.id}.localhost`)).toBe(401);
      expect((await call('GET', `/instances/${inst.id}/ports/8080/?fp_preview=${signed}`, {})).status).toBe(401); // not under the API's origin
    } finally {
      await s.api('DELETE', `/instances/${inst.id}`);
    }
  });

  it('revoking an API token revokes the access tokens and preview links it was given; another token\'s live on', async () => {
    const { token, record } = await s.fp.store.tokens.create('default', 'short-lived');
    const made = await s.api('POST', '/sandboxes', { templateID: 'base', timeout: 120 }, { 'x-api-key': token });
    expect(made.status).toBe(201);
    const id: string = made.body.sandboxID;
    try {
      const viaOwn = (await s.api('POST', `/sandboxes/${id}/connect`, { timeout: 120 }, { 'x-api-key': s.token })).body.envdAccessToken as string;
      const list = (t: string) => call('POST', '/process.Process/List', { 'e2b-sandbox-id': id, 'x-access-token': t });
      expect((await list(made.body.envdAccessToken)).status).toBe(200);
      expect((await list(viaOwn)).status).toBe(200);
      const link = async (t: string) => new URL((await s.api('POST', `/instances/${id}/ports/8080/preview`, { ttl_s: 60 }, { authorization: `Bearer ${t}` })).body.url as string);
      const [itsLink, ownLink] = [await link(token), await link(s.token)];
      const open = async (l: URL) => (await request(`${s.url}/${l.search}`, { headers: { host: l.host } })).statusCode;
      expect([await open(itsLink), await open(ownLink)]).toEqual([503, 503]); // in, and nothing listens
      await s.fp.store.tokens.revoke(record.id);
      expect([await open(itsLink), await open(ownLink)]).toEqual([401, 503]);
      expect((await list(made.body.envdAccessToken)).status).toBe(401);
      expect((await call('GET', `/instances/${id}/ports/8080/`, { 'e2b-sandbox-id': id, 'x-access-token': made.body.envdAccessToken })).status).toBe(401);
      expect((await list(viaOwn)).status).toBe(200);
    } finally {
      await s.api('DELETE', `/instances/${id}`);
    }
  });

  it('the cluster\'s nodes (addresses, load) are an operator\'s to see, not every tenant\'s', async () => {
    const { token } = await s.fp.store.tokens.create('tenant', 'test');
    for (const path of ['/nodes', '/v1/nodes']) {
      const tenant = await s.api('GET', path, undefined, { authorization: `Bearer ${token}` });
      expect(tenant.status).toBe(403);
      expect(tenant.body.error.code).toBe('FORBIDDEN');
      expect(JSON.stringify(tenant.body)).not.toContain('127.0.0.1');
      const operator = await s.api('GET', path);
      expect(operator.status).toBe(200);
      expect(Array.isArray(operator.body.nodes)).toBe(true);
    }
  });
});
