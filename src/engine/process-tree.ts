import { EngineError } from '../seam/errors.js';
import { isAlive, isAliveSync } from './launcher.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Sends SIGKILL at once (the check and the signal are synchronous) and resolves when the
 * process is gone. */
export function killTree(pid: number, startTime: string): Promise<void> {
  if (!isAliveSync(pid, startTime)) return Promise.resolve();
  try {
    // PID 1 of a pid namespace takes every process of the namespace with it.
    process.kill(pid, 'SIGKILL');
  } catch {
    return Promise.resolve();
  }
  return waitGone(pid, startTime);
}

export async function waitGone(pid: number, startTime: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (await isAlive(pid, startTime)) {
    if (Date.now() > deadline) throw new EngineError('NOT_RUNNING', `process ${pid} did not exit`);
    await sleep(1);
  }
}
