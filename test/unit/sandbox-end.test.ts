import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';
import { until } from '../helpers/wait.js';

// A sandbox whose PID 1 ends with nothing of forkpoint's asking (killed from the host, by the
// kernel's out-of-memory killer, its agent failed): the instance stops, says why, and starts
// again on its files. The real engine's side (the end seen from /proc) is in test/lifecycle-ends.test.ts.
let n: FakeNode;
beforeAll(async () => {
  n = await startFakeNode();
});
afterAll(async () => n?.close());

const create = async () => {
  const r = await n.call('POST', '/instances', {});
  expect(r.status).toBe(201);
  return r.body.id as string;
};

describe('a sandbox that ends on its own', () => {
  it('stops its instance with the reason in `error`; calls answer 409 saying why; a start boots it again, the error gone', async () => {
    const id = await create();
    await n.call('PUT', `/instances/${id}/files?path=/root/kept`, 'kept');
    n.engine.endSandbox(id, 'its PID 1 was killed by the test');
    await until('the instance stopped', async () => (await n.call('GET', `/instances/${id}`)).body.status === 'stopped');
    const view = (await n.call('GET', `/instances/${id}`)).body;
    expect(view.error).toBe('its PID 1 was killed by the test');
    const exec = await n.call('POST', `/instances/${id}/exec`, { command: 'true' });
    expect(exec.status).toBe(409);
    expect(exec.body.error.message).toContain('its PID 1 was killed by the test');
    expect((await n.call('POST', `/instances/${id}/start`)).status).toBe(200);
    const started = (await n.call('GET', `/instances/${id}`)).body;
    expect([started.status, started.error]).toEqual(['running', null]);
    expect((await n.call('GET', `/instances/${id}/files?path=/root/kept`)).raw).toBe('kept');
  });

  it('an end told of a PID 1 that an operation has since replaced, or of an instance stopped meanwhile, changes nothing', async () => {
    const id = await create();
    const sandbox = n.engine.sandbox(id)!;
    const stale = { id, sandbox, pid: sandbox.pid + 1000, startTime: sandbox.startTime, reason: 'a stale end' };
    expect(await n.fp.instances.sandboxEnded(stale)).toBe(false);
    expect((await n.call('GET', `/instances/${id}`)).body.status).toBe('running');
    const current = { ...stale, pid: sandbox.pid };
    expect((await n.call('POST', `/instances/${id}/stop`)).status).toBe(200);
    expect(await n.fp.instances.sandboxEnded(current)).toBe(false);
    const view = (await n.call('GET', `/instances/${id}`)).body;
    expect([view.status, view.error]).toEqual(['stopped', null]);
  });
});
