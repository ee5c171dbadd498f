import { afterEach, describe, expect, it } from 'vitest';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';
import { ownerRecordsLock } from '../../src/core/jobs.js';

// The core's logic over the fake engine, through the Firecase face with `app.inject`: what a
// checkpoint, a rollback, a fork, a hibernation and a restart keep and lose, and what a failure
// of the engine leaves behind. No root, no sandbox, no socket.
let nodes: FakeNode[] = [];
afterEach(async () => {
  for (const n of nodes.reverse()) await n.close();
  nodes = [];
});
const node = async (config = {}) => {
  const n = await startFakeNode(config);
  nodes.push(n);
  return n;
};

const create = async (n: FakeNode, body: object = {}) => {
  const r = await n.call('POST', '/instances', body);
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
};
const checkpoint = async (n: FakeNode, id: string, body: object = {}) => {
  const r = await n.call('POST', `/instances/${id}/checkpoints?wait=true`, body);
  expect([r.status, r.body.status], JSON.stringify(r.body)).toEqual([200, 'ready']);
  return r.body.id as string;
};
const putFile = async (n: FakeNode, id: string, path: string, content: string) => {
  const r = await n.app.inject({ method: 'PUT', url: `/instances/${id}/files?path=${encodeURIComponent(path)}`, headers: { authorization: `Bearer ${n.token}`, 'content-type': 'application/octet-stream' }, payload: Buffer.from(content) });
  expect(r.statusCode, r.body).toBeLessThan(300);
};
const status = async (n: FakeNode, id: string) => (await n.call('GET', `/instances/${id}`)).body.status as string;

describe('checkpoint, rollback and fork keep files and memory', () => {
  it('a rollback brings back the checkpoint\'s files and memory, and drops what came after', async () => {
    const n = await node();
    const id = await create(n);
    await n.sh(id, 'set counter 1');
    await putFile(n, id, '/work/a.txt', 'one');
    const ck = await checkpoint(n, id);
    await n.sh(id, 'set counter 2');
    await putFile(n, id, '/work/a.txt', 'two');
    await putFile(n, id, '/work/b.txt', 'after');
    const rb = await n.call('POST', `/instances/${id}/rollback`, { checkpoint_id: ck });
    expect(rb.status, JSON.stringify(rb.body)).toBe(200);
    expect(await n.sh(id, 'get counter')).toBe('1');
    expect(await n.sh(id, 'cat /work/a.txt')).toBe('one');
    expect((await n.call('POST', `/instances/${id}/exec`, { command: 'cat /work/b.txt' })).body.exit_code).toBe(1);
    expect(await status(n, id)).toBe('running');
  });

  it('a rollback\'s layer references: the instance holds exactly the checkpoint\'s layers after it, a rollback to the layers it stands on included; the layers it left go', async () => {
    const n = await node();
    n.host.upperCopyLimit = 0; // every checkpoint freezes the upper into a layer of its own
    const id = await create(n);
    const held = async () => {
      const rec = (await n.fp.store.instances.get(id))!;
      const mine: string[] = [];
      for (const l of new Set([...rec.layers, ...n.host.layers.keys()])) if ((await n.fp.store.layers.holders(l)).includes(`instance:${id}`)) mine.push(l);
      return { layers: [...rec.layers].sort(), held: mine.sort() };
    };
    await putFile(n, id, '/work/a.txt', 'one');
    const first = await checkpoint(n, id);
    const atFirst = (await held()).layers;
    await putFile(n, id, '/work/a.txt', 'two');
    const second = await checkpoint(n, id);
    const atSecond = (await held()).layers;
    expect(atSecond.length).toBeGreaterThan(atFirst.length);
    for (const [ck, layers, content] of [[first, atFirst, 'one'], [first, atFirst, 'one'], [second, atSecond, 'two'], [second, atSecond, 'two'], [first, atFirst, 'one']] as const) {
      const rb = await n.call('POST', `/instances/${id}/rollback`, { checkpoint_id: ck });
      expect(rb.status, JSON.stringify(rb.body)).toBe(200);
      expect(await held()).toEqual({ layers, held: layers });
      expect(await n.sh(id, 'cat /work/a.txt')).toBe(content);
    }
    // The second checkpoint gone, its own layer has no holder left and goes from the disk.
    const own = atSecond.find((l) => !atFirst.includes(l))!;
    expect((await n.call('DELETE', `/instances/${id}/checkpoints/${second}`)).status).toBeLessThan(300);
    expect(await n.fp.store.layers.holders(own)).toEqual([]);
    expect(n.host.layers.has(own)).toBe(false);
  });

  it('forks start from the checkpoint, each on its own files', async () => {
    const n = await node();
    const id = await create(n);
    await n.sh(id, 'set counter 7');
    await putFile(n, id, '/f', 'base');
    const ck = await checkpoint(n, id);
    const r = await n.call('POST', `/instances/${id}/fork`, { checkpoint_id: ck, count: 2 });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    const [a, b] = (r.body.instances as { id: string }[]).map((i) => i.id) as [string, string];
    expect([await n.sh(a, 'get counter'), await n.sh(b, 'cat /f')]).toEqual(['7', 'base']);
    await putFile(n, a, '/f', 'changed in a');
    expect([await n.sh(b, 'cat /f'), await n.sh(id, 'cat /f')]).toEqual(['base', 'base']);
  });

  it('a fork is all or nothing: when one restore fails, no fork is left, running or recorded', async () => {
    const n = await node();
    const id = await create(n);
    const ck = await checkpoint(n, id);
    const before = (await n.call('GET', '/instances')).body.items.length;
    n.host.failAt('restore', 2);
    const r = await n.call('POST', `/instances/${id}/fork`, { checkpoint_id: ck, count: 3 });
    expect(r.status).toBeGreaterThanOrEqual(500);
    expect(r.body.error.code).not.toBe('INTERNAL');
    expect((await n.call('GET', '/instances')).body.items.length).toBe(before);
    expect([...n.host.running.keys()]).toEqual([id]);
  });

  it('a hibernated instance wakes with its memory and files', async () => {
    const n = await node();
    const id = await create(n);
    await n.sh(id, 'set counter 3');
    await putFile(n, id, '/kept', 'yes');
    expect((await n.call('POST', `/instances/${id}/hibernate`)).status).toBe(200);
    expect(await status(n, id)).toBe('hibernated');
    expect(n.host.running.has(id)).toBe(false);
    // Any call wakes it.
    expect(await n.sh(id, 'get counter')).toBe('3');
    expect(await n.sh(id, 'cat /kept')).toBe('yes');
    expect(await status(n, id)).toBe('running');
  });
});

