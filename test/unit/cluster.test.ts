import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cluster } from '../../src/core/cluster.js';
import { StoreUnavailableError } from '../../src/store/db.js';
import type { Store } from '../../src/store/index.js';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';

// Where a call runs: the cluster's routing decisions over the real store (SQLite), with nodes
// written into it as other machines would. No root, no sandbox.
let n: FakeNode;
/** Instances made while this node was alone (once another is live, creations go there). */
let mine: string, onLive: string, onSilent: string, lost: string;
const log = pino({ level: 'silent' });
const timing = { heartbeatMs: 1000, deadAfterMs: 30_000 };
const iso = (msAgo = 0) => new Date(Date.now() - msAgo).toISOString();

beforeAll(async () => {
  n = await startFakeNode();
  await n.fp.cluster.join('http://127.0.0.1:1');
  [mine, onLive, onSilent, lost] = await Promise.all([create(), create(), create(), create()]);
});
afterAll(async () => n?.close());

const create = async () => (await n.call('POST', '/instances', {})).body.id as string;
/** Moves an instance of this node's to `node` as a takeover does: lost, then claimed, running. */
async function moveTo(id: string, node: string) {
  const store = n.fp.store;
  const fence = store.fence.current;
  const cur = (await store.instances.get(id))!;
  await store.instances.compareAndSet(id, cur.version, cur.node, { status: 'lost' });
  await store.instances.claimLost(id, node);
  // Written as that node would (its own lease), not this one's.
  const other = await store.nodes.get(node);
  store.fence.set(node, other!.epoch);
  const now = (await store.instances.get(id))!;
  await store.instances.compareAndSet(id, now.version, node, { status: 'running' });
  store.fence.set(fence!.node, fence!.epoch);
}

describe('cluster routing decisions', () => {
  it('an unknown instance is unknown; one of this node is here', async () => {
    expect(await n.fp.cluster.locate('inst_nosuch')).toEqual({ kind: 'unknown' });
    expect(await n.fp.cluster.locate(mine)).toEqual({ kind: 'here' });
  });

  it('one on a live node goes there; one whose forward just failed is unreachable for a beat; one on a silent node is lost', async () => {
    await n.fp.store.nodes.register('node-live', 'http://10.0.0.2:7878', iso());
    const id = onLive;
    await moveTo(id, 'node-live');
    expect(await n.fp.cluster.locate(id)).toMatchObject({ kind: 'node', node: { id: 'node-live', url: 'http://10.0.0.2:7878' } });
    n.fp.cluster.unreachableNow('node-live');
    expect(await n.fp.cluster.locate(id)).toMatchObject({ kind: 'unreachable', node: { id: 'node-live' } });

    await n.fp.store.nodes.register('node-silent', 'http://10.0.0.3:7878', iso(timing.deadAfterMs * 2));
    const quiet = onSilent;
    await moveTo(quiet, 'node-silent');
    expect(await n.fp.cluster.locate(quiet)).toEqual({ kind: 'lost', node: 'node-silent' });
  });

  it('a lost instance of this node\'s is answered here (its recovery and deletion run here)', async () => {
    const id = lost;
    const cur = (await n.fp.store.instances.get(id))!;
    await n.fp.store.instances.compareAndSet(id, cur.version, cur.node, { status: 'lost' });
    expect(await n.fp.cluster.locate(id)).toEqual({ kind: 'here' }); // its own node answers for it (recover, delete)
  });

  it('a new instance goes to the live node running fewest, this one on a tie, never to a draining one', async () => {
    // One running here, one on node-live (node-silent is not live): a tie stays here.
    expect(await n.fp.cluster.placeNew()).toEqual({ kind: 'here' });
    const cur = (await n.fp.store.instances.get(lost))!;
    await n.fp.store.instances.compareAndSet(lost, cur.version, cur.node, { status: 'running' });
    expect(await n.fp.cluster.placeNew()).toMatchObject({ kind: 'node', node: { id: 'node-live' } });
    await n.fp.store.nodes.setDraining('node-live', true);
    expect(await n.fp.cluster.placeNew()).toEqual({ kind: 'here' });
    await n.fp.store.nodes.setDraining('node-live', false);
  });

  it('with the database away, an instance whose sandbox runs here is here; any other call fails as the store away', async () => {
    const away = { instances: { get: async () => Promise.reject(new StoreUnavailableError(new Error('ECONNREFUSED'))) } } as unknown as Store;
    const cluster = new Cluster(away, 'node-x', timing, log, (id) => id === 'inst_runs_here');
    expect(await cluster.locate('inst_runs_here')).toEqual({ kind: 'here' });
    await expect(cluster.locate('inst_elsewhere')).rejects.toBeInstanceOf(StoreUnavailableError);
  });
});
