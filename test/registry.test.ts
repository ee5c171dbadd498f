import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CODE_INTERPRETER_ONLY, layerFile, layerOf, push, pushAll, startRegistry, writeOciIndex, writeOciLayout, type TestRegistry } from './helpers/registry.js';
import { startServer, type TestServer } from './helpers/server.js';
import { pulledDirName, pulledLayerId } from '../src/engine/registry-pull.js';
import { openSse } from './helpers/sse.js';
import { imageHolder } from '../src/store/images.js';

/**
 * Images from a real registry (Debian's docker-registry on loopback, started here), pushed to it
 * with skopeo as a user would push theirs: pulled by tag and by digest, booted on each face, built
 * FROM, pulled again without a blob fetched, behind credentials, and refused when a blob is not
 * what its digest says.
 */
const DEFAULT_IMAGE = '/opt/forkpoint/images/default';
const DEBIAN_IMAGE = '/opt/forkpoint/images/debian';
const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
const AUTH = { username: 'ci', password: 'registry-secret' };

let s: TestServer;
let open: TestRegistry;
let locked: TestRegistry;
let work: string;
let digest: string;
let ref: string;

/** The layers (newest first) of `owner`'s pulled image, as the store has them. */
async function layersOf(server: TestServer, reference: string): Promise<string[]> {
  const owner = (await server.fp.store.tokens.list())[0]!.owner;
  return (await server.fp.store.images.get(owner, reference))!.layers;
}

/** Blob fetches the registry served (its access log's GETs of blobs). */
const blobGets = (r: TestRegistry) => (r.log().match(/"GET \/v2\/[^"]*\/blobs\/sha256:/g) ?? []).length;

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'forkpoint-registry-test-'));
  // Three layers: a root filesystem (forkpoint's default image), files over it, and a layer that
  // deletes one of those (a whiteout) and changes another.
  const base = await layerOf(DEFAULT_IMAGE);
  const second = join(work, 'second');
  await mkdir(join(second, 'etc'), { recursive: true });
  await mkdir(join(second, 'data'), { recursive: true });
  await writeFile(join(second, 'etc/app.conf'), 'v1\n');
  await writeFile(join(second, 'data/old.txt'), 'deleted by the next layer\n');
  const third = join(work, 'third');
  await mkdir(join(third, 'etc'), { recursive: true });
  await mkdir(join(third, 'data'), { recursive: true });
  await writeFile(join(third, 'etc/app.conf'), 'v2\n');
  await writeFile(join(third, 'data/.wh.old.txt'), '');
  digest = await writeOciLayout(join(work, 'layout'), 'v1', [base, await layerOf(second), await layerOf(third)], { Env: ['PATH=/usr/sbin:/usr/bin:/sbin:/bin', 'FROM_REGISTRY=yes'], WorkingDir: '/data' });
  [open, locked] = await Promise.all([startRegistry(), startRegistry(AUTH)]);
  await push(join(work, 'layout'), 'v1', `${open.host}/team/app:v1`);
  await push(join(work, 'layout'), 'v1', `${locked.host}/team/private:v1`, AUTH);
  ref = `${open.host}/team/app:v1`;
  s = await startServer();
}, 120_000);

afterAll(async () => {
  await s?.close();
  await Promise.all([open?.close(), locked?.close()]);
  if (work) await rm(work, { recursive: true, force: true });
});