describe('images', () => {
  it('a fork on a node without the checkpoint\'s image answers 409 IMAGE_NOT_ON_NODE, and makes nothing', async () => {
    let n = await startFakeNode({}, undefined, ['default', 'imported']);
    nodes.push(n);
    const id = await create(n, { image: 'imported' });
    const ck = await checkpoint(n, id);
    n = await n.restart(['default']); // the image is another machine's now
    nodes.push(n);
    const before = (await n.call('GET', '/instances')).body.items.length;
    const r = await n.call('POST', `/instances/${id}/fork`, { checkpoint_id: ck });
    expect([r.status, r.body.error.code, r.body.error.details]).toEqual([409, 'CONFLICT', { reason: 'IMAGE_NOT_ON_NODE', image: 'imported' }]);
    expect((await n.call('GET', '/instances')).body.items.length).toBe(before);
  });
});

describe('agent builds', () => {
  it('a fork of a memory checkpoint on a node of another agent build answers 409 AGENT_NOT_ON_NODE and makes nothing; one of files only boots on this node\'s agent', async () => {
    let n = await startFakeNode();
    nodes.push(n);
    const id = await create(n);
    await putFile(n, id, '/root/kept', 'files');
    const withMemory = await checkpoint(n, id, { memory: true });
    const filesOnly = await checkpoint(n, id, { memory: false });
    // The machine now runs another build, and the old agent layer is not on its disk.
    n.host.agentLayers.clear();
    n.host.agentBuild = 'agent-next';
    n = await n.restart();
    nodes.push(n);
    const before = (await n.call('GET', '/instances')).body.items.length;
    const refused = await n.call('POST', `/instances/${id}/fork`, { checkpoint_id: withMemory });
    expect([refused.status, refused.body.error.details]).toEqual([409, { reason: 'AGENT_NOT_ON_NODE', agent_layer: 'agent-fake' }]);
    expect((await n.call('GET', '/instances')).body.items.length).toBe(before);
    const booted = await n.call('POST', `/instances/${id}/fork`, { checkpoint_id: filesOnly });
    expect(booted.status, JSON.stringify(booted.body)).toBe(201);
    const fork = (booted.body.instances?.[0] ?? booted.body) as { id: string; status: string };
    expect(fork.status).toBe('running');
    const file = await n.app.inject({ method: 'GET', url: `/instances/${fork.id}/files?path=/root/kept`, headers: { authorization: `Bearer ${n.token}` } });
    expect(file.body).toBe('files');
  });
});

