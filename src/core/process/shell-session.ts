import { randomBytes } from 'node:crypto';
import { newProcessId } from '../../seam/agent.js';
import { AgentError } from '../../seam/errors.js';
import type { SandboxHandle } from '../../seam/sandbox.js';
import type { ExecResult } from './exec-once.js';
import { EngineError } from '../../seam/errors.js';
import { KILL_GRACE_MS } from './exec-once.js';
import { Output } from '../../lib/output.js';

const SIGINT = 2;
const SIGKILL = 9;
const MARKER = /\x1eFP:([0-9a-f]+):(\d+)\x1e/g;
/** How long a timed-out command has to stop on ^C before it gets SIGKILL. */
const INTERRUPT_GRACE_MS = 200;

export interface SessionRunOptions {
  stdin?: Buffer | undefined;
  timeoutMs: number;
  maxOutputBytes: number;
  spillDir: string;
  /** Aborted: the command is interrupted as on its timeout (whoever waited for it is gone). */
  signal?: AbortSignal | undefined;
}

/** Output files are read back in pieces of this size (a frame holds at most 8 MiB). */
const READ_PIECE = 4 << 20;
const EINVAL = 22;

/** A long-lived shell on a PTY inside the sandbox. Commands are sourced into it (see
 * SHELL_RC), so its cwd, variables and background jobs carry from one command to the next,
 * and across checkpoints, rollbacks and forks: the shell lives in the dumped tree. */
export class ShellSession {
  private tail = '';
  private waiter: { nonce: string; resolve(code: number): void; reject(err: Error): void } | undefined;
  private queue: Promise<unknown> = Promise.resolve();
  /** Set when the shell's process is gone from the engine's view (rollback, stop, a broken
   * agent): every command of this session fails with it from then on. */
  private lostWith: EngineError | undefined;
  exitCode: number | undefined;

  private constructor(
    readonly name: string,
    readonly processId: number,
    private readonly sandbox: SandboxHandle,
  ) {}

  /** Opens a bash session, or a POSIX sh one on images without bash. */
  static async open(sandbox: SandboxHandle, name: string, env: string[]): Promise<ShellSession> {
    const shells: [string[], string[]][] = [
      [['/bin/bash', '--noprofile', '--rcfile', '/.fp/shellrc', '--noediting', '-i'], env],
      [['/bin/sh', '-i'], [...env, 'ENV=/.fp/shellrc']],
    ];
    for (const [i, [argv, shellEnv]] of shells.entries()) {
      const session = new ShellSession(name, newProcessId(), sandbox);
      try {
        await sandbox.start(
          session.processId,
          { argv, env: shellEnv, cwd: homeOf(env), pty: { rows: 24, cols: 200, echo: false } },
          {
            onOutput: (_s, _o, data) => session.onOutput(data),
            onExit: (code, sig) => session.onEnd(sig ? 128 + sig : code),
            onLost: (err) => session.onLost(err),
          },
        );
        return session;
      } catch (err) {
        if (!(err instanceof EngineError && err.code === 'SPAWN_FAILED') || i === shells.length - 1) throw err;
      }
    }
    throw new EngineError('SPAWN_FAILED', 'no shell in this image');
  }

  /** Re-follows a session found running in the sandbox (after a restart, a rollback or in a
   * fork), from its current output offsets on. */
  static async adopt(sandbox: SandboxHandle, name: string, processId: number, offsets: [number, number]): Promise<ShellSession> {
    const session = new ShellSession(name, processId, sandbox);
    await sandbox.follow(processId, offsets, {
      onOutput: (_s, _o, data) => session.onOutput(data),
      onExit: (code, sig) => session.onEnd(sig ? 128 + sig : code),
      onLost: (err) => session.onLost(err),
    });
    return session;
  }

  get alive(): boolean {
    return this.exitCode === undefined;
  }

  private onOutput(data: Buffer): void {
    this.tail = (this.tail + data.toString('latin1')).slice(-4096);
    if (!this.waiter) return;
    for (const m of this.tail.matchAll(MARKER)) {
      if (m[1] !== this.waiter.nonce) continue;
      this.tail = this.tail.slice(m.index! + m[0].length);
      const w = this.waiter;
      this.waiter = undefined;
      w.resolve(Number(m[2]));
      return;
    }
  }

  private onEnd(code: number): void {
    this.exitCode = code;
    const w = this.waiter;
    this.waiter = undefined;
    w?.resolve(code);
  }

  private onLost(err: Error): void {
    this.lostWith = new EngineError('PROCESS_LOST', `the command was lost with session ${this.name}'s shell: ${err.message} (the instance was rolled back, stopped or deleted)`);
    this.exitCode ??= -1;
    const w = this.waiter;
    this.waiter = undefined;
    w?.reject(this.lostWith);
  }

  /** Throws if the shell was lost: called after every wait, so that nothing of a command is
   * sent to whatever shell a rollback brought back in its place. */
  private check(): void {
    if (this.lostWith) throw this.lostWith;
  }

  /** Runs one command in the shell; calls queue behind each other. */
  run(command: string, opts: SessionRunOptions): Promise<ExecResult> {
    const next = this.queue.then(() => this.runNow(command, opts));
    this.queue = next.catch(() => {});
    return next;
  }

