import type { SandboxHandle } from '../../seam/sandbox.js';

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