describe('checkpoints of running instances with a small upper', () => {
  it('copy it in a freeze (files only: no dump; with memory: dumped, left running; the instance stays on its upper); a large one is frozen by rename', async () => {
    const n = await node();
    const id = await create(n);
    await n.sh(id, 'set counter 1');
    await putFile(n, id, '/work/a.txt', 'one');
    await putFile(n, id, '/work/gone.txt', 'deleted after the checkpoint');
    const layersBefore = (await n.fp.store.instances.get(id))!.layers;
    const copied = await checkpoint(n, id, { memory: false });
    expect(n.host.calls.filter((c) => c.startsWith(`copy upper ${id}`) || c.startsWith(`checkpoint ${id}`))).toEqual([expect.stringMatching(/^copy upper /)]);
    // Its processes never stopped, and it stands on what it stood on.
    expect(await n.sh(id, 'get counter')).toBe('1');
    expect((await n.fp.store.instances.get(id))!.layers).toEqual(layersBefore);
    const del = await n.app.inject({ method: 'DELETE', url: `/instances/${id}/files?path=/work/gone.txt`, headers: { authorization: `Bearer ${n.token}` } });
    expect(del.statusCode, del.body).toBeLessThan(300);
    await putFile(n, id, '/work/a.txt', 'two');
    // A memory checkpoint after it copies the same upper, deletion included, and dumps the
    // processes, left running.
    const later = await checkpoint(n, id);
    expect(n.host.calls.at(-1)).toMatch(new RegExp(`^copy upper ${id} \\S+ with memory$`));
    expect(await n.sh(id, 'get counter')).toBe('1');
    expect((await n.call('POST', `/instances/${id}/exec`, { command: 'cat /work/gone.txt' })).body.exit_code).toBe(1);
    for (const [ck, a, gone] of [[copied, 'one', 0], [later, 'two', 1], [copied, 'one', 0]] as const) {
      const rb = await n.call('POST', `/instances/${id}/rollback`, { checkpoint_id: ck });
      expect(rb.status, JSON.stringify(rb.body)).toBe(200);
      expect(await n.sh(id, 'cat /work/a.txt')).toBe(a);
      expect((await n.call('POST', `/instances/${id}/exec`, { command: 'cat /work/gone.txt' })).body.exit_code).toBe(gone);
    }
    // A fork of the copy has its files.
    const fork = await n.call('POST', `/instances/${id}/fork`, { checkpoint_id: copied });
    expect(fork.status, JSON.stringify(fork.body)).toBe(201);
    expect(await n.sh((fork.body.instances?.[0] ?? fork.body).id as string, 'cat /work/a.txt')).toBe('one');

    n.host.upperCopyLimit = 0;
    await putFile(n, id, '/work/c.txt', 'big upper');
    await checkpoint(n, id, { memory: false });
    expect(n.host.calls.at(-1)).toMatch(new RegExp(`^checkpoint ${id} `));
    expect(await n.sh(id, 'cat /work/c.txt')).toBe('big upper');
  });

  it('a copied upper goes with its checkpoint', async () => {
    const n = await node();
    const id = await create(n);
    await putFile(n, id, '/work/a.txt', 'one');
    const ck = await checkpoint(n, id, { memory: false });
    const layer = n.host.calls.find((c) => c.startsWith(`copy upper ${id}`))!.split(' ').at(-1)!;
    expect(n.host.layers.has(layer)).toBe(true);
    const del = await n.call('DELETE', `/instances/${id}/checkpoints/${ck}`);
    expect(del.status, JSON.stringify(del.body)).toBeLessThan(300);
    expect(await n.fp.store.layers.holders(layer)).toEqual([]);
    expect(n.host.layers.has(layer)).toBe(false);
  });
});

