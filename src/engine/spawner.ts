import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, closeSync, mkdirSync, openSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { dirname } from 'node:path';
import { PassThrough, type Readable } from 'node:stream';
import { createInterface } from 'node:readline';
import { untilDeadline } from '../lib/deadline.js';

/** A process started through the spawner: its pid once known, the frames it writes (the 'P'
 * and 'X' frames taken out), and its exit code. */
export interface Spawned {
  socket: Socket;
  /** What the process writes to its stdout and fd 3, as a stream. */
  output: Readable;
  pid: Promise<number>;
  exit: Promise<number>;
}

export interface RunResult {
  code: number;
  stderr: string;
}

/** A command started now and given its whole stdin later (`feed`), answered as `run`. */
export interface PipedRun {
  /** Its input; its stdin ends with it. */
  feed(input: string): void;
  /** Whether it has ended already (one that has cannot be fed). */
  readonly ended: boolean;
  result: Promise<RunResult>;
  kill(): void;
}

/** A command run for what it prints: its exit code and up to 64 KiB of its stdout. */
export interface OutputRun {
  result: Promise<{ code: number; stdout: string }>;
  kill(): void;
}

/** The largest frame a process started here writes (a CRIU answer relayed: criu_run.c). */
const MAX_FRAME = (1 << 20) + 1;

/** How long the spawner may take to come up. */
const READY_DEADLINE_MS = 10_000;

/**
 * The server's processes started by `fp-agent spawner` (native/spawner.c), a small process that
 * forks in ~0.1 ms where Node forks itself, copying the page tables of the whole server: 5-12 ms
 * of the event loop per spawn here, on every fork's CRIU worker and every umount. One per engine;
 * it dies with the server (what it started does not). Until it is up, and should it die, Node
 * spawns as before (`available` false).
 */
export class Spawner {
  private proc: ChildProcess | undefined;
  private up = false;

  constructor(
    private readonly agentPath: string,
    private readonly socketPath: string,
    private readonly logFile: string,
    private readonly env: NodeJS.ProcessEnv,
  ) {}

  async start(): Promise<void> {
    // Only root may reach the socket: the directory is the server's alone, whatever made it.
    mkdirSync(dirname(this.socketPath), { recursive: true, mode: 0o700 });
    chmodSync(dirname(this.socketPath), 0o700);
    const log = openSync(this.logFile, 'a');
    const proc = spawn(this.agentPath, ['spawner', this.socketPath], { stdio: ['ignore', 'pipe', log], env: this.env });
    closeSync(log);
    this.proc = proc;
    proc.on('error', () => {});
    proc.once('exit', () => {
      this.up = false;
    });
    const ready = new Promise<boolean>((resolve) => {
      createInterface({ input: proc.stdout! }).once('line', (line) => resolve(line === 'ready'));
      proc.once('exit', () => resolve(false));
    });
    this.up = await untilDeadline(ready, READY_DEADLINE_MS, () => false);
    if (!this.up) proc.kill('SIGKILL');
    // Not a reason for the server to stay up, nor its stdout to be read.
    proc.unref();
    (proc.stdout as Socket | null)?.unref?.();
  }

  get available(): boolean {
    return this.up;
  }

  close(): void {
    this.up = false;
    this.proc?.kill('SIGKILL');
  }

  /** A shim (`args`, the agent's), its stdin, stdout and fd 3 this connection, its stderr `logFile`. */
  shim(args: string[], logFile: string): Spawned {
    return this.request('S', logFile, [this.agentPath, ...args]);
  }

  /** Runs a command to completion, keeping only its stderr (as run.ts). */
  async run(file: string, args: string[], cwd = ''): Promise<RunResult> {
    return this.request('C', cwd, [file, ...args]).ended;
  }

  /** As `run`, its stdin the connection: what `feed` writes, then its end. */
  piped(file: string, args: string[], cwd = ''): PipedRun {
    const r = this.request('I', cwd, [file, ...args]);
    const k = killable(r);
    return {
      feed: (input) => void r.socket.end(input),
      get ended() {
        return k.ended;
      },
      result: r.ended,
      kill: k.kill,
    };
  }

