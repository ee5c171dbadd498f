import { Api, answer, CliError, resolveTarget, sseEvents } from './api.js';
import { keyValues, type Common } from './client.js';
import { ago, printJson, status, table } from './format.js';

export interface ExecOptions extends Common {
  /** Forward this process's stdin to the command (Docker's -i). */
  interactive?: boolean;
  user?: string;
  cwd?: string;
  env?: string[];
  timeout?: string;
  /** Start it in the background and print its execution id (Docker's exec -d). */
  detach?: boolean;
}

const STREAM_LOST = 'the command\'s stream ended without its exit (the instance was rolled back, stopped or deleted)';

async function readStdin(): Promise<string | undefined> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return chunks.length ? Buffer.concat(chunks).toString('utf8') : undefined;
}

/**
 * Runs a command and streams its output as it comes (stdout to stdout, stderr to stderr); with
 * `-i`, what is piped into the CLI goes to its stdin. Ends with the command's own exit status (128 + the
 * signal for one killed by a signal), as `docker exec` does.
 */
export async function exec(id: string, argv: string[], o: ExecOptions): Promise<void> {
  if (!argv.length) throw new CliError('exec: give a command after the instance id (forkpoint exec ID -- CMD ARGS...)', 'USAGE', 2);
  const a = new Api(resolveTarget(o));
  const command = argv.length === 1 ? ['/bin/sh', '-c', argv[0]!] : argv;
  if (o.detach) return detached(a, id, command, o);
  const timeout = o.timeout !== undefined ? Number(o.timeout) * 1000 : undefined;
  if (timeout !== undefined && !(timeout > 0)) throw new CliError(`--timeout: not a number of seconds: ${o.timeout}`, 'USAGE', 2);
  const stdin = o.interactive ? await readStdin() : undefined;
  const res = await a.raw('POST', `/instances/${encodeURIComponent(id)}/exec/stream`, {
    headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify({ command, user: o.user, cwd: o.cwd, env: keyValues(o.env, '--env'), stdin, timeout_ms: timeout }),
  });
  if (res.status >= 400) await answer(res);
  const collected = { stdout: '', stderr: '' };
  let exit: { exit_code: number; timed_out: boolean } | undefined;
  for await (const e of sseEvents(res)) {
    if (e.event === 'stdout' || e.event === 'stderr') {
      const p = JSON.parse(e.data) as { data: string; encoding?: 'base64' };
      const bytes = Buffer.from(p.data, p.encoding === 'base64' ? 'base64' : 'utf8');
      if (o.json) collected[e.event] += bytes.toString('utf8');
      else (e.event === 'stdout' ? process.stdout : process.stderr).write(bytes);
    } else if (e.event === 'exit') {
      exit = JSON.parse(e.data) as { exit_code: number; timed_out: boolean };
    } else if (e.event === 'error') {
      throw new CliError(`the command's stream broke off: ${e.data}`, 'STREAM_ENDED');
    }
  }
  if (!exit) throw new CliError(STREAM_LOST, 'PROCESS_LOST');
  if (o.json) printJson({ exit_code: exit.exit_code, timed_out: exit.timed_out, ...collected });
  process.exitCode = exit.exit_code;
}

/** A background process: it runs on with nobody attached; its output waits in the sandbox for
 * `forkpoint logs`. */
async function detached(a: Api, id: string, command: string[], o: ExecOptions): Promise<void> {
  if (o.interactive || o.timeout !== undefined) throw new CliError('exec --detach: a background process takes no stdin (-i) and no --timeout (stop it with forkpoint kill)', 'USAGE', 2);
  const started = await a.call<{ exec_id: string; process_id: number; pid: number }>('POST', `/instances/${encodeURIComponent(id)}/processes`, { command, user: o.user, cwd: o.cwd, env: keyValues(o.env, '--env') });
  if (o.json) return printJson(started);
  process.stdout.write(`${started.exec_id}\n`);
}

