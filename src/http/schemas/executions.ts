import { z } from 'zod';
import { Env, IdParams } from './common.js';
import { Command, RunAs } from './exec.js';

/** Streamed commands (SSE), their records, and terminals (WebSocket). */

export const HeartbeatMs = z.number().int().min(100).max(120_000).describe('a heartbeat comment after this long without an event; default 15000');

export const ExecStreamRequest = z
  .object({
    command: Command,
    cwd: z.string().max(4096).optional(),
    env: Env.optional(),
    stdin: z.string().max(8 << 20).optional().describe('written to the command\'s stdin, which is then closed'),
    timeout_ms: z.number().int().min(1).max(7 * 24 * 3600 * 1000).optional().describe('none by default; on expiry the whole process group is killed'),
    heartbeat_ms: HeartbeatMs.optional(),
    user: RunAs.optional(),
  })
  .strict()
  .meta({ id: 'ExecStreamRequest', examples: [{ command: 'for i in 1 2 3; do echo $i; sleep 1; done' }] });

export const ExecParams = IdParams.extend({ exec_id: z.string().min(1).max(64).describe('an execution id (`exec_...`)') });

export const ReattachQuery = z.object({
  stdout_offset: z.coerce.number().int().min(0).optional().describe('resume after this many stdout bytes (or send the last event id as Last-Event-ID)'),
  stderr_offset: z.coerce.number().int().min(0).optional(),
  heartbeat_ms: z.coerce.number().int().min(100).max(120_000).optional().describe('a heartbeat comment after this long without an event; default 15000'),
});

export const Execution = z
  .object({
    id: z.string().describe('`exec_...`: attach, read and kill it by this id; forks of the instance know it too'),
    kind: z.enum(['exec', 'pty']),
    command: z.array(z.string()).describe('the argv'),
    cwd: z.string(),
    status: z.enum(['running', 'exited']),
    pid: z.number().int().nullable().describe('inside the sandbox, while it runs'),
    exit_code: z.number().int().nullable().describe('128 + the signal for one killed by a signal; null while running, or when the end was not seen'),
    signal: z.number().int().nullable(),
    timed_out: z.boolean(),
    duration_ms: z.number().nullable(),
    started_at: z.string(),
    ended_at: z.string().nullable(),
    stdout_bytes: z.number().int().describe('written so far (the scrollback keeps the last 256 KiB)'),
    stderr_bytes: z.number().int(),
    attached: z.number().int().describe('clients attached now'),
  })
  .meta({ id: 'Execution' });

export const ExecutionPage = z
  .object({ items: z.array(Execution), next_cursor: z.string().nullable().describe('pass as `cursor` for the next page; null on the last') })
  .meta({ id: 'ExecutionPage' });

export const ExecutionQuery = z.object({
  wait_ms: z.coerce.number().int().min(0).max(60_000).optional().describe('wait up to this long for it to end (a long poll)'),
  output_encoding: z.enum(['utf8', 'base64']).optional(),
});

export const ExecutionWithOutput = Execution.extend({
  stdout: z.string().describe('what the scrollback holds: the last 256 KiB'),
  stderr: z.string(),
  output_encoding: z.enum(['utf8', 'base64']),
  truncated: z.boolean().describe('earlier output left the scrollback'),
}).meta({ id: 'ExecutionWithOutput' });

export const KillRequest = z
  .object({ signal: z.number().int().min(1).max(64).default(9) })
  .strict()
  .meta({ id: 'KillRequest', examples: [{ signal: 15 }] });

export const Size = { rows: z.number().int().min(1).max(1000), cols: z.number().int().min(1).max(1000) };

export const CreatePtyRequest = z
  .object({
    ...Size,
    command: Command.optional().describe('default: an interactive bash (or sh)'),
    env: Env.optional(),
    cwd: z.string().max(4096).optional().describe("default: the user's home (/root)"),
    user: RunAs.optional(),
  })
  .strict()
  .meta({ id: 'CreatePtyRequest', examples: [{ rows: 24, cols: 80 }] });

export const Pty = z
  .object({ id: z.string().describe('attach with a WebSocket to /instances/{id}/pty/{pty_id}'), pid: z.number().int().nullable() })
  .meta({ id: 'Pty' });

export const PtyParams = IdParams.extend({ pty_id: z.string().min(1).max(64) });

export const ResizeRequest = z.object(Size).strict().meta({ id: 'ResizeRequest', examples: [{ rows: 40, cols: 120 }] });
