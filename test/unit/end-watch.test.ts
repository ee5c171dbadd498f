import { spawn } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';
import { EndWatch } from '../../src/engine/end-watch.js';
import { processStartTime } from '../../src/engine/launcher.js';
import { Sandbox } from '../../src/engine/sandbox.js';
import type { SandboxEnd } from '../../src/seam/runtime.js';
import { until } from '../helpers/wait.js';

// The engine's side of a sandbox that ends on its own, on plain processes standing in for PID 1s
// (no root): an end is told once, for the PID 1 that ended, and never for a stopped sandbox.
const children: ReturnType<typeof spawn>[] = [];
afterEach(() => {
  for (const c of children.splice(0)) c.kill('SIGKILL');
});

async function sandboxOf(id: string): Promise<{ sb: Sandbox; kill: () => Promise<void> }> {
  const child = spawn('sleep', ['60'], { stdio: 'ignore' });
  children.push(child);
  const pid = child.pid!;
  const sb = new Sandbox(id, pid, await processStartTime(pid));
  const kill = async () => {
    const gone = new Promise((r) => child.once('exit', r));
    child.kill('SIGKILL');
    await gone;
  };
  return { sb, kill };
}

describe('EndWatch', () => {
  it('tells of a sandbox whose PID 1 ended, once, with its pid; a live one and a stopped one are not told of', async () => {
    const ended = await sandboxOf('inst_ended');
    const live = await sandboxOf('inst_live');
    const stopped = await sandboxOf('inst_stopped');
    await stopped.sb.close();
    const told: SandboxEnd[] = [];
    const watch = new EndWatch(() => [ended.sb, live.sb, stopped.sb]);
    const stop = watch.listen((end) => told.push(end));
    try {
      watch.look();
      expect(told).toEqual([]);
      await ended.kill();
      await stopped.kill();
      await until('the end told', () => (watch.look(), told.length > 0));
      watch.look();
      expect(told.map((t) => [t.id, t.pid, t.sandbox === ended.sb])).toEqual([['inst_ended', ended.sb.pid, true]]);
      expect(told[0]!.reason).toContain(`host pid ${ended.sb.pid}`);
    } finally {
      stop();
    }
  });

  it('a connection to a sandbox whose PID 1 is gone fails at once (AGENT_UNREACHABLE), not at its deadline', async () => {
    const gone = await sandboxOf('inst_gone');
    await gone.kill();
    // A minute's deadline: the test's own timeout (20 s) fails it if the connection waits it out.
    await expect(gone.sb.connect(60_000)).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
  });
});
