import { afterEach, describe, expect, it } from 'vitest';
import { execIdOf } from '../../src/core/executions.js';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';

// One model of commands that run on: a background process (`/processes`, by the agent's number)
// is an execution (`/exec`, by its exec id) that nobody follows. The two routes are two names for
// one record; neither knows a process the other does not.
describe('background processes are executions', () => {
  let n: FakeNode | undefined;
  afterEach(async () => {
    await n?.close();
    n = undefined;
  });

  it('a process started on /processes is the execution its exec_id names, both ways, through its end and its deletion', async () => {
    n = await startFakeNode();
    const id = (await n.call('POST', '/instances', {})).body.id as string;
    const started = await n.call('POST', `/instances/${id}/processes`, { command: 'sleep 100' });
    expect(started.status).toBe(201);
    const { process_id: pid, exec_id: execId } = started.body as { process_id: number; exec_id: string };
    expect(execId).toBe(execIdOf(pid));
    // Nobody follows it: its output waits in the sandbox for a reader, never for the server.
    expect(n.engine.sandbox(id)!.followed(pid)).toBe(false);

    const asExec = await n.call('GET', `/instances/${id}/exec/${execId}`);
    expect([asExec.status, asExec.body.status, asExec.body.command]).toEqual([200, 'running', ['/bin/sh', '-c', 'sleep 100']]);
    expect((await n.call('GET', `/instances/${id}/exec`)).body.items.map((e: { id: string }) => e.id)).toEqual([execId]);

    // A streamed command's execution is a process too.
    const followed = await n.fp.executions.start('default', id, { kind: 'exec', argv: ['sleep', '5'] });
    expect(n.engine.sandbox(id)!.followed(followed.record.processId)).toBe(true);
    const listed = (await n.call('GET', `/instances/${id}/processes`)).body.items as { process_id: number; exec_id: string; status: string; command: string }[];
    expect(listed.map((p) => [p.process_id, p.exec_id, p.status, p.command])).toEqual([
      [followed.record.processId, followed.record.id, 'running', 'sleep 5'],
      [pid, execId, 'running', 'sleep 100'],
    ]);

    // A signal by either name ends the one process; its end is seen by both.
    expect((await n.call('POST', `/instances/${id}/exec/${execId}/kill`, { signal: 15 })).status).toBe(204);
    const ended = await n.call('GET', `/instances/${id}/processes/${pid}`);
    expect([ended.body.status, ended.body.exit_code, ended.body.signal]).toEqual(['exited', 143, 15]);
    const endedExec = await n.call('GET', `/instances/${id}/exec/${execId}`);
    expect([endedExec.body.status, endedExec.body.exit_code, endedExec.body.signal]).toEqual(['exited', 143, 15]);

    // Deleted by one name, gone by both.
    expect((await n.call('DELETE', `/instances/${id}/processes/${pid}`)).status).toBe(204);
    expect((await n.call('GET', `/instances/${id}/exec/${execId}`)).status).toBe(404);
    expect((await n.call('GET', `/instances/${id}/processes/${pid}`)).status).toBe(404);
    expect((await n.call('GET', `/instances/${id}/processes`)).body.items.map((p: { exec_id: string }) => p.exec_id)).toEqual([followed.record.id]);
  });

  it('its output is read by offsets, and its end is known after a restart of the server that started it', async () => {
    n = await startFakeNode();
    const id = (await n.call('POST', '/instances', {})).body.id as string;
    const done = (await n.call('POST', `/instances/${id}/processes`, { command: 'echo hello' })).body as { process_id: number; exec_id: string };
    const running = (await n.call('POST', `/instances/${id}/processes`, { command: ['sleep', '100'] })).body as { process_id: number };
    const out = await n.call('GET', `/instances/${id}/processes/${done.process_id}/output`);
    expect([out.body.stdout, out.body.stdout_offset, out.body.exit_code]).toEqual(['hello\n', 6, 0]);
    expect((await n.call('GET', `/instances/${id}/processes/${done.process_id}/output?stdout_offset=6`)).body.stdout).toBe('');
    n = await n.restart();
    expect((await n.call('GET', `/instances/${id}/processes/${running.process_id}`)).body.status).toBe('running');
    const after = await n.call('GET', `/instances/${id}/exec/${done.exec_id}`);
    expect([after.body.status, after.body.exit_code]).toEqual(['exited', 0]);
  });

  it('a process number no execution has is a 404 on every process route', async () => {
    n = await startFakeNode();
    const id = (await n.call('POST', '/instances', {})).body.id as string;
    for (const [method, path, body] of [['GET', '/processes/77'], ['GET', '/processes/77/output'], ['POST', '/processes/77/signal', { signal: 9 }], ['DELETE', '/processes/77']] as const) {
      const r = await n.call(method, `/instances/${id}${path}`, body);
      expect([method, path, r.status, r.body.error?.code]).toEqual([method, path, 404, 'NOT_FOUND']);
    }
  });
});
