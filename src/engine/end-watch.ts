import type { SandboxEnd } from '../seam/runtime.js';
import { isAliveSync } from './launcher.js';
import type { Sandbox } from './sandbox.js';

/** How often live sandboxes are looked at: a read of /proc/<pid>/stat each. */
export const END_POLL_MS = 1_000;

/**
 * Finds live sandboxes whose PID 1 ended with nothing of the engine's own under way (a stop, a
 * pause, a rollback): killed from the host or by the kernel's out-of-memory killer, or their
 * agent failed. Without it such an instance stayed `running`, and every call to it waited out
 * the agent's connection deadline before a 503. The tree's parent is a shim that outlives the
 * server (a kill -9 of the server costs no sandbox), so the end is seen from /proc, not waited
 * for.
 */
export class EndWatch {
  private readonly listeners = new Set<(end: SandboxEnd) => void>();
  private timer: NodeJS.Timeout | undefined;
  /** The PID 1 each sandbox was last told ended as (`pid:startTime`): told once. */
  private readonly told = new WeakMap<Sandbox, string>();

  constructor(private readonly live: () => Iterable<Sandbox>) {}

  listen(listener: (end: SandboxEnd) => void): () => void {
    this.listeners.add(listener);
    this.timer ??= setInterval(() => this.look(), END_POLL_MS).unref();
    return () => {
      this.listeners.delete(listener);
      if (this.listeners.size === 0) this.stop();
    };
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** One look at every live sandbox (the timer's; a test's, to look now). */
  look(): void {
    for (const sb of this.live()) {
      if (sb.busyOrStopped) continue;
      const key = `${sb.pid}:${sb.startTime}`;
      if (this.told.get(sb) === key || isAliveSync(sb.pid, sb.startTime)) continue;
      this.told.set(sb, key);
      const end: SandboxEnd = {
        id: sb.id,
        sandbox: sb,
        pid: sb.pid,
        startTime: sb.startTime,
        reason: sb.lostBecause ?? `the sandbox's processes ended: its PID 1 (host pid ${sb.pid}) was killed or exited, not by forkpoint`,
      };
      for (const listener of this.listeners) listener(end);
    }
  }
}
