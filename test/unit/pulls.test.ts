import { describe, expect, it } from 'vitest';
import { ImagePulls } from '../../src/core/pulls.js';
import { PullError, type ImagePuller, type PulledImage, type PullRequest } from '../../src/seam/index.js';

const pulled: PulledImage = { digest: `sha256:${'a'.repeat(64)}`, base: '.empty', config: { env: {}, workdir: null, user: null, cmd: null, entrypoint: null, labels: {}, exposedPorts: [] }, layerIds: ['lyr_0000000000000001'], layers: 1, bytes: 100, fetchedBytes: 0 };

/** A puller whose pulls wait until the test lets them go, and that records what it was asked. */
function heldPuller() {
  const asked: PullRequest[] = [];
  const waiting: (() => void)[] = [];
  const puller: ImagePuller = {
    pull: (req) => {
      asked.push(req);
      return new Promise((resolve) => waiting.push(() => resolve(pulled)));
    },
    trimCache: async () => ({ removedBytes: 0 }),
  };
  // The pulls under way reach the puller after the core's own awaits: one turn of the loop first.
  const release = async () => {
    await new Promise((r) => setImmediate(r));
    waiting.splice(0).forEach((go) => go());
  };
  return { puller, asked, release };
}

/** The core's hold on a pull's layers: nothing to hold here. */
const hold = async () => {};

describe('pulls from registries, the core\'s rules', () => {
  it('bounds the pulls one owner runs at once (429 PULLS_PER_OWNER), not another owner\'s', async () => {
    const h = heldPuller();
    const pulls = new ImagePulls(h.puller, { insecureRegistries: [], maxPullBytes: 1 << 30, ownerMaxPulledBytes: 2 ** 40, cacheBytes: 0 });
    const signal = new AbortController().signal;
    const first = [pulls.pull('a', 'app:1', undefined, signal, hold), pulls.pull('a', 'app:2', undefined, signal, hold)];
    await expect(pulls.pull('a', 'app:3', undefined, signal, hold)).rejects.toMatchObject({ code: 'QUOTA_EXCEEDED', details: { reason: 'PULLS_PER_OWNER' } });
    const other = pulls.pull('b', 'app:1', undefined, signal, hold);
    await h.release();
    await Promise.all([...first, other]);
    // Done, they count no more.
    const again = pulls.pull('a', 'app:3', undefined, signal, hold);
    await h.release();
    await expect(again).resolves.toMatchObject({ name: 'docker.io/library/app:3' });
  });

  it('asks plain HTTP for loopback and listed registries only, and passes the pull bound', async () => {
    const h = heldPuller();
    const pulls = new ImagePulls(h.puller, { insecureRegistries: ['registry.lan:5000'], maxPullBytes: 1234, ownerMaxPulledBytes: 2 ** 40, cacheBytes: 0 });
    const signal = new AbortController().signal;
    const all = ['127.0.0.1:5000/a', 'registry.lan:5000/b', 'ghcr.io/c/d'].map((r) => pulls.pull(`o-${r}`, r, undefined, signal, hold));
    await h.release();
    await Promise.all(all);
    expect(h.asked.map((r) => [r.image.registry, r.plainHttp, r.maxBytes])).toEqual([['127.0.0.1:5000', true, 1234], ['registry.lan:5000', true, 1234], ['ghcr.io', false, 1234]]);
  });

  it('names each refusal: the reason in details, the status by what went wrong', async () => {
    const cases: [PullError['reason'], string][] = [['DENIED', 'FORBIDDEN'], ['NOT_IN_REGISTRY', 'NOT_FOUND'], ['TOO_LARGE', 'PAYLOAD_TOO_LARGE'], ['NO_PLATFORM', 'INVALID_REQUEST'], ['CORRUPT', 'UNAVAILABLE'], ['UNREACHABLE', 'UNAVAILABLE']];
    for (const [reason, code] of cases) {
      const pulls = new ImagePulls({ pull: async () => Promise.reject(new PullError(reason, "no")), trimCache: async () => ({ removedBytes: 0 }) }, { insecureRegistries: [], maxPullBytes: 1, ownerMaxPulledBytes: 2 ** 40, cacheBytes: 0 });
      await expect(pulls.pull('o', 'app', undefined, new AbortController().signal, hold)).rejects.toMatchObject({ code, details: { reason: `REGISTRY_${reason}` } });
    }
    const pulls = new ImagePulls(heldPuller().puller, { insecureRegistries: [], maxPullBytes: 1, ownerMaxPulledBytes: 2 ** 40, cacheBytes: 0 });
    await expect(pulls.pull('o', 'Bad/Ref', undefined, new AbortController().signal, hold)).rejects.toMatchObject({ code: 'INVALID_REQUEST', details: { reason: 'BAD_REFERENCE' } });
  });

  it('bounds what one owner\'s pulled images weigh in all: a pull gets what is left, and past it is 429 PULLED_PER_OWNER', async () => {
    const asked: number[] = [];
    // A registry whose image weighs 600 bytes: refused by the engine when its bound is smaller.
    const puller: ImagePuller = {
      pull: async (req) => {
        asked.push(req.maxBytes);
        if (600 > req.maxBytes) throw new PullError('TOO_LARGE', `600 bytes, more than ${req.maxBytes}`);
        return { ...pulled, bytes: 600 };
      },
      trimCache: async () => ({ removedBytes: 0 }),
    };
    const used: Record<string, number> = { a: 500, b: 0 };
    const pulls = new ImagePulls(puller, { insecureRegistries: [], maxPullBytes: 10_000, ownerMaxPulledBytes: 1000, cacheBytes: 0 }, undefined, async (owner, except) => {
      expect(except).toBe('docker.io/library/app:1');
      return used[owner]!;
    });
    const signal = new AbortController().signal;
    await expect(pulls.pull('a', 'app:1', undefined, signal, hold)).rejects.toMatchObject({ code: 'QUOTA_EXCEEDED', details: { reason: 'PULLED_PER_OWNER', left_bytes: 500 } });
    await expect(pulls.pull('b', 'app:1', undefined, signal, hold)).resolves.toMatchObject({ pulled: { bytes: 600 } });
    expect(asked).toEqual([500, 1000]);
    // The pull's own bound, smaller than what is left, is the pull's: 413 as before.
    const small = new ImagePulls(puller, { insecureRegistries: [], maxPullBytes: 100, ownerMaxPulledBytes: 1000, cacheBytes: 0 });
    await expect(small.pull('b', 'app:1', undefined, signal, hold)).rejects.toMatchObject({ code: 'PAYLOAD_TOO_LARGE', details: { reason: 'REGISTRY_TOO_LARGE' } });
  });
});
