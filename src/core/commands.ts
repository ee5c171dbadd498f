import type { Logger } from 'pino';
import { EngineError } from '../seam/errors.js';
import { execOnce, type ExecResult } from './process/exec-once.js';
import { Output } from '../lib/output.js';
import { signalProcess } from './process/scrollback.js';
import type { SandboxHandle } from '../seam/sandbox.js';
import { SessionRegistry, ShellSession } from './process/shell-session.js';
import type { InstanceRecord } from '../store/instances.js';
import type { SandboxAccess } from './access.js';
import { InvalidRequestError, NotFoundError } from './errors.js';
import { processUser, type SandboxUser } from './users.js';
import type { EventBus } from './events.js';
import type { InstanceService } from './instances.js';

/** The longest a command run and waited for may take (every face's `timeout` stops here): also
 * how long a node waits for the answer to such a call it forwarded to another node. */
export const MAX_EXEC_TIMEOUT_MS = 24 * 3600 * 1000;

export interface ExecInput {
  command: string | string[];
  cwd?: string | undefined;
  env?: Record<string, string> | undefined;
  timeoutMs?: number | undefined;
  stdin?: string | undefined;
  session?: string | undefined;
  maxOutputBytes?: number | undefined;
  /** Aborted when the one who waits for the result is gone: the command is stopped as on its
   * timeout (it ran only for them). */
  signal?: AbortSignal | undefined;
  /** Runs as this user of the sandbox (a name or a uid); its image's USER when absent, else root. */
  user?: string | SandboxUser | undefined;
  /** Where it starts without a `cwd`: the image's working directory (Docker's `exec`, the
   * default), or its user's home (OpenComputer's way). */
  startIn?: 'workdir' | 'home' | undefined;
}

export const DEFAULT_TIMEOUT_MS = 60_000;
export const DEFAULT_MAX_OUTPUT = 1 << 20;

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/** Commands in an instance run and waited for, alone or in a persistent shell session (those
 * started to run on, followed or not, are executions: ExecutionService). Every call wakes a
 * hibernated instance and counts as activity. */
export class CommandService {
  private readonly sessions = new Map<string, Map<string, ShellSession>>();

  constructor(
    private readonly instances: InstanceService,
    private readonly access: SandboxAccess,
    /** Where outputs too large for memory go while a command runs. */
    private readonly spillDir: string,
    private readonly events: EventBus,
    private readonly log: Logger,
  ) {}

  async exec(owner: string, id: string, input: ExecInput): Promise<ExecResult> {
    const timeoutMs = input.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const maxOutputBytes = input.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
    const stdin = input.stdin !== undefined ? Buffer.from(input.stdin) : undefined;
    const spillDir = this.spillDir;
    return this.access.use(owner, id, async (sb, rec) => {
      try {
        if (input.session) {
          if (input.user !== undefined) throw new InvalidRequestError('a session runs as the user that opened it: give either session or user', { reason: 'USER_WITH_SESSION' });
          const session = await this.session(rec, sb, input.session);
          let script = Array.isArray(input.command) ? input.command.map(quote).join(' ') : input.command;
          if (input.cwd) script = `cd ${quote(input.cwd)} && ${script}`;
          if (input.env) script = `${Object.entries(input.env).map(([k, v]) => `export ${k}=${quote(v)}`).join('; ')}; ${script}`;
          return await session.run(script, { stdin, timeoutMs, maxOutputBytes, spillDir, signal: input.signal });
        }
        const argv = Array.isArray(input.command) ? input.command : ['/bin/sh', '-c', input.command];
        const user = await processUser(sb, input.user ?? rec.defaultUser ?? undefined);
        return await execOnce(sb, { argv, env: this.instances.envOf(rec, input.env, user.env), cwd: input.cwd ?? (input.startIn === 'home' ? user.home : undefined) ?? rec.workdir ?? '/', user: user.ids, stdin, timeoutMs, maxOutputBytes, spillDir, signal: input.signal });
      } catch (err) {
        if (err instanceof EngineError && err.code === 'SPAWN_FAILED') {
          return { exitCode: 127, signal: 0, stdout: Output.of('', spillDir), stderr: Output.of(`${err.message}\n`, spillDir), durationMs: 0, timedOut: false, truncated: false };
        }
        throw err;
      }
    });
  }

  /** The named shell session, found again after a restore or a restart from the registry
   * the sandbox keeps in its own filesystem (so it travels with checkpoints and forks). */
  private async session(rec: InstanceRecord, sb: SandboxHandle, name: string): Promise<ShellSession> {
    let byName = this.sessions.get(rec.id);
    if (!byName) this.sessions.set(rec.id, (byName = new Map()));
    const known = byName.get(name);
    if (known?.alive) return known;
    const registry = new SessionRegistry(sb);
    const entries = await registry.read();
    const saved = entries.get(name);
    if (saved) {
      const info = (await sb.list()).find((p) => p.id === saved && p.running);
      if (info) {
        const s = await ShellSession.adopt(sb, name, saved, [info.stdoutBytes, info.stderrBytes]);
        byName.set(name, s);
        return s;
      }
    }
    // As root whatever the image's USER: the session's protocol files are under /.fp, root's alone.
    const s = await ShellSession.open(sb, name, this.instances.envOf(rec));
    entries.set(name, s.processId);
    await registry.write(entries);
    byName.set(name, s);
    return s;
  }

  /** Forgets what the service keeps of a deleted instance. */
  forget(id: string): void {
    this.sessions.delete(id);
  }

  async listSessions(owner: string, id: string): Promise<{ name: string; processId: number; running: boolean }[]> {
    return this.access.use(owner, id, async (sb) => {
      const [entries, procs] = await Promise.all([new SessionRegistry(sb).read(), sb.list()]);
      return [...entries].map(([name, pid]) => ({ name, processId: pid, running: procs.some((p) => p.id === pid && p.running) }));
    });
  }

  async closeSession(owner: string, id: string, name: string): Promise<void> {
    await this.access.use(owner, id, async (sb) => {
      const registry = new SessionRegistry(sb);
      const entries = await registry.read();
      const pid = entries.get(name);
      if (!pid) throw new NotFoundError('session', name);
      await signalProcess(sb, pid, 9);
      entries.delete(name);
      await registry.write(entries);
      this.sessions.get(id)?.delete(name);
    });
  }
}
