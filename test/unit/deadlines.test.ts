import { afterEach, describe, expect, it } from 'vitest';
import { delayUnlessAborted, untilAborted } from '../../src/lib/deadline.js';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';

// Waits take their bound as an AbortSignal: the route's deadline and its client's going away
// (req.clientGone) in one, so that a long poll whose client left holds nothing of the server's.
describe('waits bounded by a signal', () => {
  let n: FakeNode | undefined;
  afterEach(async () => {
    await n?.close();
    n = undefined;
  });

  it('untilAborted settles as the work does, or as the signal says once it aborts; an aborted signal answers at once', async () => {
    expect(await untilAborted(Promise.resolve(1), new AbortController().signal, () => 2)).toBe(1);
    const never = new Promise<number>(() => {});
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 10);
    expect(await untilAborted(never, ac.signal, () => 2)).toBe(2);
    expect(await untilAborted(never, ac.signal, () => 3)).toBe(3);
    await expect(untilAborted(never, AbortSignal.abort(), () => {
      throw new Error('late');
    })).rejects.toThrow('late');
    const t = performance.now();
    expect(await delayUnlessAborted(10_000, AbortSignal.timeout(20))).toBe(true);
    expect(performance.now() - t).toBeLessThan(5_000);
    expect(await delayUnlessAborted(1, new AbortController().signal)).toBe(false);
  });

  it('a wait on a checkpoint ends with its signal (the client gone), answering it processing; the checkpoint goes on and is ready', async () => {
    n = await startFakeNode();
    const id = (await n.call('POST', '/instances', {})).body.id as string;
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    const copy = n.engine.copyRunningUpper.bind(n.engine);
    n.engine.copyRunningUpper = async (...args) => {
      await gate;
      return copy(...args);
    };
    const made = await n.call('POST', `/instances/${id}/checkpoints`, {});
    expect(made.status).toBe(202);
    const client = new AbortController();
    const waiting = n.fp.checkpoints.wait('default', id, made.body.id, client.signal);
    client.abort(new Error('the client went away before the answer'));
    expect((await waiting).status).toBe('processing');
    open();
    expect((await n.fp.checkpoints.wait('default', id, made.body.id, AbortSignal.timeout(10_000))).status).toBe('ready');
  });

  it('a wait on an execution that ends with its signal before its subscription came closes that subscription when it comes', async () => {
    n = await startFakeNode();
    const id = (await n.call('POST', '/instances', {})).body.id as string;
    const st = await n.fp.executions.start('default', id, { kind: 'exec', argv: ['sleep'] });
    const sb = n.engine.sandbox(id)!;
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    let opened = 0;
    let closed = 0;
    const subscribe = sb.subscribe.bind(sb);
    sb.subscribe = async (...args) => {
      await gate;
      const s = await subscribe(...args);
      opened++;
      return { close: () => (closed++, s.close()) };
    };
    const client = new AbortController();
    const waiting = n.fp.executions.wait('default', id, st.record.id, client.signal);
    await new Promise((r) => setTimeout(r, 20));
    client.abort();
    expect((await waiting).running).toBe(true);
    open();
    await new Promise((r) => setTimeout(r, 20));
    expect([opened, closed]).toEqual([1, 1]);
  });
});