interface Execution {
  id: string;
  kind: string;
  command: string[];
  status: string;
  pid: number | null;
  exit_code: number | null;
  started_at: string;
}

const commandLine = (argv: string[]) => (argv.length === 3 && argv[0] === '/bin/sh' && argv[1] === '-c' ? argv[2]! : argv.join(' '));

/** The instance's executions (background processes, streamed commands, terminals), newest first. */
export async function ps(id: string, o: Common): Promise<void> {
  const a = new Api(resolveTarget(o));
  const items: Execution[] = [];
  for (let cursor: string | null = null; ; ) {
    const page: { items: Execution[]; next_cursor: string | null } = await a.call('GET', `/instances/${encodeURIComponent(id)}/exec?limit=100${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
    items.push(...page.items);
    if (!(cursor = page.next_cursor)) break;
  }
  if (o.json) return printJson(items);
  process.stdout.write(table(['EXEC ID', 'KIND', 'PID', 'STATUS', 'EXIT', 'STARTED', 'COMMAND'], items.map((e) => [
    e.id, e.kind, e.pid === null ? '-' : String(e.pid), status(e.status), e.exit_code === null ? '-' : String(e.exit_code), ago(e.started_at), commandLine(e.command).slice(0, 60),
  ])));
}

export interface LogsOptions extends Common {
  follow?: boolean;
}

/** What an execution printed (what the sandbox's scrollback holds: its last 256 KiB a stream);
 * with `-f`, then what it prints until it ends, as `docker logs -f`. */
export async function logs(id: string, execId: string, o: LogsOptions): Promise<void> {
  const a = new Api(resolveTarget(o));
  const path = `/instances/${encodeURIComponent(id)}/exec/${encodeURIComponent(execId)}`;
  if (!o.follow) {
    const e = await a.call<{ stdout: string; stderr: string; output_encoding: string }>('GET', `${path}?output_encoding=base64`);
    if (o.json) return printJson({ stdout: Buffer.from(e.stdout, 'base64').toString('utf8'), stderr: Buffer.from(e.stderr, 'base64').toString('utf8') });
    process.stdout.write(Buffer.from(e.stdout, 'base64'));
    process.stderr.write(Buffer.from(e.stderr, 'base64'));
    return;
  }
  const res = await a.raw('GET', `${path}/stream`, { headers: { accept: 'text/event-stream' } });
  if (res.status >= 400) await answer(res);
  for await (const e of sseEvents(res)) {
    if (e.event === 'stdout' || e.event === 'stderr') {
      const p = JSON.parse(e.data) as { data: string; encoding?: 'base64' };
      (e.event === 'stdout' ? process.stdout : process.stderr).write(Buffer.from(p.data, p.encoding === 'base64' ? 'base64' : 'utf8'));
    } else if (e.event === 'exit') return;
  }
  throw new CliError(STREAM_LOST, 'PROCESS_LOST');
}

/** Sends a signal to an execution's whole process group (SIGKILL unless told). */
export async function kill(id: string, execId: string, o: Common & { signal?: string }): Promise<void> {
  const signal = signalNumber(o.signal ?? 'KILL');
  const a = new Api(resolveTarget(o));
  await a.call('POST', `/instances/${encodeURIComponent(id)}/exec/${encodeURIComponent(execId)}/kill`, { signal });
  if (o.json) printJson({ exec_id: execId, signal });
}

const SIGNALS: Record<string, number> = { HUP: 1, INT: 2, QUIT: 3, KILL: 9, USR1: 10, USR2: 12, TERM: 15, CONT: 18, STOP: 19 };
function signalNumber(given: string): number {
  const name = given.toUpperCase().replace(/^SIG/, '');
  const n = /^\d+$/.test(name) ? Number(name) : SIGNALS[name];
  if (n === undefined || n < 1 || n > 64) throw new CliError(`--signal: not a signal: ${given} (a number 1-64, or ${Object.keys(SIGNALS).join(', ')})`, 'USAGE', 2);
  return n;
}
