import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Lifecycle, TransitionConflictError } from '../../src/core/lifecycle.js';
import { StaleWriteError } from '../../src/store/fence.js';
import { openStore, type Store } from '../../src/store/index.js';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';

// The stale-write race, step by step over one database: node A reads its instance, node B
// judges A silent (ends its lease, marks the instance lost) and takes the instance over, then
// A's write lands. Without leases A's write overwrote B's record; with them it is refused.
let a: FakeNode;
let b: Store;
let bEpoch: number;

beforeAll(async () => {
  a = await startFakeNode();
  await a.fp.cluster.join('http://127.0.0.1:1');
  b = await openStore(join(a.dataDir, 'forkpoint.db'));
  bEpoch = await b.nodes.register('node-b', 'http://127.0.0.1:2', new Date().toISOString());
  b.fence.set('node-b', bEpoch);
});
afterAll(async () => {
  await b?.close();
  await a?.close();
});

const create = async () => {
  const r = await a.call('POST', '/instances', {});
  expect(r.status).toBe(201);
  return r.body.id as string;
};
/** What A's heartbeat does once it finds its lease ended: a new one. */
const renewA = async () => {
  const epoch = await a.fp.store.nodes.renewLease(a.fp.cluster.nodeId, new Date().toISOString());
  a.fp.store.fence.set(a.fp.cluster.nodeId, epoch);
};
/** What node B does when it judges A silent: A's lease ends and its instances are lost, at once. */
const endLeaseOfA = () => b.transaction(async (tx) => tx.instances.markLost(await tx.nodes.endLeases([a.fp.cluster.nodeId], new Date(Date.now() + 1000).toISOString())));

describe('writes carry the lease they were made under', () => {
  it('a late write of a node whose instance another node took over is refused, and the new owner\'s record stays', async () => {
    const id = await create();
    const readByA = (await a.fp.store.instances.get(id))!;
    expect(await endLeaseOfA()).toContain(id);
    expect(await b.instances.claimLost(id, 'node-b')).toBe(true);
    await b.instances.update(id, { pid: 4242, pidStart: 'of-b' });

    await expect(a.fp.store.instances.update(id, { pid: 1111, pidStart: 'of-a' })).rejects.toBeInstanceOf(StaleWriteError);
    expect(await a.fp.store.instances.compareAndSet(id, readByA.version, readByA.node, { status: 'running' })).toBeUndefined();
    const lifecycle = new Lifecycle(a.fp.store, a.fp.cluster.nodeId);
    await expect(lifecycle.move(id, 'stop')).rejects.toBeInstanceOf(TransitionConflictError);
    const now = (await b.instances.get(id))!;
    expect([now.node, now.status, now.pid, now.pidStart]).toEqual(['node-b', 'starting', 4242, 'of-b']);
  });

  it('once its lease ended, a node\'s writes are refused even on instances no one took: until it holds a new lease', async () => {
    await renewA();
    const id = await create();
    await endLeaseOfA();
    const err = await a.fp.store.instances.update(id, { pid: 7 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StaleWriteError);
    expect((await a.call('PATCH', `/instances/${id}`, { metadata: { k: 'v' } })).body.error).toMatchObject({ code: 'CONFLICT', details: { reason: 'STALE_WRITE' } });
    await renewA();
    expect(await a.fp.store.instances.reclaimLost(id, a.fp.cluster.nodeId, 'running')).toBe(true);
    expect((await a.fp.store.instances.update(id, { pid: 7 })).pid).toBe(7);
  });

  it('a heartbeat of an ended lease renews nothing; a lease whose heartbeat landed in time is not ended', async () => {
    const node = a.fp.cluster.nodeId;
    const epoch = (await a.fp.store.nodes.get(node))!.epoch;
    expect(await a.fp.store.nodes.heartbeat(node, new Date().toISOString(), epoch)).toBe(true);
    // B's cutoff is before A's last heartbeat: A's lease holds.
    expect(await b.nodes.endLeases([node], new Date(Date.now() - 60_000).toISOString())).toEqual([]);
    expect(await b.nodes.endLeases([node], new Date(Date.now() + 1000).toISOString())).toEqual([node]);
    expect(await a.fp.store.nodes.heartbeat(node, new Date().toISOString(), epoch)).toBe(false);
  });
});
