import { spawn } from 'node:child_process';
import { untilDeadline } from '../lib/deadline.js';
import { anySpawner, type OutputRun, type PipedRun, type RunResult } from './spawner.js';

export type { OutputRun, PipedRun, RunResult } from './spawner.js';

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

/** `run` bounded: past `ms` the wait ends with code -1 and a reason naming `what`, the command
 * left behind (one that hangs there, in a filesystem or the kernel, cannot be killed either).
 * For set-up steps the server goes on without. */
export async function runWithin(file: string, args: string[], ms: number, what = file): Promise<RunResult> {
  return untilDeadline(run(file, args), ms, () => ({ code: -1, stderr: `${what} did not end within ${ms / 1000} s` }));
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

/** Runs a command for its stdout (up to 64 KiB; its stderr goes nowhere), killed when `signal`
 * aborts (the result then has code 137 or 127). By the spawner when one is up, as `run`. */
export function runForOutput(file: string, args: string[], signal?: AbortSignal): Promise<{ code: number; stdout: string }> {
  const spawner = anySpawner();
  let run: OutputRun;
  if (spawner) run = spawner.output(file, args);
  else {
    const child = spawn(file, args, { stdio: ['ignore', 'pipe', 'ignore'] });
    const chunks: Buffer[] = [];
    let size = 0;
    child.stdout!.on('data', (c: Buffer) => {
      if (size < OUTPUT_LIMIT) chunks.push(c.subarray(0, OUTPUT_LIMIT - size));
      size += c.length;
    });
    run = {
      result: new Promise((resolve) => {
        child.on('error', () => resolve({ code: 127, stdout: '' }));
        child.on('close', (code, sig) => resolve({ code: code ?? (sig ? 128 : 1), stdout: Buffer.concat(chunks).toString('utf8') }));
      }),
      kill: () => void child.kill('SIGKILL'),
    };
  }
  const stop = () => run.kill();
  if (signal?.aborted) stop();
  signal?.addEventListener('abort', stop, { once: true });
  return run.result.finally(() => signal?.removeEventListener('abort', stop));
}

/** What runForOutput keeps of a command's stdout, as the spawner does (spawner.c MAX_STDERR). */
const OUTPUT_LIMIT = 64 * 1024;

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
