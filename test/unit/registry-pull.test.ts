import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Images } from '../../src/engine/images.js';
import { pulledLayerId, RegistryPuller } from '../../src/engine/registry-pull.js';
import { PullError } from '../../src/seam/index.js';

/**
 * A hostile registry, as skopeo would relay it: the engine's puller against a stand-in `skopeo`
 * that answers `inspect --raw` with what the test says and records every call. What a registry
 * says is refused by name before anything is fetched (no `copy`), never a crash.
 */
let dir: string;
let answer: string;
const skopeo = () => join(dir, 'skopeo');
const calls = async () => (await readFile(join(dir, 'calls'), 'utf8').catch(() => '')).split('\n').filter(Boolean);

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'forkpoint-hostile-registry-'));
  answer = join(dir, 'answer');
  await writeFile(skopeo(), `#!/bin/sh\necho "$*" >> ${join(dir, 'calls')}\ncat ${answer}\n`);
  await chmod(skopeo(), 0o755);
});
afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

const d = (c: string) => `sha256:${c.repeat(64)}`;
async function pullAnswering(manifest: string, held: string[][] = []): Promise<unknown> {
  await writeFile(answer, manifest);
  await rm(join(dir, 'calls'), { force: true });
  const puller = new RegistryPuller(new Images(join(dir, 'images')), join(dir, 'layers'), join(dir, 'images/.oci-cache'), skopeo());
  const holdLayers = async (ids: string[]) => void held.push(ids);
  return puller.pull({ image: { registry: '127.0.0.1:5000', repository: 'evil/app', tag: 'v1', digest: undefined }, plainHttp: true, maxBytes: 1 << 30, holdLayers }, new AbortController().signal).catch((e: unknown) => e);
}

describe('a hostile registry\'s manifest', () => {
  it('that is not JSON: a named failure, not a crash', async () => {
    const err = await pullAnswering('<html>not a manifest');
    expect(err).toBeInstanceOf(PullError);
    expect(err).toMatchObject({ reason: 'FAILED' });
    expect(await calls()).toEqual([expect.stringMatching(/^--insecure-policy .* inspect --raw/)]);
  });

  it('with more layers than an overlay takes, or a configuration too large to read: refused before a fetch', async () => {
    const layers = Array.from({ length: 500 }, () => ({ digest: d('a'), size: 10 }));
    expect(await pullAnswering(JSON.stringify({ config: { digest: d('c'), size: 10 }, layers }))).toMatchObject({ reason: 'TOO_LARGE' });
    expect((await calls()).some((c) => c.includes(' copy '))).toBe(false);
    expect(await pullAnswering(JSON.stringify({ config: { digest: d('c'), size: 2 ** 40 }, layers: [] }))).toMatchObject({ reason: 'TOO_LARGE' });
    expect((await calls()).some((c) => c.includes(' copy '))).toBe(false);
  });

  it('that names digests out of shape: refused', async () => {
    expect(await pullAnswering(JSON.stringify({ config: { digest: '../../etc/passwd', size: 10 }, layers: [] }))).toMatchObject({ reason: 'FAILED' });
  });

  it('that names one layer twice: held (and stacked) once, where it is newest; a layer\'s name is its digest\'s, shaped as forkpoint\'s layer ids', async () => {
    const held: string[][] = [];
    // Its copy "succeeds" with nothing in the cache: a named failure after the layers are held.
    const err = await pullAnswering(JSON.stringify({ config: { digest: d('c'), size: 10 }, layers: [{ digest: d('a'), size: 10 }, { digest: d('b'), size: 10 }, { digest: d('a'), size: 10 }] }), held);
    expect(err).toBeInstanceOf(PullError);
    expect(held).toEqual([[pulledLayerId(d('a')), pulledLayerId(d('b'))]]);
    expect(pulledLayerId(d('a'))).toMatch(/^lyr_[0-9a-z]{16}$/);
    expect(pulledLayerId(d('a'))).toBe(pulledLayerId(d('a')));
    expect(pulledLayerId(d('a'))).not.toBe(pulledLayerId(d('b')));
  });
});
