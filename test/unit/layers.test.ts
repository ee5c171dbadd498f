import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LayerCollector } from '../../src/core/layers.js';
import { openStore, type Store } from '../../src/store/index.js';

/**
 * The node's one collector of layers against a pull that finds a layer on the disk: a pull's hold
 * and a collection take turns, so a layer a pull found here is never removed after it.
 */
let dir: string;
let store: Store;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'forkpoint-layers-unit-'));
  store = await openStore(join(dir, 'forkpoint.db'));
});
afterAll(async () => {
  await store?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** A disk whose removals take a while, recording when each ended. */
function slowDisk(layers: string[]) {
  const here = new Set(layers);
  const events: string[] = [];
  return {
    here,
    events,
    disk: {
      localLayers: async () => [...here],
      removeLayer: async (id: string) => {
        await new Promise((r) => setTimeout(r, 30));
        here.delete(id);
        events.push(`removed ${id}`);
      },
    },
  };
}

describe('collecting layers beside pulls', () => {
  it('a pull that holds a layer a collection is removing waits for the removal, and finds it gone', async () => {
    const id = 'lyr_aaaaaaaaaaaaaaaa';
    await store.layers.add(id); // on disk, held by nothing: garbage
    const d = slowDisk([id]);
    const layers = new LayerCollector(store, d.disk, 'node-1');
    const collecting = layers.collect();
    await new Promise((r) => setImmediate(r));
    const hold = layers.pullHold();
    await hold.hold([id]).then(() => d.events.push('held'));
    // What the pull sees once held is what stays: gone, so it unpacks the layer again.
    expect(d.events).toEqual([`removed ${id}`, 'held']);
    expect(d.here.has(id)).toBe(false);
    await collecting;
    expect(await store.layers.holders(id)).toEqual([expect.stringMatching(/^pull:node-1:/)]);
    // Held, a collection leaves it (and its row) alone; released, it goes.
    d.here.add(id);
    await layers.collect();
    expect(d.here.has(id)).toBe(true);
    await hold.release();
    await layers.collect();
    expect(d.here.has(id)).toBe(false);
  });

  it('a restart lets go of its own node\'s abandoned pulls only (a shared store has other nodes\' under way)', async () => {
    const mine = 'lyr_bbbbbbbbbbbbbbbb';
    const theirs = 'lyr_cccccccccccccccc';
    const d = slowDisk([mine, theirs]);
    // A node id LIKE would read as a pattern ('_' is any one character) must not match another's.
    await new LayerCollector(store, d.disk, 'n_1').pullHold().hold([mine]);
    await new LayerCollector(store, d.disk, 'nx1').pullHold().hold([theirs]);
    const restarted = new LayerCollector(store, d.disk, 'n_1');
    await restarted.releaseAbandonedPulls();
    await restarted.collect();
    expect([d.here.has(mine), d.here.has(theirs)]).toEqual([false, true]);
  });
});
