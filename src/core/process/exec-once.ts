import { newProcessId, type UnixIds } from '../../seam/agent.js';
import type { SandboxHandle } from '../../seam/sandbox.js';
import { EngineError } from '../../seam/errors.js';
import { Output } from '../../lib/output.js';

export interface ExecRequest {
  argv: string[];
  env: string[];
  cwd: string;
  user?: UnixIds | undefined;
  stdin?: Buffer | undefined;
  timeoutMs: number;
  maxOutputBytes: number;
  /** Where output past the first MiB per stream waits (Output). */
  spillDir: string;
  /** Aborted: the command is killed as on its timeout (whoever waited for it is gone). */
  signal?: AbortSignal | undefined;
}

export interface ExecResult {
  exitCode: number;
  signal: number;
  stdout: Output;
  stderr: Output;
  durationMs: number;
  timedOut: boolean;
  truncated: boolean;
}

/** Lets go of a result's spilled output, once it has been sent. */
export function disposeResult(r: ExecResult): void {
  r.stdout.dispose();
  r.stderr.dispose();
}

const SIGKILL = 9;
/** After a timeout's SIGKILL, how long the agent has to confirm the exit before the call gives
 * up on it (the command may be beyond reach: a stopped or broken agent). */
export const KILL_GRACE_MS = 5000;

/** Runs one command on pipes and waits for it. On timeout its whole process group is killed. */
export async function execOnce(sandbox: SandboxHandle, req: ExecRequest): Promise<ExecResult> {
  const started = performance.now();
  const id = newProcessId();
  const out = new Output(req.maxOutputBytes, req.spillDir);
  const err = new Output(req.maxOutputBytes, req.spillDir);
  let timedOut = false;
  let giveUp!: (e: Error) => void;
  // Armed before the spawn and always cleared: a fast command must not leave them behind.
  const kill = () => void sandbox.agent().then((a) => a.signal(id, SIGKILL), () => {});
  const timer = setTimeout(() => {
    timedOut = true;
    kill();
  }, req.timeoutMs);
  req.signal?.addEventListener('abort', kill, { once: true });
  const deadline = setTimeout(() => {
    sandbox.untrack(id);
    giveUp(new EngineError('TIMEOUT', `the command did not end within its timeout of ${req.timeoutMs} ms, and the sandbox did not confirm it was killed`));
  }, req.timeoutMs + KILL_GRACE_MS);
  try {
    let spawned!: Promise<number>;
    const done = new Promise<{ code: number; signal: number }>((resolve, reject) => {
      giveUp = reject;
      const listener = {
        onOutput: (stream: 1 | 2, _offset: number, data: Buffer) => (stream === 1 ? out : err).push(data),
        onExit: (code: number, signal: number) => resolve({ code, signal }),
        onLost: (e: Error) =>
          reject(new EngineError('PROCESS_LOST', `the command was lost: ${e.message} (the instance was rolled back, stopped or deleted)`)),
      };
      spawned = sandbox.start(id, { argv: req.argv, env: req.env, cwd: req.cwd, user: req.user }, listener);
    });
    done.catch(() => {});
    spawned.catch(() => {});
    await Promise.race([spawned, done]);
    if (req.signal?.aborted) kill(); // gone before the spawn was confirmed
    const agent = await sandbox.agent();
    if (req.stdin?.length) agent.stdin(id, req.stdin);
    agent.closeStdin(id);
    const { code, signal } = await done;
    sandbox.agent().then((a) => a.forget(id), () => {});
    return {
      exitCode: signal ? 128 + signal : code,
      signal,
      stdout: out,
      stderr: err,
      durationMs: Math.round((performance.now() - started) * 100) / 100,
      timedOut,
      truncated: out.truncated || err.truncated,
    };
  } catch (e) {
    out.dispose();
    err.dispose();
    throw e;
  } finally {
    clearTimeout(timer);
    clearTimeout(deadline);
    req.signal?.removeEventListener('abort', kill);
  }
}
