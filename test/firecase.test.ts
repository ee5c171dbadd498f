/**
 * Issue 9: the Firecase-style face behaves as Firecase's does, and the OpenComputer face answers
 * as OpenComputer does, where they used to differ.
 */
import { createHash, randomBytes } from 'node:crypto';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';

let s: TestServer;
let id: string;
beforeAll(async () => {
  s = await startServer();
  id = (await s.instance({ name: 'fidelity' })).id;
});
afterAll(async () => s?.close());

/** A request exactly as given: headers, raw body (or none). */
async function raw(method: string, path: string, opts: { headers?: Record<string, string>; body?: string | Buffer; auth?: boolean } = {}) {
  const res = await request(s.url + path, {
    method: method as 'GET',
    headers: { ...(opts.auth === false ? {} : { authorization: `Bearer ${s.token}` }), ...opts.headers },
    body: opts.body,
  });
  const buf = Buffer.from(await res.body.arrayBuffer());
  const type = String(res.headers['content-type'] ?? '');
  return { status: res.statusCode, type, buf, json: type.includes('json') && buf.length ? JSON.parse(buf.toString()) : undefined };
}
const JSON_HEADER = { 'content-type': 'application/json' };

describe('fork answers as Firecase\'s does', () => {
  it('without count: 201 and the new instance itself; with count: {instances}, the name a prefix', async () => {
    const ck = (await s.api('POST', `/instances/${id}/checkpoints?wait=true`, {})).body;
    const one = await s.api('POST', `/instances/${id}/fork`, { checkpoint_id: ck.id, name: 'single' });
    expect(one.status).toBe(201);
    expect(one.body).toMatchObject({ name: 'single', status: 'running', source_checkpoint_id: ck.id });
    expect(one.body.instances).toBeUndefined();
    const many = await s.api('POST', `/instances/${id}/fork`, { checkpoint_id: ck.id, name: 'crew', count: 3 });
    expect(many.status).toBe(201);
    expect(many.body.instances.map((i: { name: string }) => i.name)).toEqual(['crew-1', 'crew-2', 'crew-3']);
    const hostnames = await Promise.all(many.body.instances.map((i: { id: string }) => s.exec(i.id, { command: 'hostname' })));
    expect(hostnames.map((h) => h.stdout)).toEqual(['crew-1\n', 'crew-2\n', 'crew-3\n']);
    for (const i of [one.body, ...many.body.instances]) await s.api('DELETE', `/instances/${i.id}`);
  });
});

describe('bodies', () => {
  it('Content-Type: application/json with an empty body is accepted everywhere', async () => {
    const inst = (await raw('POST', '/instances', { headers: JSON_HEADER })).json;
    expect(inst.status).toBe('running');
    expect((await raw('POST', `/instances/${inst.id}/stop`, { headers: JSON_HEADER })).json.status).toBe('stopped');
    expect((await raw('POST', `/instances/${inst.id}/start`, { headers: JSON_HEADER })).json.status).toBe('running');
    const ck = await raw('POST', `/instances/${inst.id}/checkpoints?wait=true`, { headers: JSON_HEADER });
    expect(ck.json.status).toBe('ready');
    expect((await raw('DELETE', `/instances/${inst.id}/checkpoints/${ck.json.id}`, { headers: JSON_HEADER })).status).toBe(204);
    expect((await raw('DELETE', `/instances/${inst.id}`, { headers: JSON_HEADER })).status).toBe(204);
  });

  it('a checkpoint, a fork and a create with no body at all', async () => {
    const ck = await raw('POST', `/instances/${id}/checkpoints?wait=true`);
    expect(ck.status).toBe(200);
    expect(ck.json.status).toBe('ready');
    const fork = await raw('POST', `/instances/${id}/fork`);
    expect(fork.status).toBe(201);
    expect(fork.json.status).toBe('running');
    const made = await raw('POST', '/instances');
    expect(made.status).toBe(201);
    for (const x of [fork.json.id, made.json.id]) await s.api('DELETE', `/instances/${x}`);
  });

  it('malformed JSON and a wrong field are a 400 with a stable code', async () => {
    const bad = await raw('POST', '/instances', { headers: JSON_HEADER, body: '{nope' });
    expect(bad.status).toBe(400);
    expect(bad.json.error.code).toBe('INVALID_REQUEST');
    const wrong = await s.api('POST', `/instances/${id}/fork`, { count: 0 });
    expect(wrong.status).toBe(400);
  });
});