describe('volumes', () => {
  it('a volume deleted while a create that mounts it is being recorded: one of them wins, nothing is left half-done', async () => {
    const n = await node();
    expect((await n.call('POST', '/volumes', { name: 'work', size_mb: 64 })).status).toBe(201);
    // The create has checked the volume and waits to record its instance; the delete comes now.
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    const held = n.fp.locks.run(ownerRecordsLock('default'), () => gate);
    const create = n.call('POST', '/instances', { volumes: [{ name: 'work', path: '/work' }] });
    await new Promise((r) => setTimeout(r, 50));
    const del = n.call('DELETE', '/volumes/work');
    await new Promise((r) => setTimeout(r, 50));
    open();
    await held;
    const [c, d] = await Promise.all([create, del]);
    // The create was first in line: it stands, and the volume with it.
    expect(c.status, JSON.stringify(c.body)).toBe(201);
    expect([d.status, d.body.error?.details?.reason]).toEqual([409, 'VOLUME_IN_USE']);
    expect((await n.call('GET', '/volumes/work')).status).toBe(200);
    expect(await status(n, c.body.id)).toBe('running');
  });
});

describe('retention and pins', () => {
  it('at the limit a checkpoint is refused (429), or with delete_oldest replaces the oldest', async () => {
    const n = await node();
    const id = await create(n, { max_checkpoints: 2 });
    const first = await checkpoint(n, id);
    await checkpoint(n, id);
    const refused = await n.call('POST', `/instances/${id}/checkpoints?wait=true`, {});
    expect([refused.status, refused.body.error.code]).toEqual([429, 'QUOTA_EXCEEDED']);
    const third = await checkpoint(n, id, { retention: { mode: 'delete_oldest' } });
    const ids = (await n.call('GET', `/instances/${id}/checkpoints`)).body.items.map((c: { id: string }) => c.id);
    expect(ids).toHaveLength(2);
    expect(ids).toContain(third);
    expect(ids).not.toContain(first);
  });

  it('a checkpoint a fork stands on cannot lose its layers: deleting it keeps the fork\'s files', async () => {
    const n = await node();
    const id = await create(n);
    await putFile(n, id, '/data', 'in the layer');
    const ck = await checkpoint(n, id);
    const fork = (await n.call('POST', `/instances/${id}/fork`, { checkpoint_id: ck })).body.id as string;
    expect((await n.call('DELETE', `/instances/${id}/checkpoints/${ck}`)).status).toBe(204);
    expect((await n.call('DELETE', `/instances/${id}`)).status).toBe(204);
    expect(await n.sh(fork, 'cat /data')).toBe('in the layer');
  });
});

describe('failures leave nothing half-done', () => {
  it('a boot that fails: the create answers 503 with a code, and nothing of it runs', async () => {
    const n = await node();
    n.host.failAt('boot');
    const r = await n.call('POST', '/instances', {});
    expect([r.status, r.body.error.code]).toEqual([503, 'UNAVAILABLE']);
    expect(n.host.running.size).toBe(0);
    const after = await create(n);
    expect(await status(n, after)).toBe('running');
  });

  it('a failed dump leaves the instance running as it was, and the checkpoint failed', async () => {
    const n = await node();
    const id = await create(n);
    await n.sh(id, 'set counter 5');
    n.host.failAt('dump');
    const r = await n.call('POST', `/instances/${id}/checkpoints?wait=true`, {});
    expect([r.status, r.body.status]).toEqual([200, 'failed']);
    expect(await status(n, id)).toBe('running');
    expect(await n.sh(id, 'get counter')).toBe('5');
  });

  it('a rollback whose restore fails leaves the instance in error, with no process left, and a second rollback mends it', async () => {
    const n = await node();
    const id = await create(n);
    await n.sh(id, 'set counter 1');
    const ck = await checkpoint(n, id);
    n.host.failAt('replace');
    const r = await n.call('POST', `/instances/${id}/rollback`, { checkpoint_id: ck });
    expect(r.status).toBe(503);
    expect(n.host.running.has(id)).toBe(false);
    expect(await status(n, id)).toBe('error');
    expect((await n.call('POST', `/instances/${id}/rollback`, { checkpoint_id: ck })).status).toBe(200);
    expect(await n.sh(id, 'get counter')).toBe('1');
  });
});

