import { afterEach, describe, expect, it } from 'vitest';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';
import { ownerRecordsLock } from '../../src/core/jobs.js';

// Warm forks over the fake engine: a fork of a checkpoint leaves a standby restored from it and
// held frozen; the next fork of it takes that standby instead of restoring. What it must keep:
// the checkpoint's state, the owner's quota and privacy, and nothing left behind.
let nodes: FakeNode[] = [];
afterEach(async () => {
  for (const n of nodes.reverse()) await n.close();
  nodes = [];
});
const node = async (config = {}) => {
  const n = await startFakeNode({ warmForks: 4, ...config });
  nodes.push(n);
  return n;
};

const putFile = async (n: FakeNode, id: string, path: string, content: string) => {
  const r = await n.app.inject({ method: 'PUT', url: `/instances/${id}/files?path=${encodeURIComponent(path)}`, headers: { authorization: `Bearer ${n.token}`, 'content-type': 'application/octet-stream' }, payload: Buffer.from(content) });
  expect(r.statusCode, r.body).toBeLessThan(300);
};
const fork = async (n: FakeNode, id: string, body: object) => {
  const r = await n.call('POST', `/instances/${id}/fork`, body);
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
};

/** An instance with a counter in memory and a file, and a memory checkpoint of it. */
async function source(n: FakeNode): Promise<{ id: string; ck: string }> {
  const id = (await n.call('POST', '/instances', {})).body.id as string;
  await n.sh(id, 'set counter 1');
  await putFile(n, id, '/work/a.txt', 'one');
  const ck = (await n.call('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true })).body.id as string;
  await n.sh(id, 'set counter 2');
  return { id, ck };
}

/** The forks' standbys (creates leave standbys of their images too: see the creates' tests). */
const standbys = (n: FakeNode) => n.fp.warm.held().filter((s) => !s.key.startsWith('image:'));

async function until(fn: () => Promise<boolean>, ms = 10_000): Promise<void> {
  for (const end = Date.now() + ms; !(await fn()); ) {
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('warm forks', () => {
  it('the second fork of a checkpoint takes the standby the first left: the checkpoint\'s memory and files, its own upper, thawed with its name', async () => {
    const n = await node();
    const { id, ck } = await source(n);
    const first = await fork(n, id, { checkpoint_id: ck });
    await n.fp.warm.settled();
    const [standby] = standbys(n);
    expect(standby?.key).toBe(ck);
    expect(n.host.frozen.has(standby!.id)).toBe(true);
    // Nobody's to see: not listed, not found, not counted.
    expect((await n.call('GET', '/instances')).body.items.map((i: { id: string }) => i.id).sort()).toEqual([first, id].sort());
    expect((await n.call('GET', `/instances/${standby!.id}`)).status).toBe(404);

    await putFile(n, first, '/work/a.txt', 'first fork wrote this');
    const second = await fork(n, id, { checkpoint_id: ck, name: 'warm-one' });
    expect(second).toBe(standby!.id);
    expect(n.host.calls).toContain(`activate ${second} warm-one`);
    expect(n.host.frozen.has(second)).toBe(false);
    const view = (await n.call('GET', `/instances/${second}`)).body;
    expect([view.name, view.status, view.source_checkpoint_id, view.warm_fork]).toEqual(['warm-one', 'running', ck, true]);
    expect((await n.call('GET', `/instances/${first}`)).body.warm_fork).toBe(false);
    expect(await n.sh(second, 'get counter')).toBe('1');
    expect(await n.sh(second, 'cat /work/a.txt')).toBe('one');
    // And the pool fills again for the next one.
    await n.fp.warm.settled();
    expect(standbys(n).map((s) => s.key)).toEqual([ck]);
    // An operator sees both kinds of fork, and what is held.
    const metrics = (await n.call('GET', '/metrics')).raw;
    expect(metrics).toMatch(/^forkpoint_forks_total\{kind="warm"\} 1$/m);
    expect(metrics).toMatch(/^forkpoint_forks_total\{kind="cold"\} 1$/m);
    // This fork's standby, and the one the source's create left of its image.
    expect(metrics).toMatch(/^forkpoint_warm_standbys\{kind="fork"\} 1$/m);
    expect(metrics).toMatch(/^forkpoint_warm_standbys\{kind="create"\} 1$/m);
    expect(metrics).toMatch(/^forkpoint_warm_standbys\{kind="rollback"\} 0$/m);
  });

  it('a warm fork past the owner\'s quota is refused as a cold one would be (429), and the standby stays for later', async () => {
    const n = await node({ ownerMaxInstances: 3 });
    const { id, ck } = await source(n);
    await fork(n, id, { checkpoint_id: ck });
    await n.fp.warm.settled();
    const [standby] = standbys(n);
    expect(standby).toBeDefined();
    // A create first in line for the owner's last place, the fork (past the first check) second.
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    const held = n.fp.locks.run(ownerRecordsLock('default'), () => gate);
    const create = n.call('POST', '/instances', {});
    await new Promise((r) => setTimeout(r, 50));
    const refused = n.call('POST', `/instances/${id}/fork`, { checkpoint_id: ck });
    await new Promise((r) => setTimeout(r, 50));
    open();
    await held;
    const [c, f] = await Promise.all([create, refused]);
    expect(c.status).toBe(201);
    expect([f.status, f.body.error?.code]).toEqual([429, 'QUOTA_EXCEEDED']);
    expect(standbys(n).map((s) => s.id)).toEqual([standby!.id]);
    expect(n.host.frozen.has(standby!.id)).toBe(true);
  });

  it('deleting the checkpoint, or the server stopping or restarting, removes its standbys: no sandbox, no record', async () => {
    const n = await node();
    const { id, ck } = await source(n);
    await fork(n, id, { checkpoint_id: ck });
    await n.fp.warm.settled();
    const [standby] = standbys(n);
    expect((await n.call('DELETE', `/instances/${id}/checkpoints/${ck}`)).status).toBe(204);
    expect(standbys(n)).toEqual([]);
    expect(n.host.running.has(standby!.id)).toBe(false);
    expect(await n.fp.store.instances.get(standby!.id)).toBeUndefined();

    const ck2 = (await n.call('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true })).body.id as string;
    await fork(n, id, { checkpoint_id: ck2 });
    await n.fp.warm.settled();
    const [again] = standbys(n);
    // A server killed with its standbys held: the next start removes them.
    const sandboxes = n.host.running;
    const next = await n.restart();
    nodes.push(next);
    expect(sandboxes.has(again!.id)).toBe(false);
    expect(await next.fp.store.instances.get(again!.id)).toBeUndefined();
  });

  it('none are made with warmForks 0, for a fork with no memory, or for another owner\'s fork of a template', async () => {
    const off = await node({ warmForks: 0 });
    const { id, ck } = await source(off);
    await fork(off, id, { checkpoint_id: ck });
    await off.fp.warm.settled();
    expect(standbys(off)).toEqual([]);

    const n = await node();
    const s = await source(n);
    const filesOnly = (await n.call('POST', `/instances/${s.id}/checkpoints?wait=true`, { memory: false })).body.id as string;
    await fork(n, s.id, { checkpoint_id: filesOnly });
    await fork(n, s.id, { checkpoint_id: s.ck, volumes: 'none' });
    await n.fp.warm.settled();
    expect(standbys(n)).toEqual([]);
  });

  it('a template\'s next instance takes the standby its last one left, with its own name and variables; one asking other limits restores instead', async () => {
    const n = await node();
    expect((await n.call('POST', '/templates', { name: 'tpl', from_image: 'default', start_command: 'sleep 1000' })).status).toBe(201);
    const a = await n.call('POST', '/instances', { template: 'tpl' });
    expect(a.status, JSON.stringify(a.body)).toBe(201);
    await n.fp.warm.settled();
    const [standby] = standbys(n);
    expect(standby).toBeDefined();
    const b = await n.call('POST', '/instances', { template: 'tpl', name: 'bee', env: { WHO: 'b' }, metadata: { k: 'v' } });
    expect(b.status, JSON.stringify(b.body)).toBe(201);
    expect(b.body.id).toBe(standby!.id);
    expect([b.body.name, b.body.image, b.body.metadata]).toEqual(['bee', 'tpl', { k: 'v' }]);
    expect((await n.fp.store.instances.get(b.body.id))!.env.WHO).toBe('b');
    expect(n.host.calls).toContain(`activate ${b.body.id} bee`);
    await n.fp.warm.settled();
    const [next] = standbys(n);
    const c = await n.call('POST', '/instances', { template: 'tpl', limits: { memory_mb: 300 } });
    expect(c.status, JSON.stringify(c.body)).toBe(201);
    expect(c.body.id).not.toBe(next!.id);
    expect(standbys(n).map((s) => s.id)).toContain(next!.id);
    // Deleting the template takes its standbys along; its instances run on.
    expect((await n.call('DELETE', '/templates/tpl')).status).toBe(204);
    expect(standbys(n)).toEqual([]);
    expect((await n.call('GET', `/instances/${b.body.id}`)).body.status).toBe('running');
  });

  it('a node judged lost has its standbys\' records removed (their addresses and uid ranges free again); its instances are lost', async () => {
    const n = await node({ nodeHeartbeatS: 0.1, nodeDeadAfterS: 0.5 });
    await n.fp.cluster.join('http://127.0.0.1:1');
    await n.fp.store.nodes.register('node-gone', 'http://127.0.0.1:2', new Date(Date.now() - 60_000).toISOString());
    const id = (await n.call('POST', '/instances', {})).body.id as string;
    const base = (await n.fp.store.instances.get(id))!;
    // As node-gone would have written them: an instance of its own and a standby it held.
    const theirs = { ...base, id: 'inst_theirs00000000', node: 'node-gone', address: null, uidBase: null };
    const standby = { ...theirs, id: 'inst_standby0000000', owner: '@standby/default' };
    await n.fp.store.instances.insert(theirs);
    await n.fp.store.instances.insert(standby);
    await n.fp.store.layers.setRefs(`instance:${standby.id}`, standby.layers);
    await until(async () => (await n.fp.store.instances.get(theirs.id))?.status === 'lost');
    expect(await n.fp.store.instances.get(standby.id)).toBeUndefined();
  });

  it('attack: no token can speak for the owners the server keeps standbys and templates under', async () => {
    const n = await node();
    await expect(n.fp.store.tokens.create('@standby/default', 'x')).rejects.toThrow(/may not begin with @ or ~/);
    await expect(n.fp.store.tokens.create('~template:default', 'x')).rejects.toThrow(/may not begin with @ or ~/);
  });
});

describe('warm creates', () => {
  const imageStandbys = (n: FakeNode) => n.fp.warm.held().filter((s) => s.key === 'image:default');

  it('a create leaves a standby of its image booted and frozen; the next create of that image takes it, with its own name, variables and metadata', async () => {
    const n = await node();
    const first = await n.call('POST', '/instances', {});
    expect([first.status, first.body.warm_fork]).toEqual([201, false]);
    await n.fp.warm.settled();
    const [standby] = imageStandbys(n);
    expect(standby).toBeDefined();
    expect(n.host.frozen.has(standby!.id)).toBe(true);
    expect((await n.call('GET', '/instances')).body.items.map((i: { id: string }) => i.id)).toEqual([first.body.id]);

    const second = await n.call('POST', '/instances', { name: 'quick', env: { WHO: 'me' }, metadata: { k: 'v' } });
    expect(second.status, JSON.stringify(second.body)).toBe(201);
    expect([second.body.id, second.body.name, second.body.metadata, second.body.warm_fork, second.body.status]).toEqual([standby!.id, 'quick', { k: 'v' }, true, 'running']);
    expect(n.host.frozen.has(second.body.id)).toBe(false);
    expect(n.host.calls).toContain(`activate ${second.body.id} quick`);
    // The image's variables are the instance's too, as a cold create's are, with the create's.
    expect((await n.fp.store.instances.get(second.body.id))!.env).toEqual({ ...(await n.fp.store.instances.get(first.body.id))!.env, WHO: 'me' });
    await n.fp.warm.settled();
    expect(imageStandbys(n)).toHaveLength(1);
  });

  it('a create asking for other limits, volumes or secrets boots as before and leaves the standby for later', async () => {
    const n = await node();
    await n.call('POST', '/instances', {});
    await n.fp.warm.settled();
    const [standby] = imageStandbys(n);
    const bigger = await n.call('POST', '/instances', { limits: { memory_mb: 300 } });
    expect(bigger.status, JSON.stringify(bigger.body)).toBe(201);
    expect([bigger.body.id === standby!.id, bigger.body.warm_fork]).toEqual([false, false]);
    expect((await n.call('POST', '/volumes', { name: 'v', size_mb: 64 })).status).toBe(201);
    const mounted = await n.call('POST', '/instances', { volumes: [{ name: 'v', path: '/data' }] });
    expect([mounted.status, mounted.body.id === standby!.id]).toEqual([201, false]);
    expect(imageStandbys(n).map((s) => s.id)).toEqual([standby!.id]);
  });
});

describe('warm standbys and the pools every owner shares', () => {
  it('a create that finds the uid ranges (or addresses) held by standbys gets one: the standbys give theirs up', async () => {
    const n = await node({ uidRanges: 2 });
    expect((await n.call('POST', '/instances', {})).status).toBe(201);
    await n.fp.warm.settled();
    expect(n.fp.warm.held()).toHaveLength(1);
    // Other limits: not the standby's to stand in for, and the last range is the standby's.
    const other = await n.call('POST', '/instances', { limits: { memory_mb: 300 } });
    expect(other.status, JSON.stringify(other.body)).toBe(201);
    // Both ranges are instances' now: the next standby cannot be made, and none is.
    await n.fp.warm.settled();
    expect(n.fp.warm.held()).toEqual([]);
  });

  it('a warm fork counts against its owner\'s share of the uid ranges: past it 429 with the reason, the standby kept for later', async () => {
    const n = await node({ uidRanges: 8, uidRangesPerOwner: 2 });
    const { id, ck } = await source(n);
    const first = await fork(n, id, { checkpoint_id: ck });
    await n.fp.warm.settled();
    expect(standbys(n)).toHaveLength(1);
    const refused = await n.call('POST', `/instances/${id}/fork`, { checkpoint_id: ck });
    expect(refused.status, JSON.stringify(refused.body)).toBe(429);
    expect(refused.body.error).toMatchObject({ code: 'QUOTA_EXCEEDED', details: { reason: 'UID_RANGES_PER_OWNER', limit: 2 } });
    expect(standbys(n)).toHaveLength(1);
    expect((await n.call('DELETE', `/instances/${first}`)).status).toBe(204);
    const warm = await n.call('POST', `/instances/${id}/fork`, { checkpoint_id: ck });
    expect([warm.status, warm.body.warm_fork]).toEqual([201, true]);
  });

  it('a fork of an instance that mounts a volume leaves no standby (it would hold the owner\'s data, and the volume in use)', async () => {
    const n = await node();
    expect((await n.call('POST', '/volumes', { name: 'v', size_mb: 64 })).status).toBe(201);
    const id = (await n.call('POST', '/instances', { volumes: [{ name: 'v', path: '/data' }] })).body.id as string;
    const ck = (await n.call('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true })).body.id as string;
    await fork(n, id, { checkpoint_id: ck });
    await n.fp.warm.settled();
    expect(standbys(n)).toEqual([]);
    expect((await n.call('GET', '/volumes/v')).body.instances).toHaveLength(2);
  });
});

describe('warm rollbacks', () => {
  const rollback = async (n: FakeNode, id: string, ck: string) => {
    const r = await n.call('POST', `/instances/${id}/rollback`, { checkpoint_id: ck });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
  };
  const held = (n: FakeNode) => n.fp.warm.held().filter((s) => s.kind === 'rollback').map((s) => s.key);
  const replaces = (n: FakeNode, id: string) => n.host.calls.filter((c) => c.startsWith(`replace ${id}`));

  it('a rollback leaves a standby of its checkpoint; the next rollback to it is warm, one to another checkpoint is not and drops it', async () => {
    const n = await node();
    const { id, ck } = await source(n);
    await rollback(n, id, ck);
    await n.fp.warm.settled();
    expect(held(n)).toEqual([`rollback:${id}:${ck}`]);
    expect(n.engine.rollbackStandbys.get(id)?.imagesId).toBe(ck);

    await n.sh(id, 'set counter 3');
    await rollback(n, id, ck);
    expect(replaces(n, id)).toEqual([`replace ${id} ${ck}`, `replace ${id} ${ck} warm`]);
    expect(await n.sh(id, 'get counter')).toBe('1');
    await n.fp.warm.settled();
    expect(held(n)).toEqual([`rollback:${id}:${ck}`]);

    // An instance that rolls back: its newest memory checkpoint's standby takes the place of
    // the last, and the first rollback to it is warm too.
    const ck2 = (await n.call('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true })).body.id as string;
    await n.fp.warm.settled();
    expect(n.host.calls).toContain(`dropRollback ${id}`);
    expect(held(n)).toEqual([`rollback:${id}:${ck2}`]);
    await rollback(n, id, ck2);
    expect(replaces(n, id).at(-1)).toBe(`replace ${id} ${ck2} warm`);
    // A rollback to another checkpoint than the standby's restores, and the standby goes.
    await n.fp.warm.settled();
    await rollback(n, id, ck);
    expect(replaces(n, id).at(-1)).toBe(`replace ${id} ${ck}`);
    expect(n.engine.rollbackStandbys.get(id)?.imagesId).not.toBe(ck2);
    await n.fp.warm.settled();
    expect(held(n)).toEqual([`rollback:${id}:${ck}`]);
  });

  it('deleting its checkpoint or its instance removes the standby; so do a stop and a hibernation, and the next rollback then restores', async () => {
    const n = await node();
    const { id, ck } = await source(n);
    const ck2 = (await n.call('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true })).body.id as string;
    await rollback(n, id, ck);
    await n.fp.warm.settled();
    expect(held(n)).toEqual([`rollback:${id}:${ck}`]);
    expect((await n.call('DELETE', `/instances/${id}/checkpoints/${ck}`)).status).toBe(204);
    expect(held(n)).toEqual([]);
    expect(n.engine.rollbackStandbys.has(id)).toBe(false);

    await rollback(n, id, ck2);
    await n.fp.warm.settled();
    expect(n.engine.rollbackStandbys.has(id)).toBe(true);
    expect((await n.call('POST', `/instances/${id}/hibernate`)).status).toBe(200);
    expect(n.engine.rollbackStandbys.has(id)).toBe(false);
    expect((await n.call('POST', `/instances/${id}/wake`)).status).toBe(200);
    await rollback(n, id, ck2);
    expect(replaces(n, id).at(-1)).toBe(`replace ${id} ${ck2}`);
    await n.fp.warm.settled();
    expect(held(n)).toEqual([`rollback:${id}:${ck2}`]);
    expect((await n.call('DELETE', `/instances/${id}`)).status).toBe(204);
    expect(held(n)).toEqual([]);
    expect(n.engine.rollbackStandbys.size).toBe(0);
  });
});
