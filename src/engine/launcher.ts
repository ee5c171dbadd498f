import { spawn } from 'node:child_process';
import { openSync, closeSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { EngineError } from './errors.js';
import { HARMLESS, tail } from './criu.js';

export interface Launched {
  pid: number;
  /** Process start time (clock ticks since boot), to tell a re-used pid from ours. */
  startTime: string;
}

/** Starts `command` under a shim (a subreaper that stays the parent of the sandbox) and
 * resolves once the command is done and the sandbox's PID 1 is in `pidfile`. */
export async function launchUnderShim(opts: {
  agentPath: string;
  command: string[];
  pidfile: string;
  statusFile: string;
  logFile: string;
  cgroupProcs: string[];
  failure: 'BOOT_FAILED' | 'RESTORE_FAILED';
  /** A log with more detail than stderr, read on failure (CRIU's). */
  detailLog?: string;
  /** Bring lo up in the restored sandbox's netns (images that carry a netns of their own). */
  loopbackUp?: boolean;
  /** A fork's own hostname, set in its uts namespace after the restore. */
  hostname?: string | undefined;
}): Promise<Launched> {
  const log = openSync(opts.logFile, 'a');
  const args = ['shim', '--status', opts.statusFile];
  for (const p of opts.cgroupProcs) args.push('--cgroup-procs', p);
  if (opts.loopbackUp || opts.hostname) args.push('--restored', opts.pidfile);
  if (opts.loopbackUp) args.push('--loopback-up');
  if (opts.hostname) args.push('--hostname', opts.hostname);
  args.push('--', ...opts.command);
  const child = spawn(opts.agentPath, args, { detached: true, stdio: ['ignore', 'pipe', log] });
  closeSync(log);
  child.on('error', () => {});
  const code = await new Promise<number>((resolve) => {
    const lines = createInterface({ input: child.stdout! });
    let done = false;
    lines.on('line', (line) => {
      const m = /^exit (\d+)$/.exec(line);
      if (m && !done) {
        done = true;
        resolve(Number(m[1]));
      }
    });
    child.once('exit', (c) => {
      if (!done) {
        done = true;
        resolve(c ?? 1);
      }
    });
  });
  child.stdout?.destroy();
  child.unref();
  if (code !== 0) {
    const detail = opts.detailLog ? await tail(opts.detailLog) : '';
    const stderr = await tail(opts.logFile, 10);
    const reason = firstUseful(detail) ?? stderr.trim().split('\n').pop() ?? `exit ${code}`;
    throw new EngineError(opts.failure, reason, detail || stderr);
  }
  const pid = Number((await readFile(opts.pidfile, 'utf8')).trim());
  if (!Number.isInteger(pid) || pid <= 0) throw new EngineError(opts.failure, `no pid in ${opts.pidfile}`);
  return { pid, startTime: await processStartTime(pid) };
}

function firstUseful(log: string): string | undefined {
  return log
    .split('\n')
    .find((l) => /Error/.test(l) && !HARMLESS.test(l))
    ?.replace(/^\(\d+\.\d+\)\s*/, '');
}

export async function processStartTime(pid: number): Promise<string> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  // Field 22, counted after the parenthesised command name (which may hold spaces).
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]!;
}

/** Alive: the same process (pid and start time) and not a zombie waiting for its reaper. */
export async function isAlive(pid: number, startTime: string): Promise<boolean> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return fields[19] === startTime && fields[0] !== 'Z' && fields[0] !== 'X';
  } catch {
    return false;
  }
}
