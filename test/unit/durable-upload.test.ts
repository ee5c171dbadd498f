import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { DurableCheckpoints } from '../../src/core/durable.js';
import type { ObjectStore } from '../../src/store/object-store.js';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';

// Seen in CI: a checkpoint's layer deleted while its upload waited to start made tar fail before
// the upload piped its stream, and the error, heard by nobody, ended the server's process.
let node: FakeNode | undefined;
let tmp: string | undefined;
afterEach(async () => {
  await node?.close();
  if (tmp) await rm(tmp, { recursive: true, force: true });
  node = tmp = undefined;
});

/** An object store that keeps what it is given in memory. */
function memoryObjects(): ObjectStore & { keys: string[] } {
  const keys: string[] = [];
  const store = {
    keys,
    putFile: async (key: string) => void keys.push(key),
    putJson: async (key: string) => void keys.push(key),
    reachable: async () => {},
    close: () => {},
  };
  return store as unknown as ObjectStore & { keys: string[] };
}

describe('durable uploads', () => {
  it('fail, and are tried again later, when a layer is gone before its upload starts: the process goes on', async () => {
    node = await startFakeNode();
    const n = node;
    const id = (await n.call('POST', '/instances', {})).body.id as string;
    await n.sh(id, 'set counter 1');
    const ck = await n.call('POST', `/instances/${id}/checkpoints?wait=true`, {});
    expect(ck.body.status).toBe('ready');
    const layers = (await n.fp.store.checkpoints.get(ck.body.id))!.layers;
    tmp = await mkdtemp(join(tmpdir(), 'fp-unit-durable-'));
    const objects = memoryObjects();
    const durable = new DurableCheckpoints(n.fp.store, n.engine, objects, join(tmp, 'blobs'), pino({ level: 'silent' }));

    // The layer disappears after the check that the node has it, as a deletion racing the upload does.
    const hasLayer = n.engine.disk.hasLayer.bind(n.engine.disk);
    n.engine.disk.hasLayer = (l) => hasLayer(l) || layers.includes(l);
    for (const l of layers) n.host.layers.delete(l);
    durable.schedule(ck.body.id);
    await durable.idle();
    expect(await durable.state(ck.body.id)).toEqual({ durable: false, uploadedBytes: null });
    expect(objects.keys).toEqual([]);
    durable.close();
  });
});
