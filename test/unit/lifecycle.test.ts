import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { allowed, Lifecycle, TRANSITIONS, TransitionConflictError, type Transition } from '../../src/core/lifecycle.js';
import type { InstanceStatus } from '../../src/store/instances.js';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';

// The instance lifecycle over the real store (SQLite), on an instance the fake engine made:
// every transition from every state, allowed or refused, and races between transitions.
const STATES: InstanceStatus[] = ['starting', 'running', 'hibernated', 'stopped', 'error', 'lost'];
let n: FakeNode;
let id: string;
let lifecycle: Lifecycle;

beforeAll(async () => {
  n = await startFakeNode();
  const r = await n.call('POST', '/instances', {});
  expect(r.status).toBe(201);
  id = r.body.id;
  // The row alone is moved here: the sandbox is not needed.
  await n.fp.engine.stop(id);
  lifecycle = new Lifecycle(n.fp.store, n.fp.cluster.nodeId);
});
afterAll(async () => n?.close());

/** Puts the row in `status` (the way only the cluster and this test write it: a raw CAS). */
async function put(status: InstanceStatus) {
  const cur = (await n.fp.store.instances.get(id))!;
  const next = await n.fp.store.instances.compareAndSet(id, cur.version, cur.node, { status });
  expect(next?.status).toBe(status);
  return next!;
}

const reasonOf = async (p: Promise<unknown>) => {
  try {
    await p;
    return 'moved';
  } catch (err) {
    expect(err).toBeInstanceOf(TransitionConflictError);
    expect((err as TransitionConflictError).code).toBe('CONFLICT'); // 409 on every face
    return ((err as TransitionConflictError).details as { reason: string }).reason;
  }
};

describe('the instance lifecycle', () => {
  for (const t of Object.keys(TRANSITIONS) as Transition[]) {
    for (const from of STATES) {
      const ok = allowed(t, from);
      it(`${t} from ${from}: ${ok ? `moves to ${TRANSITIONS[t].to}` : 'refused, nothing written'}`, async () => {
        const before = await put(from);
        const outcome = await reasonOf(lifecycle.move(id, t));
        const after = (await n.fp.store.instances.get(id))!;
        if (ok) {
          expect(outcome).toBe('moved');
          expect([after.status, after.version]).toEqual([TRANSITIONS[t].to, before.version + 1]);
        } else {
          expect(outcome).toBe('TRANSITION_NOT_ALLOWED');
          expect([after.status, after.version]).toEqual([from, before.version]);
        }
      });
    }
  }

  it('the table is what the states allow: lost is left to the cluster, every other state can stop and fail', () => {
    for (const t of Object.keys(TRANSITIONS) as Transition[]) expect(allowed(t, 'lost')).toBe(false);
    for (const s of STATES.filter((x) => x !== 'lost')) expect([allowed('stop', s), allowed('fail', s)]).toEqual([true, true]);
  });

  it('two transitions at once on one instance: exactly one wins, the other is a 409', async () => {
    for (let round = 0; round < 20; round++) {
      await put('running');
      const outcomes = await Promise.all([reasonOf(lifecycle.move(id, 'hibernate')), reasonOf(lifecycle.move(id, 'hibernate'))]);
      expect(outcomes.filter((o) => o === 'moved')).toHaveLength(1);
      expect(outcomes.filter((o) => o !== 'moved')[0]).toMatch(/^TRANSITION_(NOT_ALLOWED|OVERTAKEN)$/);
      expect((await n.fp.store.instances.get(id))!.status).toBe('hibernated');
    }
  });

  it('a write read before another landed is refused (the stale write of a second node)', async () => {
    const read = await put('running');
    await lifecycle.move(id, 'stop');
    // A writer that read `read` and writes now, as another node or a slow request would.
    expect(await n.fp.store.instances.compareAndSet(id, read.version, read.node, { status: 'running' })).toBeUndefined();
    expect((await n.fp.store.instances.get(id))!.status).toBe('stopped');
  });

  it('an instance another node owns is not moved by this one', async () => {
    // The way an instance changes node: lost, then claimed by another.
    await put('lost');
    expect(await n.fp.store.instances.claimLost(id, 'node-elsewhere')).toBe(true);
    expect(await reasonOf(lifecycle.move(id, 'stop'))).toBe('TRANSITION_NOT_THIS_NODE');
    expect((await n.fp.store.instances.get(id))!.node).toBe('node-elsewhere');
  });
});

describe('the checkpoint lifecycle: processing, then ready or failed, once', () => {
  it('settles from processing only: an outcome that comes second never overwrites the first', async () => {
    const made = await n.call('POST', '/instances', {});
    const r = await n.call('POST', `/instances/${made.body.id}/checkpoints?wait=true`, {});
    expect(r.body.status).toBe('ready');
    const ready = r.body.id as string;
    // A late failure (a job that timed out, a recovery's verdict) of a ready checkpoint: refused.
    expect(await n.fp.store.checkpoints.settle(ready, { status: 'failed', error: 'late' })).toBe(false);
    expect(await n.fp.store.checkpoints.settle(ready, { status: 'ready', deltaBytes: 1, memoryBytes: 1, readyAt: new Date().toISOString() })).toBe(false);
    const now = (await n.fp.store.checkpoints.get(ready))!;
    expect([now.status, now.error]).toEqual(['ready', null]);
    // A failed one stays failed.
    n.host.failAt('dump');
    const failed = (await n.call('POST', `/instances/${made.body.id}/checkpoints?wait=true`, {})).body;
    expect(failed.status).toBe('failed');
    expect(await n.fp.store.checkpoints.settle(failed.id, { status: 'ready', deltaBytes: 1, memoryBytes: 1, readyAt: new Date().toISOString() })).toBe(false);
    expect((await n.fp.store.checkpoints.get(failed.id))!.status).toBe('failed');
  });
});
