import { untilDeadline } from '../lib/deadline.js';
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import type { Readable, Writable } from 'node:stream';
import type { Spawner } from './spawner.js';
import { CriuWorker } from './criu-worker.js';
import { EngineError } from '../seam/errors.js';
import { tail } from './criu.js';

export interface Launched {
  pid: number;
  /** Process start time (clock ticks since boot), to tell a re-used pid from ours. */
  startTime: string;
}

interface ShimOptions {
  agentPath: string;
  command: string[];
  /** Where the shim writes the sandbox's last exit status, if anywhere. */
  statusFile?: string;
  /** Where the shim writes the command's own exit code once it ends (a daemon's), if anywhere. */
  exitFile?: string;
  logFile: string;
  cgroupProcs: string[];
  env?: NodeJS.ProcessEnv;
  /** Starts the shim when it is up (its environment is then its own: CRIU_ENV). */
  spawner?: Spawner | undefined;
}

interface StartedShim {
  /** What the engine writes to the shim's command (its stdin). */
  input: Writable;
  /** What the command answers on (its fd 3). */
  output: Readable;
  /** The command's exit code, as the shim reports it. */
  exit: Promise<number>;
  /** The shim's pid (-1 if it did not start). */
  pid: Promise<number>;
  /** Kills the shim and what it runs (not a sandbox it already parents: that leads its own
   * session and process group). */
  kill: () => void;
}

/** How long a boot may take, mount to the agent's exec. */
export const BOOT_DEADLINE_MS = 60_000;

const killGroup = (pid: number | undefined) => () => {
  try {
    if (pid) process.kill(-pid, 'SIGKILL');
  } catch {
    // already gone
  }
};

/** Starts a shim (a subreaper that stays the parent of the sandbox) running `command`, with
 * fd 3 a way back to us for commands that answer on it: through the spawner when it is up (one
 * connection for stdin, stdout and fd 3; the exit as a frame), else spawned by Node. */
function startShim(opts: ShimOptions): StartedShim {
  const args = ['shim', ...(opts.statusFile ? ['--status', opts.statusFile] : []), ...(opts.exitFile ? ['--exit-file', opts.exitFile] : [])];
  for (const p of opts.cgroupProcs) args.push('--cgroup-procs', p);
  if (opts.spawner?.available) {
    const s = opts.spawner.shim([...args, '--exit-frame', '--', ...opts.command], opts.logFile);
    const kill = () => void s.pid.then((pid) => killGroup(pid > 0 ? pid : undefined)());
    return { input: s.socket, output: s.output, exit: s.exit, pid: s.pid, kill };
  }
  args.push('--', ...opts.command);
  const log = openSync(opts.logFile, 'a');
  const child = spawn(opts.agentPath, args, { detached: true, stdio: ['pipe', 'pipe', log, 'pipe'], ...(opts.env ? { env: opts.env } : {}) });
  closeSync(log);
  child.on('error', () => {});
  const exit = new Promise<number>((resolve) => {
    const lines = createInterface({ input: child.stdout! });
    let done = false;
    const finish = (code: number) => {
      if (done) return;
      done = true;
      child.stdout?.destroy();
      child.stdio[3]?.destroy();
      child.unref();
      resolve(code);
    };
    lines.on('line', (line) => {
      const m = /^exit (\d+)$/.exec(line);
      if (m) finish(Number(m[1]));
    });
    child.once('exit', (c) => finish(c ?? 1));
  });
  return { input: child.stdin!, output: child.stdio[3] as Readable, exit, pid: Promise.resolve(child.pid ?? -1), kill: killGroup(child.pid) };
}

/** A helper process under a shim of its own (a `criu lazy-pages` daemon): it outlives the server
 * as the sandbox it serves does, and is started by the spawner when it is up. Its exit code, and a
 * way to end it. */
export function daemonUnderShim(opts: ShimOptions): { exit: Promise<number>; pid: Promise<number>; kill: () => void } {
  const { input, output, exit, pid, kill } = startShim({ ...opts, env: criuEnv() });
  // Nothing is asked of it or read from it.
  input.end();
  output.resume();
  return { exit, pid, kill };
}

/** The shim's log says why a boot failed (boot writes its reason to stderr). */
async function failure(code: BootFailure, exitCode: number, logFile: string): Promise<EngineError> {
  const stderr = await tail(logFile, 10);
  return new EngineError(code, stderr.trim().split('\n').pop() || `exit ${exitCode}`, stderr);
}

type BootFailure = 'BOOT_FAILED' | 'RESTORE_FAILED';

/** Starts `command` (a boot) under a shim and resolves once it is done and the sandbox's PID 1
 * is in `pidfile`. */
