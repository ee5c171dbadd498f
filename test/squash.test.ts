import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually, startServer, type TestServer } from './helpers/server.js';

let s: TestServer;
beforeAll(async () => {
  s = await startServer({ squashAfterLayers: 4, squashKeepLayers: 2 });
});
afterAll(async () => s?.close());

describe('layer squashing', () => {
  it('keeps a deep chain short without changing what the instance or any checkpoint sees', async () => {
    const inst = await s.instance({ name: 'deep' });
    const checkpoints: { id: string; files: string }[] = [];
    const view = async (id: string) =>
      (await s.exec(id, { command: 'ls /root; cat /root/* 2>/dev/null; test -e /etc/hosts && echo hosts || echo no-hosts; ps -o args | grep -c "[s]leep 777"' })).stdout;
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'exec sleep 777' });
    for (let i = 0; i < 8; i++) {
      // Each step adds, changes and deletes files, including a file of the image; and writes
      // more than a memory checkpoint copies (MEMORY_COPY_LIMITS), so that its upper is frozen
      // by rename and the instance's chain deepens.
      await s.exec(inst.id, { command: `echo v${i} > /root/f${i}; echo changed-${i} > /root/f0; rm -f /root/f${i - 2}; ${i === 1 ? 'rm /etc/hosts' : 'true'}; head -c 300000 /dev/urandom > /var/pad` });
      const r = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { label: `step ${i}` });
      expect(r.body.status).toBe('ready');
      checkpoints.push({ id: r.body.id, files: await view(inst.id) });
    }
    await s.fp.checkpoints.idle();
    const rec = (await s.fp.store.instances.get(inst.id))!;
    expect(rec.layers.length).toBeLessThanOrEqual(5);
    expect(rec.baseLayer).toBe(true);
    const now = await view(inst.id);
    expect(now).toBe(checkpoints[7]!.files);
    expect(now).toContain('no-hosts'); // a whiteout of an image file survived the squash

    // The instance's next mount stands on the squashed chain and sees the same.
    const next = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {});
    expect(next.body.status).toBe('ready');
    expect(await view(inst.id)).toBe(checkpoints[7]!.files);
    // Old checkpoints kept their own chains: each rolls back to exactly what it saw.
    for (const k of [0, 3, 7, 1]) {
      expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: checkpoints[k]!.id })).status).toBe(200);
      expect(await view(inst.id)).toBe(checkpoints[k]!.files);
    }
    // Forks from a squashed chain work too.
    await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: next.body.id });
    const fork = (await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: next.body.id })).body;
    expect(await view(fork.id)).toBe(checkpoints[7]!.files);
    // Layers nothing stands on any more are gone.
    await eventually(async () => {
      const used = new Set(await s.fp.store.layers.referenced());
      return (await s.fp.store.layers.all()).every((l) => used.has(l));
    });
  });
});