describe('routes Firecase has', () => {
  it('every route also answers under /v1', async () => {
    const made = await s.api('POST', '/v1/instances', { name: 'versioned' });
    expect(made.status).toBe(201);
    expect((await s.api('POST', `/v1/instances/${made.body.id}/exec`, { command: 'echo v1' })).body.stdout).toBe('v1\n');
    expect((await s.api('GET', `/v1/instances/${made.body.id}`)).body.name).toBe('versioned');
    const ck = await s.api('POST', `/v1/instances/${made.body.id}/checkpoints?wait=true`, {});
    expect(ck.body.status).toBe('ready');
    expect((await s.api('GET', `/v1/instances/${made.body.id}/checkpoints`)).body.items).toHaveLength(1);
    expect((await s.api('DELETE', `/v1/instances/${made.body.id}`)).status).toBe(204);
    expect((await s.api('GET', '/v1/nothing')).status).toBe(404);
  });

  it('PATCH renames and replaces metadata; the new name is the hostname of the next boot', async () => {
    const inst = await s.instance({ name: 'before-rename', metadata: { a: '1' } });
    const r = await s.api('PATCH', `/instances/${inst.id}`, { name: 'after-rename', metadata: { b: '2' } });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ name: 'after-rename', metadata: { b: '2' } });
    expect((await s.api('GET', `/instances/${inst.id}`)).body.name).toBe('after-rename');
    expect((await s.api('PATCH', `/instances/${inst.id}`, { name: 'Not A Hostname' })).status).toBe(400);
    await s.api('DELETE', `/instances/${inst.id}/vm`);
    expect((await s.api('GET', `/instances/${inst.id}`)).body.status).toBe('stopped');
    expect((await s.api('POST', `/instances/${inst.id}/vm`)).body.status).toBe('running');
    expect((await s.exec(inst.id, { command: 'hostname' })).stdout).toBe('after-rename\n');
    await s.api('DELETE', `/instances/${inst.id}`);
  });
});

describe('files on the Firecase face', () => {
  it('write, read back byte for byte, stat, list, mkdir, delete; paths confined to the sandbox', async () => {
    const bytes = randomBytes(5 * 1024 * 1024 + 3); // more than one piece each way
    const put = await raw('PUT', `/instances/${id}/files?path=/data/nested/blob.bin`, { body: bytes, headers: { 'content-type': 'application/octet-stream' } });
    expect(put.status).toBe(200);
    expect(put.json).toEqual({ path: '/data/nested/blob.bin', bytes: bytes.length });
    const got = await raw('GET', `/instances/${id}/files?path=/data/nested/blob.bin`);
    expect(got.type).toBe('application/octet-stream');
    expect(createHash('sha256').update(got.buf).digest('hex')).toBe(createHash('sha256').update(bytes).digest('hex'));
    const st = await s.api('GET', `/instances/${id}/files/stat?path=/data/nested/blob.bin`);
    expect(st.body).toMatchObject({ path: '/data/nested/blob.bin', type: 'file', size: bytes.length, mode: 0o644, target: null });
    expect((await s.api('POST', `/instances/${id}/files/mkdir`, { path: '/data/nested/sub/deeper' })).status).toBe(204);
    await s.exec(id, { command: 'ln -s /etc/hostname /data/nested/link' });
    const list = await s.api('GET', `/instances/${id}/files/list?path=/data/nested`);
    expect(list.body.items.map((e: { name: string; type: string }) => `${e.name}:${e.type}`).sort()).toEqual(['blob.bin:file', 'link:link', 'sub:dir']);
    expect((await s.api('GET', `/instances/${id}/files/stat?path=/data/nested/link`)).body).toMatchObject({ type: 'link', target: '/etc/hostname' });
    // A symlink to a host path leads to the sandbox's own file of that name, never the host's.
    await s.exec(id, { command: 'ln -sf /proc/1/root/etc/shadow /data/escape; echo inside > /etc/motd' });
    const esc = await raw('GET', `/instances/${id}/files?path=/data/escape`);
    expect(esc.buf.toString()).not.toMatch(/root:\$/);
    expect((await raw('GET', `/instances/${id}/files?path=/data/nested`)).status).toBe(400); // a directory
    expect((await raw('GET', `/instances/${id}/files?path=/no/such`)).status).toBe(404);
    expect((await raw('DELETE', `/instances/${id}/files?path=/data/nested/blob.bin`)).status).toBe(204);
    expect((await raw('GET', `/instances/${id}/files?path=/data/nested/blob.bin`)).status).toBe(404);
    expect((await raw('GET', `/instances/${id}/files?path=relative`)).status).toBe(400);
  });

  it('an upload that fails part-way leaves no file and no temporary one behind', async () => {
    // A stream that breaks after a few MiB: the connection is cut mid-body.
    const { Readable } = await import('node:stream');
    let sent = 0;
    const body = new Readable({
      read() {
        if (sent > 6 << 20) return this.destroy(new Error('client gave up'));
        sent += 1 << 20;
        this.push(randomBytes(1 << 20));
      },
    });
    await request(`${s.url}/instances/${id}/files?path=/data/partial.bin`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/octet-stream' },
      body,
    }).catch(() => undefined);
    await new Promise((r) => setTimeout(r, 300));
    const left = await s.exec(id, { command: 'ls -a /data' });
    expect(left.stdout).not.toMatch(/partial/);
    // The upload's own failure is its client's (INVALID_REQUEST, the cause kept), not a 500.
    const owner = (await s.fp.store.instances.get(id))!.owner;
    const cut = async function* () {
      yield randomBytes(1 << 20);
      throw Object.assign(new Error('aborted'), { code: 'ECONNRESET' });
    };
    const failed = await s.fp.files.writeStream(owner, id, '/data/partial.bin', cut()).catch((e: unknown) => e);
    expect(failed).toMatchObject({ code: 'INVALID_REQUEST', cause: { code: 'ECONNRESET' } });
    expect((await s.exec(id, { command: 'ls -a /data' })).stdout).not.toMatch(/partial/);
  });
});