describe('images from a registry', () => {
  it('pulls by tag: the layers applied with their whiteouts, the configuration kept, recorded under the full reference', async () => {
    const r = await s.api('POST', '/images/pull', { reference: ref });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    expect(r.body).toMatchObject({ digest, image: { name: ref, kind: 'pulled', base: digest } });
    expect(r.body.fetched_bytes).toBeGreaterThan(1_000_000);
    // The registry's own log shows the layers fetched (so that "none fetched" below means something).
    expect(blobGets(open)).toBeGreaterThanOrEqual(4);
    const inst = await s.instance({ image: ref });
    expect(inst.image).toBe(ref);
    const out = await s.exec(inst.id, { command: 'cat /etc/app.conf; test -e /data/old.txt && echo present || echo whited-out; echo $FROM_REGISTRY; pwd' });
    expect(out.stdout).toBe('v2\nwhited-out\nyes\n/data\n');
    // Checkpointed, rolled back and forked as any instance: its tree is on this node.
    await s.exec(inst.id, { command: 'echo mine > /data/mine' });
    const ck = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {});
    expect(ck.body.status, JSON.stringify(ck.body)).toBe('ready');
    await s.exec(inst.id, { command: 'rm /data/mine' });
    const back = await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.body.id });
    expect(back.status, JSON.stringify(back.body)).toBe(200);
    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.body.id });
    expect(fork.status, JSON.stringify(fork.body)).toBe(201);
    for (const id of [inst.id, fork.body.id]) expect((await s.exec(id, { command: 'cat /data/mine /etc/app.conf' })).stdout).toBe('mine\nv2\n');
    await s.api('DELETE', `/instances/${fork.body.id}`);
    // The image list says what it is; the pulled directory is no system image for anyone.
    const list = (await s.api('GET', '/images')).body.images as { name: string; kind: string }[];
    expect(list).toContainEqual(expect.objectContaining({ name: ref, kind: 'pulled' }));
    expect(list.some((i) => i.name.startsWith('sha256-'))).toBe(false);
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('a second pull fetches no blob; by digest it is the same image, and create pulls by itself', async () => {
    const before = blobGets(open);
    const again = await s.api('POST', '/images/pull', { reference: ref });
    expect(again.status).toBe(201);
    expect(again.body).toMatchObject({ digest, fetched_bytes: 0 });
    const byDigest = `${open.host}/team/app@${digest}`;
    const inst = await s.instance({ image: byDigest });
    expect((await s.exec(inst.id, { command: 'cat /etc/app.conf' })).stdout).toBe('v2\n');
    expect(blobGets(open)).toBe(before);
    expect((await s.api('GET', `/images/${encodeURIComponent(byDigest)}`)).body).toMatchObject({ kind: 'pulled', base: digest });
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('boots on the OpenComputer and E2B faces and builds FROM it', async () => {
    const oc = await s.api('POST', '/api/sandboxes', { templateID: ref });
    expect(oc.status, JSON.stringify(oc.body)).toBe(201);
    const id = oc.body.sandboxID as string;
    expect((await s.exec(id, { command: 'cat /etc/app.conf' })).stdout).toBe('v2\n');
    await s.api('DELETE', `/instances/${id}`);
    const e2b = await s.api('POST', '/sandboxes', { templateID: ref, timeout: 120 }, { 'x-api-key': s.token, 'content-type': 'application/json' });
    expect(e2b.status, JSON.stringify(e2b.body)).toBe(201);
    expect(e2b.body.templateID).toBe(ref);
    expect((await s.exec(e2b.body.sandboxID, { command: 'cat /etc/app.conf' })).stdout).toBe('v2\n');
    await s.api('DELETE', `/instances/${e2b.body.sandboxID}`);

    const built = await s.api('POST', '/images', { name: 'on-pulled', dockerfile: `FROM ${ref}\nRUN echo built > /built\n` });
    expect(built.status, JSON.stringify(built.body)).toBe(201);
    // Its step's layer over the three it was built FROM, and nothing under them.
    expect(built.body).toMatchObject({ kind: 'built', base: null, layers: 4 });
    const inst = await s.instance({ image: 'on-pulled' });
    expect((await s.exec(inst.id, { command: 'cat /built /etc/app.conf; echo $FROM_REGISTRY' })).stdout).toBe('built\nv2\nyes\n');
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('a registry that needs credentials refuses without them and pulls with them, which are kept nowhere', async () => {
    const privateRef = `${locked.host}/team/private:v1`;
    const refused = await s.api('POST', '/images/pull', { reference: privateRef });
    expect(refused.status, JSON.stringify(refused.body)).toBe(403);
    expect(refused.body.error.details.reason).toBe('REGISTRY_DENIED');
    const wrong = await s.api('POST', '/images/pull', { reference: privateRef, username: 'ci', password: 'wrong' });
    expect(wrong.status).toBe(403);
    // Another owner's pull of the same image lets nobody else in: each asks the registry.
    const created = await s.api('POST', '/instances', { image: privateRef });
    expect(created.status).toBe(403);
    const pulled = await s.api('POST', '/images/pull', { reference: privateRef, ...AUTH });
    expect(pulled.status, JSON.stringify(pulled.body)).toBe(201);
    expect(pulled.body.digest).toBe(digest);
    // The CLI, as `docker login`'s users type it: the password on standard input, never a flag.
    const { execa } = await import('execa');
    const env = { ...process.env, FORKPOINT_URL: s.url, FORKPOINT_TOKEN: s.token };
    const cli = await execa(process.execPath, [CLI, 'pull', privateRef, '-u', AUTH.username, '--password-stdin'], { env, input: `${AUTH.password}\n`, reject: false });
    expect([cli.exitCode, cli.stdout], cli.stderr).toEqual([0, `${privateRef}  ${digest}  (nothing fetched: all here already)`]);
    const denied = await execa(process.execPath, [CLI, 'pull', privateRef], { env, reject: false });
    expect([denied.exitCode, denied.stderr]).toEqual([1, expect.stringMatching(/^resolve: asking 127\.0\.0\.1:\d+ for team\/private:v1\nforkpoint: FORBIDDEN: the registry refused/)]);
    // Nowhere in the data directory (the store, logs, the pull's scratch files); the images' own
    // trees are left out of the search: they are what the registries sent.
    const { stdout } = await import('execa').then(({ execa }) =>
      execa('grep', ['-rl', '--exclude-dir=default', '--exclude-dir=debian', '--exclude-dir=sha256-*', AUTH.password, s.dataDir], { reject: false }));
    expect(stdout).toBe('');
    // Pulled, it is the owner's: created from without the registry.
    const inst = await s.instance({ image: privateRef });
    expect((await s.exec(inst.id, { command: 'cat /etc/app.conf' })).stdout).toBe('v2\n');
    await s.api('DELETE', `/instances/${inst.id}`);
    // Another owner has not pulled it: not theirs to see.
    const other = await s.fp.store.tokens.create('someone-else', 'registry');
    const theirs = await s.api('GET', `/images/${encodeURIComponent(privateRef)}`, undefined, { authorization: `Bearer ${other.token}` });
    expect(theirs.status).toBe(404);
    const theirCreate = await s.api('POST', '/instances', { image: privateRef }, { authorization: `Bearer ${other.token}` });
    expect(theirCreate.status).toBe(403);
  });

  it('keeps an owner\'s credentials for a registry, sealed, for that owner\'s pulls only', async () => {
    const privateRef = `${locked.host}/team/private:v1`;
    const b = await s.fp.store.tokens.create('registry-b', 'registry');
    const asB = { authorization: `Bearer ${b.token}` };
    const { execa } = await import('execa');
    const env = { ...process.env, FORKPOINT_URL: s.url, FORKPOINT_TOKEN: b.token };
    // Wrong ones kept: the create's pull uses them, and the registry refuses.
    const wrong = await execa(process.execPath, [CLI, 'registry', 'login', locked.host, '-u', AUTH.username, '--password-stdin'], { env, input: 'not-it\n', reject: false });
    expect([wrong.exitCode, wrong.stdout], wrong.stderr).toEqual([0, `kept credentials of ${AUTH.username} for ${locked.host}`]);
    const refused = await s.api('POST', '/instances', { image: privateRef }, asB);
    expect([refused.status, refused.body.error?.details?.reason]).toEqual([403, 'REGISTRY_DENIED']);
    // The right ones replace them: a create pulls by itself.
    const kept = await s.api('PUT', `/registries/${encodeURIComponent(locked.host)}/login`, AUTH, asB);
    expect(kept.status, JSON.stringify(kept.body)).toBe(200);
    expect(kept.body).toEqual({ registry: locked.host, username: AUTH.username, created_at: expect.any(String) });
    const created = await s.api('POST', '/instances', { image: privateRef }, asB);
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    await s.api('DELETE', `/instances/${created.body.id}`, undefined, asB);
    // Listed without the password; sealed in the store, under a key of mode 0600 outside it.
    const list = await s.api('GET', '/registries', undefined, asB);
    expect(list.body.items).toEqual([{ registry: locked.host, username: AUTH.username, created_at: expect.any(String) }]);
    expect(JSON.stringify(list.body)).not.toContain(AUTH.password);
    const found = await execa('grep', ['-rl', '--exclude-dir=default', '--exclude-dir=debian', '--exclude-dir=sha256-*', AUTH.password, s.dataDir], { reject: false });
    expect(found.stdout).toBe('');
    const { stat } = await import('node:fs/promises');
    expect((await stat(join(s.dataDir, 'secrets.key'))).mode & 0o777).toBe(0o600);
    // Another owner's kept credentials are not this owner's.
    expect((await s.api('GET', '/registries')).body.items).toEqual([]);
    // Forgotten, a new pull is refused again.
    expect((await s.api('DELETE', `/registries/${encodeURIComponent(locked.host)}/login`, undefined, asB)).status).toBe(204);
    expect((await s.api('DELETE', `/registries/${encodeURIComponent(locked.host)}/login`, undefined, asB)).status).toBe(404);
    expect((await s.api('POST', '/images/pull', { reference: privateRef }, asB)).status).toBe(403);
    expect((await s.api('PUT', '/registries/bad%20host/login', AUTH, asB)).body.error.details.reason).toBe('BAD_REGISTRY');
  });

  it('refuses a blob that is not what its digest says, and keeps nothing of that pull', async () => {
    // An image of its own layer, pushed, then that layer's bytes changed in the registry's storage.
    const extra = join(work, 'extra');
    await mkdir(join(extra, 'etc'), { recursive: true });
    await writeFile(join(extra, 'etc/extra.conf'), 'soon corrupted\n');
    const layer = await layerOf(extra);
    const base = await layerOf(DEFAULT_IMAGE);
    const badDigest = await writeOciLayout(join(work, 'layout-bad'), 'v1', [base, layer], {});
    await push(join(work, 'layout-bad'), 'v1', `${open.host}/team/bad:v1`);
    const { createHash } = await import('node:crypto');
    const layerDigest = `sha256:${createHash('sha256').update(layer).digest('hex')}`;
    const file = open.blobFile(layerDigest);
    expect(existsSync(file)).toBe(true);
    const tampered = Buffer.from(layer);
    tampered[tampered.length - 20] ^= 0xff;
    await writeFile(file, tampered);

    const badRef = `${open.host}/team/bad:v1`;
    const r = await s.api('POST', '/images/pull', { reference: badRef });
    expect(r.status, JSON.stringify(r.body)).toBe(503);
    expect(r.body.error.details.reason).toBe('REGISTRY_CORRUPT');
    expect(r.body.error.message).toMatch(/digest/i);
    expect((await s.api('GET', `/images/${encodeURIComponent(badRef)}`)).status).toBe(404);
    const images = join(s.dataDir, 'images');
    expect(await readdir(images)).not.toContain(`sha256-${badDigest.slice(7, 63)}`);
    expect(existsSync(join(images, '.oci-cache/blobs/sha256', layerDigest.slice(7)))).toBe(false);
    expect((await readdir(images)).filter((n) => n.startsWith('.pull-'))).toEqual([]);
    // No layer of it either, whole or half-unpacked.
    expect(existsSync(join(s.dataDir, 'layers', pulledLayerId(layerDigest)))).toBe(false);
    expect((await readdir(join(s.dataDir, 'layers'))).filter((n) => n.startsWith('.pull-'))).toEqual([]);
  });

  it('a layer that does not unpack fails the pull by name, and keeps none of the image\'s layers', async () => {
    const good = join(work, 'half-good');
    await mkdir(join(good, 'etc'), { recursive: true });
    await writeFile(join(good, 'etc/half'), 'unpacked before the bad one\n');
    const goodLayer = await layerOf(good);
    const layout = join(work, 'half-layout');
    await writeOciLayout(layout, 'v1', [goodLayer, gzipSync(Buffer.from('not a tar archive at all'))], {});
    const halfRef = `${open.host}/team/half:v1`;
    await push(layout, 'v1', halfRef);
    const r = await s.api('POST', '/images/pull', { reference: halfRef });
    expect(r.status, JSON.stringify(r.body)).toBe(503);
    expect(r.body.error).toMatchObject({ code: 'UNAVAILABLE', details: { reason: 'REGISTRY_FAILED' } });
    expect(r.body.error.message).toMatch(/layer 1 is refused: not a readable archive/);
    expect((await s.api('GET', `/images/${encodeURIComponent(halfRef)}`)).status).toBe(404);
    const first = pulledLayerId(`sha256:${createHash('sha256').update(goodLayer).digest('hex')}`);
    expect(existsSync(join(s.dataDir, 'layers', first))).toBe(false);
    expect((await readdir(join(s.dataDir, 'layers'))).filter((n) => n.startsWith('.pull-'))).toEqual([]);
  });

  it('pulls forkpoint\'s Debian image pushed to the registry, and runs its tools', async () => {
    const layout = join(work, 'debian-layout');
    await mkdir(layout, { recursive: true });
    await writeOciLayout(layout, 'stable', [await layerFile(DEBIAN_IMAGE, join(work, 'debian.tar'), CODE_INTERPRETER_ONLY)], { Env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'] });
    await push(layout, 'stable', `${open.host}/forkpoint/debian:stable`);
    await rm(layout, { recursive: true, force: true });
    // Pulled with its progress told as it goes (what the CLI shows), then the result.
    const sse = await openSse(`${s.url}/images/pull`, { method: 'POST', headers: { authorization: `Bearer ${s.token}` }, body: { reference: `${open.host}/forkpoint/debian:stable` } });
    const events = await sse.rest(120_000);
    const progress = events.filter((e) => e.event === 'pull_progress').map((e) => e.data as { stage: string; message: string });
    expect(progress.map((p) => p.stage)).toEqual(expect.arrayContaining(['resolve', 'fetch', 'unpack']));
    expect(progress.some((p) => /^Copying blob/.test(p.message)), JSON.stringify(progress)).toBe(true);
    expect(events.at(-1)).toMatchObject({ event: 'result', data: { image: { kind: 'pulled' } } });
    const inst = await s.instance({ image: `${open.host}/forkpoint/debian:stable` });
    const out = await s.exec(inst.id, { command: 'apt-get --version | head -1 | cut -d" " -f1; python3 -c "print(6*7)"; cat /etc/debian_version >/dev/null && echo debian' });
    expect(out.stdout).toBe('apt\n42\ndebian\n');
    // skopeo compressed the layer as it pushed: the registry's manifest is another than the layout's.
    expect((await s.api('GET', `/images/${encodeURIComponent(`${open.host}/forkpoint/debian:stable`)}`)).body).toMatchObject({ kind: 'pulled', base: expect.stringMatching(/^sha256:[0-9a-f]{64}$/) });
    await s.api('DELETE', `/instances/${inst.id}`);
  }, 180_000);

  it('an image of one layer is that layer, unpacked in place: whiteouts in it hide nothing and are overlayfs\'s', async () => {
    const { execa } = await import('execa');
    const tree = join(work, 'one-layer');
    await execa('cp', ['-a', DEFAULT_IMAGE, tree]);
    await writeFile(join(tree, 'etc/.wh.ghost'), '');
    await mkdir(join(tree, 'opaque'));
    await writeFile(join(tree, 'opaque/.wh..wh..opq'), '');
    await writeFile(join(tree, 'opaque/kept'), 'kept\n');
    const layout = join(work, 'one-layer-layout');
    await writeOciLayout(layout, 'v1', [await layerOf(tree)], { Env: ['PATH=/bin:/sbin:/usr/bin'] });
    await rm(tree, { recursive: true, force: true });
    const oneRef = `${open.host}/team/one:v1`;
    await push(layout, 'v1', oneRef);
    await rm(layout, { recursive: true, force: true });
    const pulled = await s.api('POST', '/images/pull', { reference: oneRef });
    expect(pulled.status, JSON.stringify(pulled.body)).toBe(201);
    const [layer] = await layersOf(s, oneRef);
    const found = await execa('find', [join(s.dataDir, 'layers', layer!), '-name', '.wh.*']);
    expect(found.stdout).toBe('');
    // No tree of the whole image: the layer is all there is of it.
    expect(existsSync(join(s.dataDir, 'images', pulledDirName(pulled.body.digest)))).toBe(false);
    const inst = await s.instance({ image: oneRef });
    expect((await s.exec(inst.id, { command: 'cat /opaque/kept; ls -a /etc | grep -c wh; echo $PATH' })).stdout).toBe('kept\n0\n/bin:/sbin:/usr/bin\n');
    await s.api('DELETE', `/instances/${inst.id}`);
    expect((await s.api('DELETE', `/images/${encodeURIComponent(oneRef)}`)).status).toBe(204);
  });

  it('each registry layer is one layer of forkpoint\'s, unpacked once for every image that has it; they go from the disk once nothing stands on them, and a pull brings them back', async () => {
    // A root filesystem layer of these two images' own (no other image here has it).
    const { execa } = await import('execa');
    const root = join(work, 'gc-root');
    await execa('cp', ['-a', DEFAULT_IMAGE, root]);
    await writeFile(join(root, 'etc/gc-root'), 'shared\n');
    const rootLayer = await layerOf(root);
    const marker = (name: string) => join(work, `gc-marker-${name}`);
    const layouts: string[] = [];
    for (const name of ['one', 'two']) {
      await mkdir(join(marker(name), 'etc'), { recursive: true });
      await writeFile(join(marker(name), 'etc/gc.conf'), `collected ${name}\n`);
      layouts.push(join(work, `gc-layout-${name}`));
      await writeOciLayout(layouts.at(-1)!, 'v1', [rootLayer, await layerOf(marker(name))], {});
    }
    const gcRef = `${open.host}/team/gc:v1`;
    const twinRef = `${open.host}/team/gc-twin:v1`;
    await push(layouts[0]!, 'v1', gcRef);
    await push(layouts[1]!, 'v1', twinRef);
    const pulled = await s.api('POST', '/images/pull', { reference: gcRef });
    expect(pulled.status).toBe(201);
    const layers = await layersOf(s, gcRef);
    const dirs = layers.map((id) => join(s.dataDir, 'layers', id));
    expect(dirs.map((d) => existsSync(d))).toEqual([true, true]);
    // The twin shares the root filesystem layer: the same directory, not unpacked again.
    const shared = (await stat(dirs[1]!)).ino;
    const twin = await s.api('POST', '/images/pull', { reference: twinRef });
    expect(twin.status).toBe(201);
    const twinLayers = await layersOf(s, twinRef);
    expect(twinLayers[1]).toBe(layers[1]);
    expect(twinLayers[0]).not.toBe(layers[0]);
    expect((await stat(dirs[1]!)).ino).toBe(shared);
    const inst = await s.instance({ image: gcRef });
    const other = await s.instance({ image: twinRef });
    expect((await s.exec(inst.id, { command: 'cat /etc/gc.conf' })).stdout).toBe('collected one\n');
    expect((await s.exec(other.id, { command: 'cat /etc/gc.conf' })).stdout).toBe('collected two\n');
    expect((await s.api('DELETE', `/images/${encodeURIComponent(gcRef)}`)).status).toBe(409);
    await s.api('DELETE', `/instances/${inst.id}`);
    expect((await s.api('DELETE', `/images/${encodeURIComponent(gcRef)}`)).status).toBe(204);
    // Its own layer goes; the shared one stays while the twin stands on it.
    expect(dirs.map((d) => existsSync(d))).toEqual([false, true]);
    await s.api('DELETE', `/instances/${other.id}`);
    expect((await s.api('DELETE', `/images/${encodeURIComponent(twinRef)}`)).status).toBe(204);
    expect(existsSync(join(s.dataDir, 'layers', twinLayers[0]!))).toBe(false);
    expect(dirs.map((d) => existsSync(d))).toEqual([false, false]);
    // The registry's blobs are still in the node's cache: the layers come back with nothing fetched.
    const again = await s.api('POST', '/images/pull', { reference: gcRef });
    expect([again.status, again.body.fetched_bytes]).toEqual([201, 0]);
    expect(dirs.map((d) => existsSync(d))).toEqual([true, true]);
    const back = await s.instance({ image: gcRef });
    expect((await s.exec(back.id, { command: 'cat /etc/gc.conf' })).stdout).toBe('collected one\n');
    await s.api('DELETE', `/instances/${back.id}`);
    // An image whose last user went while no server ran here (deleted by another node, say):
    // its layers go at the next start.
    const owner = (await s.fp.store.tokens.list())[0]!.owner;
    await s.fp.store.transaction(async (tx) => {
      await tx.layers.dropHolder(imageHolder(owner, gcRef));
      await tx.images.delete(owner, gcRef);
    });
    // A pull the server was killed in holds what it found: let go at the next start too.
    await s.fp.layers.pullHold().hold([layers[0]!]);
    const dataDir = s.dataDir;
    await s.close({ keepData: true });
    s = await startServer({}, dataDir);
    expect(dirs.map((d) => existsSync(d))).toEqual([false, false]);
  });

  it('bounds the node\'s blob cache (FORKPOINT_IMAGE_CACHE_MB): with none to spare, a deleted image\'s own blobs go, those an image still here shares stay', async () => {
    const base = await layerOf(DEFAULT_IMAGE);
    const refs: string[] = [];
    for (const which of ['a', 'b']) {
      const marker = join(work, `cache-${which}`);
      await mkdir(join(marker, 'etc'), { recursive: true });
      await writeFile(join(marker, 'etc/which'), `${which}\n`);
      const layout = join(work, `cache-${which}-layout`);
      await writeOciLayout(layout, 'v1', [base, await layerOf(marker)], {});
      refs.push(`${open.host}/team/cache-${which}:v1`);
      await push(layout, 'v1', refs.at(-1)!);
    }
    const node = await startServer({ imageCacheMb: 0 });
    try {
      const a = await node.api('POST', '/images/pull', { reference: refs[0] });
      const b = await node.api('POST', '/images/pull', { reference: refs[1] });
      expect([a.status, b.status]).toEqual([201, 201]);
      // b shares a's root filesystem layer: it fetched only its own blobs.
      expect(b.body.fetched_bytes).toBeGreaterThan(0);
      expect(b.body.fetched_bytes).toBeLessThan(a.body.fetched_bytes / 10);
      const index = () => readFile(join(node.dataDir, 'images', '.oci-cache', 'index.json'), 'utf8');
      expect(await index()).toContain(pulledDirName(b.body.digest));
      expect((await node.api('DELETE', `/images/${encodeURIComponent(refs[1]!)}`)).status).toBe(204);
      // b's tree, its manifest and its own blobs are gone; a's are all there.
      expect(await index()).not.toContain(pulledDirName(b.body.digest));
      expect(await index()).toContain(pulledDirName(a.body.digest));
      const again = await node.api('POST', '/images/pull', { reference: refs[1] });
      expect([again.status, again.body.fetched_bytes]).toEqual([201, b.body.fetched_bytes]);
      const inst = await node.instance({ image: refs[1] });
      expect((await node.exec(inst.id, { command: 'cat /etc/which' })).stdout).toBe('b\n');
    } finally {
      await node.close();
    }
  });

  it('follows a multi-platform index to this host\'s image, and says so when it has none', async () => {
    const mark = (text: string) => join(work, `mark-${text}`);
    const layers: Record<string, Buffer> = {};
    for (const arch of ['amd64', 'arm64', 's390x']) {
      await mkdir(join(mark(arch), 'etc'), { recursive: true });
      await writeFile(join(mark(arch), 'etc/arch'), `${arch}\n`);
      layers[arch] = await layerOf(mark(arch));
    }
    const base = await layerOf(DEFAULT_IMAGE);
    const multi = await writeOciIndex(join(work, 'multi'), 'v1', [
      { architecture: 'arm64', layers: [base, layers.arm64!], config: {} },
      { architecture: 'amd64', layers: [base, layers.amd64!], config: {} },
    ]);
    await pushAll(join(work, 'multi'), 'v1', `${open.host}/team/multi:v1`);
    const r = await s.api('POST', '/images/pull', { reference: `${open.host}/team/multi:v1` });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    expect(r.body.digest).toBe(multi.images.amd64);
    const inst = await s.instance({ image: `${open.host}/team/multi:v1` });
    expect((await s.exec(inst.id, { command: 'cat /etc/arch' })).stdout).toBe('amd64\n');
    await s.api('DELETE', `/instances/${inst.id}`);
    // An index without this host's platform.
    await writeOciIndex(join(work, 'other'), 'v1', [{ architecture: 's390x', layers: [base, layers.s390x!], config: {} }]);
    await pushAll(join(work, 'other'), 'v1', `${open.host}/team/other:v1`);
    const none = await s.api('POST', '/images/pull', { reference: `${open.host}/team/other:v1` });
    expect([none.status, none.body.error?.details?.reason]).toEqual([400, 'REGISTRY_NO_PLATFORM']);
  });

  it('says what is wrong with a reference, an image the registry lacks, and a registry that is not there', async () => {
    const bad = await s.api('POST', '/images/pull', { reference: 'UPPER/case:tag' });
    expect([bad.status, bad.body.error.details.reason]).toEqual([400, 'BAD_REFERENCE']);
    const missing = await s.api('POST', '/images/pull', { reference: `${open.host}/team/none:v1` });
    expect([missing.status, missing.body.error.details.reason]).toEqual([404, 'REGISTRY_NOT_IN_REGISTRY']);
    const away = await s.api('POST', '/images/pull', { reference: '127.0.0.1:9/team/app:v1' });
    expect([away.status, away.body.error.details.reason]).toEqual([503, 'REGISTRY_UNREACHABLE']);
    // An owner's pulled images weigh 1 MiB at most on this server: the 4 MB image is refused
    // before a blob is fetched, and nothing is kept.
    const small = await startServer({ ownerMaxPulledMb: 1 });
    try {
      const before = blobGets(open);
      const over = await small.api('POST', '/images/pull', { reference: ref });
      expect([over.status, over.body.error.details.reason], JSON.stringify(over.body)).toEqual([429, 'PULLED_PER_OWNER']);
      expect(blobGets(open)).toBe(before);
      expect((await small.api('GET', `/images/${encodeURIComponent(ref)}`)).status).toBe(404);
    } finally {
      await small.close();
    }
  });

  it('a server that died in a pull leaves no credentials behind once it is back', async () => {
    expect((await s.api('POST', '/images/pull', { reference: ref })).status).toBe(201);
    const images = join(s.dataDir, 'images');
    // As a kill -9 in the middle of a pull leaves them: the auth file, a half-unpacked tree.
    await mkdir(join(images, '.auth-left'), { recursive: true });
    await writeFile(join(images, '.auth-left/auth.json'), JSON.stringify({ auths: { x: { auth: 'c2VjcmV0' } } }), { mode: 0o600 });
    await mkdir(join(images, '.pull-sha256-left-1/layer0'), { recursive: true });
    const dataDir = s.dataDir;
    await s.close({ keepData: true });
    s = await startServer({}, dataDir);
    const left = (await readdir(join(dataDir, 'images'))).filter((n) => n.startsWith('.auth-') || n.startsWith('.pull-'));
    expect(left).toEqual([]);
    // What was pulled is still there, and still the owner's.
    expect((await s.api('GET', `/images/${encodeURIComponent(ref)}`)).body).toMatchObject({ kind: 'pulled', base: digest });
  });
});
