import { newProcessId, type UnixIds } from '../../seam/agent.js';
import type { SandboxHandle } from '../../seam/sandbox.js';
import type { AgentProcessInfo } from '../../seam/agent.js';

export interface BackgroundRequest {
  argv: string[];
  env: string[];
  cwd: string;
  pty?: { rows: number; cols: number } | undefined;
  user?: UnixIds | undefined;
}

/** Starts a process that outlives the request; the agent keeps its output in a bounded
 * scrollback until someone reads it. */
export async function startBackground(sandbox: SandboxHandle, req: BackgroundRequest): Promise<{ id: number; pid: number }> {
  const id = newProcessId();
  const ignore = { onOutput: () => {}, onExit: () => {}, onLost: () => {} };
  const pid = await sandbox.start(
    id,
    { argv: req.argv, env: req.env, cwd: req.cwd, pty: req.pty && { ...req.pty, echo: true }, user: req.user },
    ignore,
  );
  sandbox.untrack(id);
  const agent = await sandbox.agent();
  agent.detach(id);
  if (!req.pty) agent.closeStdin(id);
  return { id, pid };
}

export interface OutputChunk {
  stdout: Buffer;
  stderr: Buffer;
  /** Offsets to ask from next time. */
  stdoutOffset: number;
  stderrOffset: number;
  /** Bytes that fell out of the scrollback before they were read. */
  dropped: number;
  exit: { code: number; signal: number } | undefined;
}

/** Reads what a process wrote from the given offsets on: what the scrollback still holds. */
export async function readOutput(
  sandbox: SandboxHandle,
  id: number,
  from: { stdout: number; stderr: number },
): Promise<OutputChunk | undefined> {
  const agent = await sandbox.sideAgent();
  try {
    const parts: Record<1 | 2, Buffer[]> = { 1: [], 2: [] };
    const next = { 1: from.stdout, 2: from.stderr };
    let dropped = 0;
    let exit: OutputChunk['exit'];
    let lost = false;
    agent.attach(id, from.stdout, from.stderr, {
      onOutput: (stream, offset, data) => {
        if (offset > next[stream]) dropped += offset - next[stream];
        parts[stream].push(Buffer.from(data));
        next[stream] = offset + data.length;
      },
      onExit: (code, signal) => (exit = { code, signal }),
      onLost: () => (lost = true),
    });
    // Frames come in order: once the ping is answered, the replay is complete.
    await agent.ping();
    if (lost) return undefined;
    return {
      stdout: Buffer.concat(parts[1]),
      stderr: Buffer.concat(parts[2]),
      stdoutOffset: next[1],
      stderrOffset: next[2],
      dropped,
      exit,
    };
  } finally {
    sandbox.releaseSide(agent);
  }
}

export async function signalProcess(sandbox: SandboxHandle, id: number, signo: number): Promise<void> {
  (await sandbox.agent()).signal(id, signo);
}

export async function listProcesses(sandbox: SandboxHandle): Promise<AgentProcessInfo[]> {
  return sandbox.list();
}

export async function forgetProcess(sandbox: SandboxHandle, id: number): Promise<void> {
  (await sandbox.agent()).forget(id);
}

