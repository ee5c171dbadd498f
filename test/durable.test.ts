import { existsSync } from 'node:fs';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import S3rver from 's3rver';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ObjectStore } from '../src/store/object-store.js';
import { startServer, type TestServer } from './helpers/server.js';
import { sleep, until } from './helpers/wait.js';

// A real S3-API server on loopback (s3rver), started by the test, with a bucket of its own.
let s3: S3rver;
let s3dir: string;
let endpoint: string;
let s: TestServer;
let bucket: ObjectStore;
beforeAll(async () => {
  s3dir = await mkdtemp(join(tmpdir(), 'forkpoint-s3-'));
  s3 = new S3rver({ address: '127.0.0.1', port: 0, directory: s3dir, silent: true, configureBuckets: [{ name: 'checkpoints', configs: [] }] });
  const addr = (await s3.run()) as { address: string; port: number };
  endpoint = `http://127.0.0.1:${addr.port}`;
  const creds = { s3AccessKeyId: 'S3RVER', s3SecretAccessKey: 'S3RVER' };
  s = await startServer({ s3Endpoint: endpoint, s3Bucket: 'checkpoints', ...creds });
  bucket = new ObjectStore({ endpoint, bucket: 'checkpoints', region: 'us-east-1', accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER', prefix: 'forkpoint/' });
});
afterAll(async () => {
  bucket?.close();
  await s?.close();
  await s3?.close();
  if (s3dir) await rm(s3dir, { recursive: true, force: true });
});

async function durable(id: string, ckpt: string) {
  let c: { durable: boolean; uploaded_bytes: number } | undefined;
  await until('the checkpoint durable', async () => {
    c = (await s.api('GET', `/instances/${id}/checkpoints/${ckpt}`)).body;
    return c!.durable;
  }, 30_000);
  return c!;
}

/** The node loses the checkpoint's own data (its frozen layer and its memory image), the
 * instance stopped first; answers the layer's directory. */
async function loseCheckpointData(instanceId: string, checkpointId: string): Promise<string> {
  expect((await s.api('POST', `/instances/${instanceId}/stop`)).status).toBe(200);
  const rec = (await s.fp.store.checkpoints.get(checkpointId))!;
  const layerDir = s.engine.layout.layer(rec.layers[0]!);
  await rm(layerDir, { recursive: true, force: true });
  await rm(s.engine.layout.checkpoint(checkpointId), { recursive: true, force: true });
  return layerDir;
}

describe('durable checkpoints in an S3-compatible object store', () => {
  it('?wait=durable answers once the checkpoint is in the object store, on create and on get', async () => {
    const inst = await s.instance();
    const made = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=durable`, {});
    expect([made.status, made.body.status, made.body.durable]).toEqual([200, 'ready', true]);
    expect(await bucket.list()).toContain(`manifests/${made.body.id}.json`);
    const got = await s.api('GET', `/instances/${inst.id}/checkpoints/${made.body.id}?wait=durable`);
    expect([got.status, got.body.durable]).toEqual([200, true]);
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('uploads a ready checkpoint as blobs and a manifest; shared blobs once; deleting both empties the bucket', async () => {
    const inst = await s.instance();
    await s.exec(inst.id, { command: 'head -c 1048576 /dev/urandom > /root/one-mib; sleep 1000 &' });
    const c1 = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    expect(c1.status).toBe('ready');
    const d1 = await durable(inst.id, c1.id);
    expect(d1.uploaded_bytes).toBeGreaterThan(1 << 20); // the random MiB does not compress
    const after1 = await bucket.list();
    expect(after1).toContain(`manifests/${c1.id}.json`);
    const blobs1 = after1.filter((k) => k.startsWith('blobs/'));
    expect(blobs1.length).toBeGreaterThanOrEqual(2); // a layer at least, and the memory image

    // A small change: the second checkpoint uploads its own layer and memory image only.
    await s.exec(inst.id, { command: 'echo small > /root/two' });
    const c2 = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    const d2 = await durable(inst.id, c2.id);
    expect(d2.uploaded_bytes).toBeLessThan(d1.uploaded_bytes);
    expect(d2.uploaded_bytes).toBeLessThan(1 << 20);
    const m1 = (await s.fp.store.durable.get(c1.id))!.manifest;
    const m2 = (await s.fp.store.durable.get(c2.id))!.manifest;
    // The first checkpoint's layers are the second's older ones, the very same blobs.
    expect(m2.layers.slice(1).map((l) => l.blob)).toEqual(m1.layers.map((l) => l.blob));
    const blobs2 = (await bucket.list('blobs/')).length;
    expect(blobs2).toBe(blobs1.length + 2);

    // The bucket holds exactly what the store says, blob for blob.
    const onDisk = (await readdir(join(s3dir, 'checkpoints', 'forkpoint', 'blobs'))).filter((f) => !f.startsWith('.'));
    expect(onDisk.length).toBeGreaterThanOrEqual(blobs2);

    expect((await s.api('DELETE', `/instances/${inst.id}/checkpoints/${c1.id}`)).status).toBe(204);
    await until('the first one\'s own blobs gone', async () => (await bucket.list('blobs/')).length < blobs2);
    expect(await bucket.list('manifests/')).toEqual([`manifests/${c2.id}.json`]);
    expect((await s.api('DELETE', `/instances/${inst.id}/checkpoints/${c2.id}`)).status).toBe(204);
    await until('the bucket empty', async () => (await bucket.list()).length === 0);
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('a checkpoint whose data this node lost is fetched from the object store before a fork, counter and files carried over', async () => {
    const inst = await s.instance();
    await s.exec(inst.id, { command: 'echo kept > /root/file && (i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done) >/dev/null 2>&1 &' });
    await until('the counter', async () => Number((await s.exec(inst.id, { command: 'cat /tmp/n' })).stdout) >= 5);
    const c = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    await durable(inst.id, c.id);
    const layerDir = await loseCheckpointData(inst.id, c.id);

    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: c.id });
    expect(fork.status).toBe(201);
    expect((await s.exec(fork.body.id, { command: 'cat /root/file' })).stdout).toBe('kept\n');
    const first = Number((await s.exec(fork.body.id, { command: 'cat /tmp/n' })).stdout);
    expect(first).toBeGreaterThanOrEqual(5);
    await until('counting on from the checkpoint', async () => Number((await s.exec(fork.body.id, { command: 'cat /tmp/n' })).stdout) > first);
    expect(existsSync(layerDir)).toBe(true);
    await s.api('DELETE', `/instances/${fork.body.id}`);
    await s.api('DELETE', `/instances/${inst.id}`);
    await until('the bucket empty', async () => (await bucket.list()).length === 0);
  });

  it('refuses a blob replaced in the bucket (a well-formed tar of another tree): 503, nothing of it kept, and the fork works once the blob is right again', async () => {
    const inst = await s.instance();
    await s.exec(inst.id, { command: 'echo kept > /root/file; sleep 1000 &' });
    const c = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    await durable(inst.id, c.id);
    const layerDir = await loseCheckpointData(inst.id, c.id);

    // The layer's blob swapped for the memory image's: valid gzip, valid tar, the wrong tree.
    const manifest = (await s.fp.store.durable.get(c.id))!.manifest;
    const layerBlob = `blobs/${manifest.layers[0]!.blob}`;
    const saved = join(s3dir, 'saved-blob');
    const swapped = join(s3dir, 'swapped-blob');
    await writeFile(saved, await bytesOf(await bucket.get(layerBlob)));
    await writeFile(swapped, await bytesOf(await bucket.get(`blobs/${manifest.memory!.blob}`)));
    await bucket.putFile(layerBlob, swapped);

    const refused = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: c.id });
    expect(refused.status).toBe(503);
    expect(refused.body.error.code).toBe('UNAVAILABLE');
    expect(refused.body.error.message).toContain('hashes to');
    expect(existsSync(layerDir)).toBe(false);
    expect(existsSync(`${layerDir}.incoming`)).toBe(false);

    await bucket.putFile(layerBlob, saved);
    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: c.id });
    expect(fork.status).toBe(201);
    expect((await s.exec(fork.body.id, { command: 'cat /root/file' })).stdout).toBe('kept\n');
    await s.api('DELETE', `/instances/${fork.body.id}`);
    await s.api('DELETE', `/instances/${inst.id}`);
    await until('the bucket empty', async () => (await bucket.list()).length === 0);
  });

  it('an upload that fails while the object store is away is tried again, and lands once it is back', async () => {
    const port = Number(new URL(endpoint).port);
    await s3.close();
    const inst = await s.instance();
    await s.exec(inst.id, { command: 'echo while away > /root/file' });
    const c = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    expect(c.status).toBe('ready');
    await sleep(3000); // its first upload fails, and so does the first try again
    expect((await s.api('GET', `/instances/${inst.id}/checkpoints/${c.id}`)).body.durable).toBe(false);
    s3 = new S3rver({ address: '127.0.0.1', port, directory: s3dir, silent: true });
    await s3.run();
    const d = await durable(inst.id, c.id);
    expect(d.uploaded_bytes).toBeGreaterThan(0);
    await s.api('DELETE', `/instances/${inst.id}`);
    await until('the bucket empty', async () => (await bucket.list()).length === 0);
  });
});

async function bytesOf(r: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const p of r) parts.push(p as Buffer);
  return Buffer.concat(parts);
}