describe('a restart of the server', () => {
  it('adopts a sandbox it left frozen (stopped while its lease was in doubt), thawed, memory intact', async () => {
    let n = await node();
    const id = await create(n);
    await n.sh(id, 'set counter 4');
    await n.fp.engine.freeze(id);
    n = await n.restart();
    nodes.push(n);
    expect(n.host.frozen.has(id)).toBe(false);
    expect(await status(n, id)).toBe('running');
    expect(await n.sh(id, 'get counter')).toBe('4');
  });

  it('adopts the sandboxes that ran on: memory, files and status as they were', async () => {
    let n = await node();
    const id = await create(n);
    await n.sh(id, 'set counter 9');
    await putFile(n, id, '/x', 'kept');
    const pid = n.host.running.get(id)!.pid;
    n = await n.restart();
    nodes.push(n);
    expect(n.host.calls.filter((c) => c.startsWith('adopt'))).toEqual([`adopt ${id}`]);
    expect(n.host.running.get(id)!.pid).toBe(pid);
    expect(await status(n, id)).toBe('running');
    expect(await n.sh(id, 'get counter')).toBe('9');
    expect(await n.sh(id, 'cat /x')).toBe('kept');
  });
});

describe('usage', () => {
  it('a running instance\'s reading: what it wrote on disk and its memory, beside its limits; none for a stopped one (409)', async () => {
    const n = await node();
    const id = await create(n, { limits: { memory_mb: 256, disk_mb: 1024 } });
    await putFile(n, id, '/root/data', 'x'.repeat(10_000));
    const u = await n.call('GET', `/instances/${id}/usage`);
    expect(u.status, JSON.stringify(u.body)).toBe(200);
    expect(u.body).toMatchObject({ cpu_count: 1, memory_limit_bytes: 256 * 1024 * 1024, disk_total_bytes: 1024 * 1024 * 1024 });
    expect(u.body.disk_bytes).toBeGreaterThanOrEqual(10_000);
    expect((await n.call('POST', `/instances/${id}/stop`)).status).toBe(200);
    const stopped = await n.call('GET', `/instances/${id}/usage`);
    expect([stopped.status, stopped.body.error.details]).toEqual([409, { reason: 'NOT_RUNNING' }]);
  });
});

describe('directory watches', () => {
  it('a file written through the API is told as envd tells its write (a new one: create, chmod, write; one written over: chmod, write), nothing of its temporary name; a rollback does not end the watch; a stop ends it with a code', async () => {
    const n = await node();
    const id = await create(n);
    await putFile(n, id, '/w/a', 'one');
    const ck = await checkpoint(n, id);
    const w = await n.fp.files.watch('default', id, '/w', { recursive: true });
    const seen: string[] = [];
    const done = (async () => {
      for await (const e of w) seen.push(`${e.op} ${e.name}`);
    })();
    await putFile(n, id, '/w/a', 'two');
    await putFile(n, id, '/w/sub/b', 'new');
    expect((await n.call('POST', `/instances/${id}/rollback`, { checkpoint_id: ck })).status).toBe(200);
    await putFile(n, id, '/w/c', 'after the rollback');
    expect((await n.call('POST', `/instances/${id}/stop`)).status).toBe(200);
    await expect(done).rejects.toMatchObject({ code: 'CONFLICT', details: { reason: 'INSTANCE_NOT_RUNNING' } });
    expect(seen).toEqual(['chmod a', 'write a', 'create sub/b', 'chmod sub/b', 'write sub/b', 'create c', 'chmod c', 'write c']);
  });
});

describe('deleting', () => {
  it('a stop, start, hibernate or wake that waited for the instance\'s lock behind its delete answers 404, not 500', async () => {
    const n = await node();
    for (const call of ['stop', 'start', 'hibernate', 'wake'] as const) {
      const id = await create(n);
      let open!: () => void;
      const gate = new Promise<void>((r) => (open = r));
      const held = n.fp.locks.run(id, () => gate);
      const del = n.call('DELETE', `/instances/${id}`);
      await new Promise((r) => setTimeout(r, 50));
      const late = n.call('POST', `/instances/${id}/${call}`);
      await new Promise((r) => setTimeout(r, 50));
      open();
      await held;
      expect((await del).status).toBe(204);
      const r = await late;
      expect([call, r.status, r.body.error?.code], JSON.stringify(r.body)).toEqual([call, 404, 'NOT_FOUND']);
    }
  });

  it('two deletes of one instance at once: both end well, nothing is left, no 500 (the second read a record the first had removed)', async () => {
    const n = await node();
    const id = await create(n);
    const answers = await Promise.all([n.call('DELETE', `/instances/${id}`), n.call('DELETE', `/instances/${id}`), n.call('DELETE', `/instances/${id}`)]);
    for (const a of answers) expect([204, 404], JSON.stringify(a.body)).toContain(a.status);
    expect((await n.call('GET', `/instances/${id}`)).status).toBe(404);
  });
});
