import { Api, answer, CliError, resolveTarget, sseEvents } from './api.js';
import { keyValues, type Common } from './client.js';
import { printJson } from './format.js';

export interface ExecOptions extends Common {
  /** Forward this process's stdin to the command (Docker's -i). */
  interactive?: boolean;
  user?: string;
  cwd?: string;
  env?: string[];
  timeout?: string;
}

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
  const timeout = o.timeout !== undefined ? Number(o.timeout) * 1000 : undefined;
  if (timeout !== undefined && !(timeout > 0)) throw new CliError(`--timeout: not a number of seconds: ${o.timeout}`, 'USAGE', 2);
  const stdin = o.interactive ? await readStdin() : undefined;
  const res = await a.raw('POST', `/instances/${encodeURIComponent(id)}/exec/stream`, {
    headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify({ command: argv.length === 1 ? ['/bin/sh', '-c', argv[0]] : argv, user: o.user, cwd: o.cwd, env: keyValues(o.env, '--env'), stdin, timeout_ms: timeout }),
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
  if (!exit) throw new CliError('the command\'s stream ended without its exit (the instance was rolled back, stopped or deleted)', 'PROCESS_LOST');
  if (o.json) printJson({ exit_code: exit.exit_code, timed_out: exit.timed_out, ...collected });
  process.exitCode = exit.exit_code;
}
