import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { sendWithOutputs } from '../output-json.js';
import {
  errorResponses, ExecRequest, ExecResult, IdParams, noContent, ok, OutputQuery, ProcessInfo, ProcessList, ProcessOutput, ProcessParams,
  SessionList, SessionParams, SignalRequest, StartedProcess, StartProcessRequest,
} from '../schemas/index.js';
import { execIdOf, MAX_EXECUTION_RECORDS } from '../../core/executions.js';
import { execFields, processView } from '../views.js';
import { argvOf } from './executions.js';

export const execRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    app.post('/instances/:id/exec', {
      schema: {
        operationId: 'execCommand',
        tags: ['exec'],
        summary: 'Run a command and wait for it',
        description:
          'Without `session`: the command runs on pipes (stdout and stderr apart) as a new process group, killed whole on timeout. ' +
          'With `session`: it runs in a persistent bash on a PTY inside the sandbox, so `cd`, `export` and background jobs persist; ' +
          'stdout and stderr are still apart. During a checkpoint the call waits; a command running across a checkpoint is carried in the dump and finishes after it. ' +
          'Output past 1 MiB per stream is kept on disk and streamed into the answer, so `max_output_bytes` up to 64 MiB costs the server no more memory; `output_encoding: "base64"` returns it byte for byte.',
        params: IdParams,
        body: ExecRequest,
        response: { 200: ok('How the command ended, and what it printed', ExecResult), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body;
      const r = await fp.commands.exec(req.owner, req.params.id, {
        command: b.command, cwd: b.cwd, env: b.env, timeoutMs: b.timeout_ms, stdin: b.stdin, session: b.session, maxOutputBytes: b.max_output_bytes, signal: req.clientGone, user: b.user,
      });
      const encoding = b.output_encoding ?? 'utf8';
      return sendWithOutputs(reply, execFields(r, encoding), encoding);
    });

    app.get('/instances/:id/sessions', {
      schema: {
        operationId: 'listSessions',
        tags: ['exec'],
        summary: 'List shell sessions',
        description: 'The persistent shells made by exec with `session`, and whether each still runs. They live in the sandbox, so they travel with checkpoints, rollbacks and forks.',
        params: IdParams,
        response: { 200: ok('The sessions', SessionList), ...errorResponses },
      },
    }, async (req) => ({
      items: (await fp.commands.listSessions(req.owner, req.params.id)).map((s) => ({ name: s.name, process_id: s.processId, running: s.running })),
    }));

    app.delete('/instances/:id/sessions/:name', {
      schema: {
        operationId: 'closeSession',
        tags: ['exec'],
        summary: 'Close a shell session',
        description: 'Kills the session\'s shell and what runs in it; the next exec with that session name starts a new one.',
        params: SessionParams,
        response: { 204: noContent('Closed'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.commands.closeSession(req.owner, req.params.id, req.params.name);
      return reply.code(204).send(null);
    });

    // The same executions as `/instances/{id}/exec/{exec_id}`, by the agent's number for them
    // (`exec_id` is `exec_` and that number in 8 hex digits), started to run on unfollowed.
    const tags = ['processes'];
    app.post('/instances/:id/processes', {
      schema: {
        operationId: 'startProcess',
        tags,
        summary: 'Start a background process',
        description:
          'It keeps running with no client attached; its output is kept in a bounded scrollback (256 KiB per stream) and never waits for a reader. ' +
          'It is an execution like any other: listed by `GET /instances/{id}/exec` too, streamed by `GET /instances/{id}/exec/{exec_id}/stream`.',
        params: IdParams,
        body: StartProcessRequest,
        response: { 201: ok('Started', StartedProcess), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body;
      const st = await fp.executions.start(req.owner, req.params.id, { kind: b.pty ? 'pty' : 'exec', argv: argvOf(b.command), cwd: b.cwd, env: b.env, pty: b.pty, user: b.user, startIn: 'workdir', detached: true });
      return reply.code(201).send({ process_id: st.record.processId, exec_id: st.record.id, pid: st.pid });
    });

    app.get('/instances/:id/processes', {
      schema: {
        operationId: 'listProcesses',
        tags,
        summary: 'List background processes and other executions, newest first',
        description: 'Background processes, streamed commands and terminals, running or exited (until deleted; the newest 1000 records are kept), with how much each has printed.',
        params: IdParams,
        response: { 200: ok('The processes', ProcessList), ...errorResponses },
      },
    }, async (req) => ({ items: (await fp.executions.list(req.owner, req.params.id, MAX_EXECUTION_RECORDS)).items.map(processView) }));

    app.get('/instances/:id/processes/:process_id', {
      schema: {
        operationId: 'getProcess',
        tags,
        summary: 'Get a process',
        description: 'Whether it runs, its exit code once it has ended, and its output so far in bytes.',
        params: ProcessParams,
        response: { 200: ok('The process', ProcessInfo), ...errorResponses },
      },
    }, async (req) => processView(await fp.executions.get(req.owner, req.params.id, execIdOf(req.params.process_id))));

    app.get('/instances/:id/processes/:process_id/output', {
      schema: {
        operationId: 'getProcessOutput',
        tags,
        summary: 'Read output from offsets on',
        description: 'Pass the offsets of the previous answer to read on; `dropped_bytes` says what left the scrollback unread.',
        params: ProcessParams,
        querystring: OutputQuery,
        response: { 200: ok('Output since the offsets', ProcessOutput), ...errorResponses },
      },
    }, async (req) => {
      const o = await fp.executions.read(req.owner, req.params.id, execIdOf(req.params.process_id), { stdout: req.query.stdout_offset, stderr: req.query.stderr_offset });
      return {
        stdout: o.stdout.toString('utf8'),
        stderr: o.stderr.toString('utf8'),
        stdout_offset: o.stdoutOffset,
        stderr_offset: o.stderrOffset,
        dropped_bytes: o.dropped,
        exit_code: o.exit ? (o.exit.signal ? 128 + o.exit.signal : o.exit.code) : null,
      };
    });

    app.post('/instances/:id/processes/:process_id/signal', {
      schema: {
        operationId: 'signalProcess',
        tags,
        summary: 'Send a signal to the process group',
        description: 'Any signal 1-64 (default SIGTERM) to the process\'s whole group.',
        params: ProcessParams,
        body: SignalRequest,
        response: { 204: noContent('Sent'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.executions.signal(req.owner, req.params.id, execIdOf(req.params.process_id), req.body.signal);
      return reply.code(204).send(null);
    });

    app.delete('/instances/:id/processes/:process_id', {
      schema: {
        operationId: 'deleteProcess',
        tags,
        summary: 'Kill (if running) and forget a process',
        description: 'SIGKILL to its process group if it still runs; then its record and scrollback are dropped.',
        params: ProcessParams,
        response: { 204: noContent('Gone'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.executions.remove(req.owner, req.params.id, execIdOf(req.params.process_id));
      return reply.code(204).send(null);
    });
  };
