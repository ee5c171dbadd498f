import { z } from 'zod';
import { MAX_EXEC_TIMEOUT_MS } from '../../core/commands.js';
import { Env, IdParams } from './common.js';

/** Commands, shell sessions and background processes. */

/** Who a command runs as, as Docker's `exec --user` takes it. */
export const RunAs = z
  .string()
  .regex(/^([A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?|\d{1,10})$/)
  .describe('a user of the sandbox, by name or uid, as its /etc/passwd has it: the command runs with its ids, groups and HOME; by default the image\'s USER, else root');

export const Command = z
  .union([z.string().min(1).max(1 << 20), z.array(z.string().max(1 << 16)).min(1).max(4096)])
  .describe('an argv array, run directly; or a string, run by /bin/sh -c (or by the session shell)');

export const ExecRequest = z
  .object({
    command: Command,
    cwd: z.string().max(4096).optional(),
    env: Env.optional(),
    timeout_ms: z.number().int().min(1).max(MAX_EXEC_TIMEOUT_MS).optional().describe('default 60000; on expiry the whole process group is killed'),
    stdin: z.string().max(8 << 20).optional(),
    session: z
      .string()
      .regex(/^[A-Za-z0-9_-]{1,32}$/)
      .optional()
      .describe('run in the named persistent shell (made on first use): cd, export and background jobs persist between calls'),
    max_output_bytes: z.number().int().min(0).max(64 << 20).optional().describe('per stream; default 1 MiB'),
    user: RunAs.optional(),
    output_encoding: z
      .enum(['utf8', 'base64'])
      .optional()
      .describe('how stdout and stderr are returned: UTF-8 text (default; bytes that are not UTF-8 become U+FFFD) or base64, byte for byte'),
  })
  .strict()
  .meta({ id: 'ExecRequest', examples: [{ command: 'uname -a; echo hi >&2' }, { command: 'cd /tmp && export X=1', session: 'main' }] });

export const ExecResult = z
  .object({
    exit_code: z.number().int().describe('128 + the signal for a command killed by one'),
    stdout: z.string(),
    stderr: z.string(),
    output_encoding: z.enum(['utf8', 'base64']),
    duration_ms: z.number(),
    timed_out: z.boolean(),
    truncated: z.boolean().describe('an output was cut at max_output_bytes'),
  })
  .meta({ id: 'ExecResult', examples: [{ exit_code: 0, stdout: 'hi\n', stderr: '', output_encoding: 'utf8', duration_ms: 2.4, timed_out: false, truncated: false }] });

export const Session = z
  .object({ name: z.string(), process_id: z.number().int(), running: z.boolean() })
  .meta({ id: 'Session' });
export const SessionList = z.object({ items: z.array(Session) }).meta({ id: 'SessionList' });
export const SessionParams = IdParams.extend({ name: z.string().min(1).max(64) });

export const StartProcessRequest = z
  .object({
    command: Command,
    cwd: z.string().max(4096).optional(),
    env: Env.optional(),
    pty: z.object({ rows: z.number().int().min(1).max(1000), cols: z.number().int().min(1).max(1000) }).optional(),
    user: RunAs.optional(),
  })
  .strict()
  .meta({ id: 'StartProcessRequest', examples: [{ command: 'while true; do date; sleep 1; done' }] });

export const StartedProcess = z
  .object({
    process_id: z.number().int().describe('the agent\'s id for it: use it in the process routes'),
    exec_id: z.string().describe('the same process as an execution: use it in the exec routes (streams, stdin, terminals)'),
    pid: z.number().int().describe('its pid inside the sandbox'),
  })
  .meta({ id: 'StartedProcess' });

export const ProcessParams = IdParams.extend({ process_id: z.coerce.number().int().min(1).max(0xffffffff) });

export const ProcessInfo = z
  .object({
    process_id: z.number().int(),
    exec_id: z.string(),
    pid: z.number().int().nullable().describe('inside the sandbox; null once the sandbox no longer knows it'),
    status: z.enum(['running', 'exited']),
    exit_code: z.number().int().nullable(),
    signal: z.number().int().nullable(),
    pty: z.boolean(),
    stdout_bytes: z.number().int(),
    stderr_bytes: z.number().int(),
    command: z.string(),
  })
  .meta({ id: 'Process' });
export const ProcessList = z.object({ items: z.array(ProcessInfo) }).meta({ id: 'ProcessList' });

export const OutputQuery = z.object({
  stdout_offset: z.coerce.number().int().min(0).default(0),
  stderr_offset: z.coerce.number().int().min(0).default(0),
});

export const ProcessOutput = z
  .object({
    stdout: z.string(),
    stderr: z.string(),
    stdout_offset: z.number().int().describe('pass back to read on from here'),
    stderr_offset: z.number().int(),
    dropped_bytes: z.number().int().describe('bytes that left the bounded scrollback before they were read'),
    exit_code: z.number().int().nullable(),
  })
  .meta({ id: 'ProcessOutput' });

export const SignalRequest = z
  .object({ signal: z.number().int().min(1).max(64).default(15) })
  .strict()
  .meta({ id: 'SignalRequest', examples: [{ signal: 2 }] });
