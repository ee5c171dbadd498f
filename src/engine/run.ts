import { spawn } from 'node:child_process';
import { anySpawner, type PipedRun, type RunResult } from './spawner.js';

export type { PipedRun, RunResult } from './spawner.js';

/** Runs a command to completion, keeping only stderr. Used on the checkpoint pause path,
 * where a plain spawn costs a third of a general-purpose wrapper; started by an engine's
 * spawner when one is up (a Node spawn stalls the event loop 5-12 ms: spawner.ts). */
export function run(file: string, args: string[], opts: { cwd?: string } = {}): Promise<RunResult> {
  const spawner = anySpawner();
  if (spawner) return spawner.run(file, args, opts.cwd);
  return new Promise((resolve) => {
    const child = spawn(file, args, { cwd: opts.cwd, stdio: ['ignore', 'ignore', 'pipe'] });
    const chunks: Buffer[] = [];
    child.stderr!.on('data', (c: Buffer) => chunks.push(c));
    child.on('error', (err) => resolve({ code: 127, stderr: err.message }));
    child.on('close', (code, signal) => resolve({ code: code ?? (signal ? 128 : 1), stderr: Buffer.concat(chunks).toString('utf8') }));
  });
}

/** Starts a command now and gives it its whole stdin later (`feed`): an `nft -f -` started
 * ahead of its script. By the spawner when one is up, as `run`. */
export function startPiped(file: string, args: string[]): PipedRun {
  const spawner = anySpawner();
  if (spawner) return spawner.piped(file, args);
  const child = spawn(file, args, { stdio: ['pipe', 'ignore', 'pipe'] });
  const chunks: Buffer[] = [];
  let ended = false;
  child.stdin!.on('error', () => {});
  child.stderr!.on('data', (c: Buffer) => chunks.push(c));
  const result = new Promise<RunResult>((resolve) => {
    child.on('error', (err) => resolve({ code: 127, stderr: err.message }));
    child.on('close', (code, signal) => resolve({ code: code ?? (signal ? 128 : 1), stderr: Buffer.concat(chunks).toString('utf8') }));
  }).finally(() => (ended = true));
  return {
    feed: (input) => void child.stdin!.end(input),
    get ended() {
      return ended;
    },
    result,
    kill: () => void child.kill('SIGKILL'),
  };
}

/** Step timings of one engine operation, for the debug log. */
export class Steps {
  private last = performance.now();
  readonly ms: Record<string, number> = {};
  mark(step: string): void {
    const now = performance.now();
    this.ms[step] = Math.round((now - this.last) * 100) / 100;
    this.last = now;
  }
}