  /** As `run`, keeping its stdout (up to 64 KiB) instead of its stderr. */
  output(file: string, args: string[], cwd = ''): OutputRun {
    const r = this.request('O', cwd, [file, ...args]);
    return { result: r.ended.then(({ code, stderr }) => ({ code, stdout: stderr })), kill: killable(r).kill };
  }

  private request(kind: 'S' | 'C' | 'I' | 'O', first: string, argv: string[]): Spawned & { ended: Promise<RunResult> } {
    const socket = connect(this.socketPath);
    socket.on('error', () => {});
    const body = Buffer.from([first, ...argv].join('\0'));
    const head = Buffer.alloc(5);
    head.writeUInt32LE(body.length + 1, 0);
    head[4] = kind.charCodeAt(0);
    socket.write(Buffer.concat([head, body]));
    const output = new PassThrough();
    let resolvePid!: (pid: number) => void;
    let resolveEnd!: (r: RunResult) => void;
    const pid = new Promise<number>((r) => (resolvePid = r));
    const ended = new Promise<RunResult>((r) => (resolveEnd = r));
    let pending: Buffer = Buffer.alloc(0);
    let gotPid = false;
    let done = false;
    const finish = (code: number, stderr: string) => {
      if (done) return;
      done = true;
      if (!gotPid) resolvePid(-1);
      resolveEnd({ code, stderr });
      output.end();
      socket.destroy();
    };
    socket.on('data', (chunk: Buffer) => {
      pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
      while (!done && pending.length >= 5) {
        const n = pending.readUInt32LE(0);
        // What the relay sends is bounded (criu_run.c MAX_FRAME, 1 MiB); past that, the stream is
        // not frames, and nothing more of it is kept.
        if (n < 1 || n > MAX_FRAME) {
          finish(127, `a frame of ${n} bytes from the process`);
          break;
        }
        if (pending.length < 4 + n) break;
        const frame = pending.subarray(0, 4 + n);
        pending = pending.subarray(4 + n);
        const frameKind = String.fromCharCode(frame[4]!);
        if (!gotPid && frameKind === 'P') {
          gotPid = true;
          resolvePid(Number(frame.subarray(5).toString('utf8')));
        } else if (frameKind === 'X' && frame.length >= 9) {
          finish(frame.readInt32LE(5), frame.subarray(9).toString('utf8'));
        } else {
          output.write(frame);
        }
      }
    });
    socket.once('close', () => finish(127, 'the spawner closed the connection'));
    return { socket, output, pid, exit: ended.then((r) => r.code), ended };
  }
}

/** An 'I' or 'O' command's end, and its kill: by the pid of its 'P' frame (its waiter's, whose
 * death kills it: spawner.c); before that frame, the connection's end (an 'I' command's input
 * ends). Its answer is not waited for then: something it started may hold the connection on. */
function killable(r: Spawned & { ended: Promise<RunResult> }): { readonly ended: boolean; kill(): void } {
  let ended = false;
  let pid: number | undefined;
  void r.ended.then(() => (ended = true));
  void r.pid.then((p) => (pid = p > 0 ? p : undefined));
  return {
    get ended() {
      return ended;
    },
    kill: () => {
      if (ended) return;
      try {
        if (pid !== undefined) process.kill(pid, 'SIGKILL');
      } catch {
        // gone already: its answer is on its way
      }
      r.socket.destroy();
    },
  };
}

/** The engines' spawners in this process: any that is up starts a command (run.ts), so that
 * free functions need not be handed one. */
const registered = new Set<Spawner>();

export function registerSpawner(s: Spawner): () => void {
  registered.add(s);
  return () => registered.delete(s);
}

export function anySpawner(): Spawner | undefined {
  for (const s of registered) if (s.available) return s;
  return undefined;
}
