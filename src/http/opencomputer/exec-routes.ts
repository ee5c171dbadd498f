import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { DEFAULT_MAX_OUTPUT } from '../../core/commands.js';
import type { ExecutionState } from '../../core/executions.js';
import type { Forkpoint } from '../../core/forkpoint.js';
import { noContent, ok } from '../schemas/common.js';
import { DEFAULT_TERMINAL, switching } from '../routes/terminals.js';
import { bridgeExecution } from '../streams/ws.js';
import {
  ExecIdParams, ExecResultBody, ExecSessionBody, ExecSessionCreated, ExecSessionInfo, KillBody, ocErrorResponses, PtyBody, ResizeBody, SandboxParams,
  SessionParams,
} from './schemas.js';

/** How long `run-async` holds its answer for a command to finish (then 202). */
const RUN_HOLD_MS = 1000;
/** How long a result poll waits for the command to finish before answering `running`. */
const RESULT_POLL_MS = 2000;

const WS_NOTE =
  'The token may be passed as `?api_key=` (a WebSocket cannot carry headers). The socket closes with 1000 when the command ends; 1011 when the stream ended without an exit ' +
  '(the sandbox was rolled back past it, hibernated, stopped or deleted: attach again); 1013 when the client fell more than 4 MiB behind; 4000 + an HTTP status when the attach failed.';

const sessionInfo = (s: ExecutionState) => ({
  sessionID: s.record.id,
  sandboxID: s.record.instanceId,
  command: s.record.argv[0] ?? '',
  args: s.record.argv.slice(1),
  running: s.running,
  ...(s.exitCode !== null ? { exitCode: s.exitCode } : {}),
  startedAt: s.record.startedAt,
  attachedClients: s.attached,
});

const secondsToMs = (s: number | undefined) => (s ? Math.round(s * 1000) : undefined);