export async function launchUnderShim(opts: ShimOptions & { pidfile: string; failure: BootFailure }): Promise<Launched> {
  const { input, exit, kill } = startShim(opts);
  input.end();
  const code = await untilDeadline(exit, BOOT_DEADLINE_MS, () => {
    kill();
    return -1;
  });
  if (code === -1) throw new EngineError('TIMEOUT', `the sandbox did not start within ${BOOT_DEADLINE_MS / 1000} s`);
  if (code !== 0) throw await failure(opts.failure, code, opts.logFile);
  const pid = Number((await readFile(opts.pidfile, 'utf8')).trim());
  if (!Number.isInteger(pid) || pid <= 0) throw new EngineError(opts.failure, `no pid in ${opts.pidfile}`);
  return { pid, startTime: await processStartTime(pid) };
}

/** What forkpoint's CRIU is told by its environment (deploy/criu/): the sandbox's namespaces
 * are forkpoint's own making, under its user namespace, so a dump need not fork to check that
 * they are (0003: ~1.5 ms of the pause); a restore need not wait for its usernsd to exit
 * (0006: 0.5-2.5 ms of a rollback or fork in a user namespace); a restorer opens
 * /dev/userfaultfd as it starts, before it joins a sandbox's cgroups, for a lazy restore into a
 * user namespace (0008); a lazy-pages daemon no restore connects to within a minute (its server
 * died first) exits (0008). An unpatched CRIU ignores them all. */
const CRIU_ENV = { CRIU_SKIP_USERNS_CHECK: '1', CRIU_USERNSD_NO_WAIT: '1', CRIU_UFFD_DEV: '1', CRIU_LAZY_ACCEPT_TIMEOUT_S: '60' };

/** A CRIU worker (`criu-run --swrk`) under a shim: what it restores stays the shim's. */
export function workerUnderShim(opts: ShimOptions): CriuWorker {
  const { input, output, exit, kill } = startShim({ ...opts, env: criuEnv() });
  return new CriuWorker(input, output, exit, kill);
}

let criuEnvironment: NodeJS.ProcessEnv | undefined;

/** The environment CRIU runs in (the spawner's, for what it starts): the server's as it was at
 * the first CRIU start (copying process.env is ~0.25 ms, once per CRIU started). */
export function criuEnv(): NodeJS.ProcessEnv {
  return (criuEnvironment ??= { ...process.env, ...CRIU_ENV });
}

/** A CRIU worker of our own (for dumps, which leave nothing behind to parent). */
export function worker(agentPath: string, args: string[], logFile: string): CriuWorker {
  const log = openSync(logFile, 'a');
  // A process group of its own, so that a deadline can end CRIU with it.
  const child = spawn(agentPath, args, { stdio: ['pipe', 'ignore', log, 'pipe'], detached: true, env: criuEnv() });
  closeSync(log);
  child.on('error', () => {});
  const exit = new Promise<number>((resolve) => child.once('exit', (c) => resolve(c ?? 1)));
  return new CriuWorker(child.stdin!, child.stdio[3] as Readable, exit, killGroup(child.pid));
}

export async function processStartTime(pid: number): Promise<string> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  // Field 22, counted after the parenthesised command name (which may hold spaces).
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]!;
}

/** Alive: the same process (pid and start time) and not a zombie waiting for its reaper. */
export async function isAlive(pid: number, startTime: string): Promise<boolean> {
  return aliveIn(await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => ''), startTime);
}

export function isAliveSync(pid: number, startTime: string): boolean {
  try {
    return aliveIn(readFileSync(`/proc/${pid}/stat`, 'utf8'), startTime);
  } catch {
    return false;
  }
}

/** Alive and not about to die: a frozen process (a standby held in the cgroup v1 freezer)
 * keeps a SIGKILL pending until it is thawed, and is gone the moment it is. */
export function isLastingSync(pid: number, startTime: string): boolean {
  if (!isAliveSync(pid, startTime)) return false;
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const killBit = 1n << 8n; // SIGKILL (9) is bit 8 of the pending masks
    for (const field of ['ShdPnd', 'SigPnd']) {
      const hex = new RegExp(`^${field}:\\s*([0-9a-f]+)$`, 'm').exec(status)?.[1];
      if (hex && (BigInt(`0x${hex}`) & killBit) !== 0n) return false;
    }
    return isAliveSync(pid, startTime);
  } catch {
    return false;
  }
}

function aliveIn(stat: string, startTime: string): boolean {
  if (!stat) return false;
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return fields[19] === startTime && fields[0] !== 'Z' && fields[0] !== 'X';
}
