import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { ExecutionState } from '../../core/executions.js';
import type { Forkpoint } from '../../core/forkpoint.js';
import {
  errorResponses, ExecParams, ExecStreamRequest, ExecutionPage, ExecutionQuery, ExecutionWithOutput, IdParams, KillRequest, noContent, ok, PageQuery,
  ReattachQuery,
} from '../schemas/index.js';
import { offsetsFromEventId, streamExecution } from '../streams/exec-sse.js';

export const executionView = (s: ExecutionState) => ({
  id: s.record.id,
  kind: s.record.kind,
  command: s.record.argv,
  cwd: s.record.cwd,
  status: s.running ? ('running' as const) : ('exited' as const),
  pid: s.running ? s.pid : null,
  exit_code: s.exitCode,
  signal: s.signal,
  timed_out: s.timedOut,
  duration_ms: s.durationMs,
  started_at: s.record.startedAt,
  ended_at: s.running ? null : s.record.endedAt,
  stdout_bytes: s.stdoutBytes,
  stderr_bytes: s.stderrBytes,
  attached: s.attached,
});

export const argvOf = (command: string | string[]) => (Array.isArray(command) ? command : ['/bin/sh', '-c', command]);

const SSE_PROTOCOL =
  'The answer is `text/event-stream`: a `start` event `{exec_id, pid, started_at}` (the id is also in the `X-Exec-Id` header); ' +
  '`stdout` and `stderr` events `{data, offset}` as the bytes are produced, `data` being UTF-8 text, or base64 with `"encoding": "base64"` where the bytes are not valid UTF-8; ' +
  'each output event has an id `<stdout bytes>-<stderr bytes>` to resume after it; a final `exit` event `{exit_code, signal, duration_ms, timed_out}`; ' +
  'a `: heartbeat` comment when nothing was sent for `heartbeat_ms`. ' +
  'A client that goes away detaches: the command keeps running, and `GET /instances/{id}/exec/{exec_id}/stream` (with `Last-Event-ID`) gives the rest. ' +
  'A `detached` event means the stream ended without the exit (the instance was rolled back past the command, hibernated, stopped or deleted).';

const sseAnswer = (description: string) => ({ description, content: { 'text/event-stream': { schema: z.string().describe('Server-Sent Events') } } });

export const executionRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['exec'];
    app.post('/instances/:id/exec/stream', {
      schema: {
        operationId: 'execStream',
        tags,
        summary: 'Run a command and stream its output as it comes',
        description: `Starts the command on pipes, as an execution that outlives the request. ${SSE_PROTOCOL}`,
        params: IdParams,
        body: ExecStreamRequest,
        produces: ['text/event-stream'],
        response: { 200: sseAnswer('The command\'s output and exit, as events'), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body;
      const st = await fp.executions.start(req.owner, req.params.id, {
        kind: 'exec',
        argv: argvOf(b.command),
        env: b.env,
        cwd: b.cwd,
        stdin: b.stdin !== undefined ? Buffer.from(b.stdin) : undefined,
        timeoutMs: b.timeout_ms,
        user: b.user,
        startIn: 'workdir',
      });
      await streamExecution(fp, req, reply, { owner: req.owner, id: req.params.id, execId: st.record.id }, {
        from: [0, 0],
        heartbeatMs: b.heartbeat_ms,
        first: { event: 'start', data: { exec_id: st.record.id, pid: st.pid, started_at: st.record.startedAt } },
      });
    });

    app.get('/instances/:id/exec/:exec_id/stream', {
      schema: {
        operationId: 'execReattach',
        tags,
        summary: 'Stream an execution again, from where the client was',
        description:
          'Replays what the scrollback holds from the offsets given (by `Last-Event-ID`, or `stdout_offset`/`stderr_offset`; from the start without either), then streams live until the exit. ' +
          'An execution that already ended replays and ends with its `exit` event. Same events as `POST /instances/{id}/exec/stream`, without `start`.',
        params: ExecParams,
        querystring: ReattachQuery,
        produces: ['text/event-stream'],
        response: { 200: sseAnswer('The rest of the output, and the exit'), ...errorResponses },
      },
    }, async (req, reply) => {
      const q = req.query;
      const last = offsetsFromEventId(req.headers['last-event-id'] as string | undefined);
      const from: [number, number] = last ?? [q.stdout_offset ?? 0, q.stderr_offset ?? 0];
      await streamExecution(fp, req, reply, { owner: req.owner, id: req.params.id, execId: req.params.exec_id }, { from, heartbeatMs: q.heartbeat_ms });
    });

    app.get('/instances/:id/exec', {
      schema: {
        operationId: 'listExecutions',
        tags,
        summary: 'List executions, newest first',
        description: 'Streamed commands and terminals, running and past, a page at a time. A fork lists the ones its checkpoint had running.',
        params: IdParams,
        querystring: PageQuery,
        response: { 200: ok('A page of executions', ExecutionPage), ...errorResponses },
      },
    }, async (req) => {
      const page = await fp.executions.list(req.owner, req.params.id, req.query.limit, req.query.cursor);
      return { items: page.items.map(executionView), next_cursor: page.nextCursor };
    });

    app.get('/instances/:id/exec/:exec_id', {
      schema: {
        operationId: 'getExecution',
        tags,
        summary: 'An execution: its result, or its output so far',
        description: 'With `wait_ms`, waits up to that long for it to end first (a long poll). The output is what the scrollback holds (the last 256 KiB per stream).',
        params: ExecParams,
        querystring: ExecutionQuery,
        response: { 200: ok('The execution and its output', ExecutionWithOutput), ...errorResponses },
      },
    }, async (req) => {
      const { owner } = req;
      const { id, exec_id: execId } = req.params;
      if (req.query.wait_ms) await fp.executions.wait(owner, id, execId, AbortSignal.any([req.clientGone, AbortSignal.timeout(req.query.wait_ms)]));
      const out = await fp.executions.output(owner, id, execId);
      const encoding = req.query.output_encoding ?? 'utf8';
      return { ...executionView(out.state), stdout: out.stdout.toString(encoding), stderr: out.stderr.toString(encoding), output_encoding: encoding, truncated: out.truncated };
    });

    app.post('/instances/:id/exec/:exec_id/kill', {
      schema: {
        operationId: 'killExecution',
        tags,
        summary: 'Send a signal to an execution',
        description: 'To its whole process group; SIGKILL (9) by default. An execution that has ended is no error.',
        params: ExecParams,
        body: KillRequest,
        response: { 204: noContent('Sent'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.executions.signal(req.owner, req.params.id, req.params.exec_id, req.body.signal);
      return reply.code(204).send(null);
    });

    app.delete('/instances/:id/exec/:exec_id', {
      schema: {
        operationId: 'deleteExecution',
        tags,
        summary: 'Kill an execution and forget it',
        description: 'Its process group is killed if it runs; its record and scrollback go.',
        params: ExecParams,
        response: { 204: noContent('Gone'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.executions.remove(req.owner, req.params.id, req.params.exec_id);
      return reply.code(204).send(null);
    });
  };