/** OpenComputer's exec sessions (attachable over a WebSocket), async runs and terminals. */
export const execSessionRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['opencomputer'];
    const errors = ocErrorResponses;

    app.post('/sandboxes/:id/exec', {
      schema: {
        operationId: 'ocCreateExecSession',
        tags,
        summary: 'Start an exec session',
        description: 'Starts `cmd` with `args` (no shell) with its stdin open, as a session that outlives the request: attach to it with the WebSocket `/sandboxes/{id}/exec/{sessionID}`.',
        params: SandboxParams,
        body: ExecSessionBody,
        response: { 201: ok('The session', ExecSessionCreated), ...errors },
      },
    }, async (req, reply) => {
      const b = req.body;
      const st = await fp.executions.start(req.owner, req.params.id, {
        kind: 'exec',
        argv: [b.cmd, ...(b.args ?? [])],
        env: b.envs,
        cwd: b.cwd,
        keepStdinOpen: true,
        timeoutMs: secondsToMs(b.timeout),
        maxRunAfterDisconnectMs: b.maxRunAfterDisconnect !== undefined ? Math.round(b.maxRunAfterDisconnect * 1000) : undefined,
      });
      return reply.code(201).send({ sessionID: st.record.id });
    });

    app.get('/sandboxes/:id/exec', {
      schema: {
        operationId: 'ocListExecSessions',
        tags,
        summary: 'List exec sessions',
        description: 'Running and ended sessions (and async runs), newest first, with how many clients are attached to each.',
        params: SandboxParams,
        response: { 200: ok('The sessions', z.array(ExecSessionInfo)), ...errors },
      },
    }, async (req) => (await fp.executions.list(req.owner, req.params.id, 500)).items.filter((s) => s.record.kind === 'exec').map(sessionInfo));

    app.get('/sandboxes/:id/exec/:sessionId', {
      websocket: true,
      preHandler: async (req) => {
        await fp.executions.find(req.owner, req.params.id, req.params.sessionId);
      },
      schema: {
        operationId: 'ocAttachExecSession',
        tags,
        summary: 'Attach to an exec session (WebSocket)',
        description:
          'Binary messages whose first byte says what follows. From the client: 0x00 + bytes for stdin. To the client: the scrollback first (0x01 + stdout bytes, 0x02 + stderr bytes), ' +
          'then 0x04 (end of the scrollback), then live output, and 0x03 + the exit code as a big-endian int32 when the command ends. Every attach replays the scrollback; any number of clients may attach. ' +
          WS_NOTE,
        params: SessionParams,
        response: { ...switching('Switching to the WebSocket protocol'), ...errors },
      },
    }, (socket, req) => bridgeExecution(fp, socket, { owner: req.owner, id: req.params.id, execId: req.params.sessionId }, 'opencomputer', req.log));

    app.post('/sandboxes/:id/exec/:sessionId/kill', {
      schema: {
        operationId: 'ocKillExecSession',
        tags,
        summary: 'Send a signal to an exec session',
        description: 'To its whole process group; SIGKILL (9) by default.',
        params: SessionParams,
        body: KillBody,
        response: { 204: noContent('Sent'), ...errors },
      },
    }, async (req, reply) => {
      await fp.executions.signal(req.owner, req.params.id, req.params.sessionId, req.body.signal ?? 9);
      return reply.code(204).send(null);
    });

    const result = async (owner: string, id: string, execId: string) => {
      const out = await fp.executions.output(owner, id, execId);
      const s = out.state;
      if (s.running) return { execId, running: true, startedAt: s.record.startedAt };
      if (s.exitCode === null) {
        return { execId, running: false, error: 'the command was lost: the sandbox was rolled back past it, stopped, or lost its record of it' };
      }
      return { execId, running: false, exitCode: s.exitCode, stdout: out.stdout.toString('utf8'), stderr: out.stderr.toString('utf8') };
    };

    app.post('/sandboxes/:id/exec/run-async', {
      schema: {
        operationId: 'ocRunAsync',
        tags,
        summary: 'Run a command, answering at once if it is quick',
        description:
          `Starts \`cmd\` with \`args\`; if it ends within ${RUN_HOLD_MS} ms the answer is 200 with its result, else 202 with \`{execId, running, startedAt}\`: poll \`GET /sandboxes/{id}/exec/{execId}/result\`. ` +
          'The output is kept whole up to 1 MiB per stream. `timeout` (seconds) kills it.',
        params: SandboxParams,
        body: ExecSessionBody,
        response: { 200: ok('It ended: its result', ExecResultBody), 202: ok('Still running', ExecResultBody), ...errors },
      },
    }, async (req, reply) => {
      const b = req.body;
      const { owner } = req;
      const { id } = req.params;
      const st = await fp.executions.start(owner, id, {
        kind: 'exec',
        argv: [b.cmd, ...(b.args ?? [])],
        env: b.envs,
        cwd: b.cwd,
        timeoutMs: secondsToMs(b.timeout),
        collectBytes: DEFAULT_MAX_OUTPUT,
      });
      const now = await fp.executions.wait(owner, id, st.record.id, AbortSignal.any([req.clientGone, AbortSignal.timeout(RUN_HOLD_MS)]));
      if (now.running) return reply.code(202).send({ execId: st.record.id, running: true, startedAt: st.record.startedAt });
      return reply.code(200).send(await result(owner, id, st.record.id));
    });

    app.get('/sandboxes/:id/exec/:execId/result', {
      schema: {
        operationId: 'ocExecResult',
        tags,
        summary: 'The result of a command (a long poll)',
        description: `Waits up to ${RESULT_POLL_MS} ms for the command to end; answers \`running: true\` if it has not, else its exit code and output.`,
        params: ExecIdParams,
        response: { 200: ok('Its result, or that it still runs', ExecResultBody), ...errors },
      },
    }, async (req) => {
      await fp.executions.wait(req.owner, req.params.id, req.params.execId, AbortSignal.any([req.clientGone, AbortSignal.timeout(RESULT_POLL_MS)]));
      return result(req.owner, req.params.id, req.params.execId);
    });

    app.post('/sandboxes/:id/pty', {
      schema: {
        operationId: 'ocCreatePty',
        tags,
        summary: 'Open a terminal',
        description: 'An interactive shell on a PTY of `cols` x `rows`; attach with the WebSocket `/sandboxes/{id}/pty/{sessionID}`.',
        params: SandboxParams,
        body: PtyBody,
        response: { 201: ok('The terminal', ExecSessionCreated), ...errors },
      },
    }, async (req, reply) => {
      const st = await fp.executions.start(req.owner, req.params.id, { kind: 'pty', argv: DEFAULT_TERMINAL, pty: { rows: req.body.rows, cols: req.body.cols } });
      return reply.code(201).send({ sessionID: st.record.id });
    });

    app.get('/sandboxes/:id/pty/:sessionId', {
      websocket: true,
      preHandler: async (req) => {
        await fp.executions.find(req.owner, req.params.id, req.params.sessionId);
      },
      schema: {
        operationId: 'ocAttachPty',
        tags,
        summary: 'Attach to a terminal (WebSocket)',
        description: `Raw bytes both ways: what the client sends is typed into the terminal; its output comes as binary messages, the scrollback first. ${WS_NOTE}`,
        params: SessionParams,
        response: { ...switching('Switching to the WebSocket protocol'), ...errors },
      },
    }, (socket, req) => bridgeExecution(fp, socket, { owner: req.owner, id: req.params.id, execId: req.params.sessionId }, 'raw', req.log));

    app.post('/sandboxes/:id/pty/:sessionId/resize', {
      schema: { operationId: 'ocResizePty', tags, summary: 'Resize a terminal', description: 'What runs in it gets SIGWINCH.', params: SessionParams, body: ResizeBody, response: { 204: noContent('Resized'), ...errors } },
    }, async (req, reply) => {
      await fp.executions.resize(req.owner, req.params.id, req.params.sessionId, req.body.rows, req.body.cols);
      return reply.code(204).send(null);
    });

    app.delete('/sandboxes/:id/pty/:sessionId', {
      schema: { operationId: 'ocClosePty', tags, summary: 'Close a terminal', description: 'Kills what runs in it; attached clients are closed.', params: SessionParams, response: { 204: noContent('Closed'), ...errors } },
    }, async (req, reply) => {
      await fp.executions.remove(req.owner, req.params.id, req.params.sessionId);
      return reply.code(204).send(null);
    });
  };