  private async runNow(command: string, opts: SessionRunOptions): Promise<ExecResult> {
    this.check();
    if (!this.alive) throw new EngineError('PROCESS_LOST', `shell session ${this.name} has exited`);
    const started = performance.now();
    const nonce = randomBytes(8).toString('hex');
    const file = (ext: string) => `/.fp/run/${nonce}.${ext}`;
    const sb = this.sandbox;
    await sb.call((a) => a.writeFile(file('cmd'), command + '\n'));
    this.check();
    await sb.call((a) => a.writeFile(file('in'), opts.stdin ?? ''));
    this.check();
    let timedOut = false;
    const finished = new Promise<number>((resolve, reject) => (this.waiter = { nonce, resolve, reject }));
    finished.catch(() => {});
    const agent = await sb.agent();
    this.check(); // synchronous from here to the write: nothing can slip in between
    agent.stdin(this.processId, `__fp_run ${nonce}\n`);
    const stop = () => void this.interrupt(nonce).catch(() => {});
    const timer = setTimeout(() => {
      timedOut = true;
      stop();
    }, opts.timeoutMs);
    opts.signal?.addEventListener('abort', stop, { once: true });
    if (opts.signal?.aborted) stop();
    const deadline = setTimeout(() => {
      if (this.waiter?.nonce !== nonce) return;
      const w = this.waiter;
      this.waiter = undefined;
      w.reject(new EngineError('TIMEOUT', `the command in session ${this.name} did not end within its timeout of ${opts.timeoutMs} ms, and the shell did not confirm it was stopped`));
    }, opts.timeoutMs + INTERRUPT_GRACE_MS + KILL_GRACE_MS);
    let code: number;
    try {
      code = await finished;
    } finally {
      clearTimeout(timer);
      clearTimeout(deadline);
      opts.signal?.removeEventListener('abort', stop);
    }
    const stdout = new Output(opts.maxOutputBytes, opts.spillDir);
    const stderr = new Output(opts.maxOutputBytes, opts.spillDir);
    try {
      await Promise.all([this.collect(file('out'), stdout, opts.maxOutputBytes), this.collect(file('err'), stderr, opts.maxOutputBytes)]);
      await Promise.all(['cmd', 'in', 'out', 'err'].map((e) => sb.call((a) => a.removeFile(file(e)))));
    } catch (err) {
      stdout.dispose();
      stderr.dispose();
      throw err;
    }
    return {
      exitCode: code,
      signal: 0,
      stdout,
      stderr,
      durationMs: Math.round((performance.now() - started) * 100) / 100,
      timedOut,
      truncated: stdout.truncated || stderr.truncated,
    };
  }

  /** Reads an output file the shell wrote into `into`, a piece at a time, up to `max` bytes
   * (one more is asked for, to tell a file of exactly `max` from a longer one). */
  private async collect(path: string, into: Output, max: number): Promise<void> {
    for (let offset = 0; offset <= max; ) {
      const want = Math.min(READ_PIECE, max + 1 - offset);
      let piece;
      try {
        piece = await this.sandbox.call((a) => a.readFile(path, want, offset));
      } catch (err) {
        // An agent older than READ_AT reads the first piece only.
        if (offset > 0 && err instanceof AgentError && err.errno === EINVAL) {
          into.truncated = true;
          return;
        }
        throw err;
      }
      if (!piece) return;
      into.push(piece.data);
      offset += piece.data.length;
      if (!piece.truncated || piece.data.length === 0) return;
    }
  }

  /** ^C to the foreground job; if it ignores that, SIGKILL to it; then end the wait. */
  private async interrupt(nonce: string): Promise<void> {
    const agent = await this.sandbox.agent();
    agent.signal(this.processId, SIGINT, true);
    await new Promise((r) => setTimeout(r, INTERRUPT_GRACE_MS));
    if (this.waiter?.nonce !== nonce) return;
    agent.signal(this.processId, SIGKILL, true);
    agent.stdin(this.processId, `\n__fp_done ${nonce} 124\n`);
  }

  async close(): Promise<void> {
    if (!this.alive) return;
    (await this.sandbox.agent()).signal(this.processId, SIGKILL);
  }
}

function homeOf(env: string[]): string {
  const home = env.find((e) => e.startsWith('HOME='));
  return home ? home.slice(5) : '/';
}

/** Which session is which process, kept in the sandbox's own filesystem (read and written by
 * the agent) so that it travels with checkpoints, rollbacks and forks. */
export class SessionRegistry {
  static readonly PATH = '/.fp/sessions';

  constructor(private readonly sandbox: SandboxHandle) {}

  async read(): Promise<Map<string, number>> {
    const file = await this.sandbox.call((a) => a.readFile(SessionRegistry.PATH, 64 * 1024));
    const out = new Map<string, number>();
    for (const line of file?.data.toString('utf8').split('\n') ?? []) {
      const [name, id] = line.split('\t');
      if (name && Number(id) > 0) out.set(name, Number(id));
    }
    return out;
  }

  async write(entries: Map<string, number>): Promise<void> {
    const text = [...entries].map(([n, id]) => `${n}\t${id}\n`).join('');
    await this.sandbox.call((a) => a.writeFile(SessionRegistry.PATH, text));
  }
}