describe('lineage after retention', () => {
  it('a checkpoint\'s parent_id never points at one that retention deleted', async () => {
    const inst = await s.instance({ name: 'retained', max_checkpoints: 2 });
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const c = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { label: `c${i}`, retention: { mode: 'delete_oldest' } })).body;
      expect(c.status).toBe('ready');
      ids.push(c.id);
    }
    const kept = (await s.api('GET', `/instances/${inst.id}/checkpoints`)).body.items as { id: string; parent_id: string | null }[];
    expect(kept.map((c) => c.id).sort()).toEqual(ids.slice(2).sort());
    const present = new Set(kept.map((c) => c.id));
    for (const c of kept) expect(c.parent_id === null || present.has(c.parent_id), JSON.stringify(c)).toBe(true);
    expect(kept.find((c) => c.id === ids[3])!.parent_id).toBe(ids[2]);
    expect(kept.find((c) => c.id === ids[2])!.parent_id).toBeNull();
    await s.api('DELETE', `/instances/${inst.id}`);
  });
});

describe('the OpenComputer face answers as OpenComputer does', () => {
  it('errors are {"error": "message"} on every /api route, unknown routes and bad tokens included', async () => {
    for (const [method, path, auth] of [
      ['GET', '/api/sandboxes/inst_nope0000000000', true],
      ['GET', '/api/no/such/route', true],
      ['GET', '/api/sandboxes', false],
      ['POST', `/api/sandboxes/${id}/checkpoints/ckpt_nope/restore`, true],
    ] as const) {
      const r = await raw(method, path, { auth });
      expect(r.status, path).toBeGreaterThanOrEqual(400);
      expect(Object.keys(r.json), path).toEqual(['error']);
      expect(typeof r.json.error, path).toBe('string');
    }
    // and the Firecase face keeps its own
    expect((await raw('GET', '/no/such/route')).json.error.code).toBe('NOT_FOUND');
  });

  it('reading a directory through GET /files is a 400, not an empty file', async () => {
    const r = await raw('GET', `/api/sandboxes/${id}/files?path=/etc`, { headers: { 'x-api-key': s.token }, auth: false });
    expect(r.status).toBe(400);
    expect(r.json.error).toMatch(/directory/);
  });

  it('envs given to from-checkpoint reach the new sandbox\'s commands', async () => {
    const sb = (await s.api('POST', '/api/sandboxes', { envs: { A: '1' } })).body;
    const cp = (await s.api('POST', `/api/sandboxes/${sb.sandboxID}/checkpoints`, { name: 'x' })).body;
    await s.api('GET', `/instances/${sb.sandboxID}/checkpoints/${cp.id}?wait=true`);
    const fork = (await s.api('POST', `/api/sandboxes/from-checkpoint/${cp.id}`, { envs: { B: '2' } })).body;
    const out = await s.api('POST', `/api/sandboxes/${fork.sandboxID}/exec/run`, { cmd: 'sh', args: ['-c', 'echo $A$B'] });
    expect(out.body.stdout).toBe('12\n');
    for (const x of [fork.sandboxID, sb.sandboxID]) await s.api('DELETE', `/api/sandboxes/${x}`);
  });
});
