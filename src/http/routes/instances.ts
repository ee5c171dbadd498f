import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import {
  CreateInstanceBody, errorResponses, ExecBody, ExecResult, IdParams, Instance, InstancePage, OutputQuery,
  PageQuery, ProcessInfo, ProcessOutput, ProcessParams, Session, SessionParams, SignalBody, StartProcessBody,
} from '../schemas.js';
import { sendWithOutputs } from '../output-json.js';
import { execFields, instanceView, processView } from '../views.js';

const limitsIn = (l: z.infer<typeof CreateInstanceBody>['limits']) =>
  l && { memoryMb: l.memory_mb, pids: l.pids, cpuPercent: l.cpu_percent, diskMb: l.disk_mb };

export const instanceRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['instances'];
    app.post('/instances', {
      schema: { tags, summary: 'Create and start an instance', body: CreateInstanceBody, response: { 201: Instance, ...errorResponses } },
    }, async (req, reply) => {
      const b = req.body;
      const rec = await fp.instances.create(req.owner, {
        name: b.name, image: b.image, env: b.env, limits: limitsIn(b.limits), metadata: b.metadata, maxCheckpoints: b.max_checkpoints,
      });
      return reply.code(201).send(instanceView(rec));
    });

    app.get('/instances', {
      schema: { tags, summary: 'List instances, newest first', querystring: PageQuery, response: { 200: InstancePage, ...errorResponses } },
    }, async (req) => {
      const page = fp.instances.list(req.owner, req.query.limit, req.query.cursor);
      return { items: page.items.map(instanceView), next_cursor: page.nextCursor };
    });

    app.get('/instances/:id', {
      schema: { tags, summary: 'Get an instance', params: IdParams, response: { 200: Instance, ...errorResponses } },
    }, async (req) => instanceView(fp.instances.get(req.owner, req.params.id)));

    app.delete('/instances/:id', {
      schema: {
        tags,
        summary: 'Delete an instance, its disk and its checkpoints',
        description: 'Processes and mounts are gone when this returns. Forks of its checkpoints keep running: they hold their own references to the layers they stand on.',
        params: IdParams,
        response: { 204: z.null(), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.instances.delete(req.owner, req.params.id, (id) => fp.checkpoints.deleteAllOf(id));
      return reply.code(204).send(null);
    });

    app.post('/instances/:id/stop', {
      schema: { tags, summary: 'Stop the sandbox; the disk is kept', params: IdParams, response: { 200: Instance, ...errorResponses } },
    }, async (req) => instanceView(await fp.instances.stop(req.owner, req.params.id)));

    app.post('/instances/:id/start', {
      schema: { tags, summary: 'Boot a stopped instance again on its disk', params: IdParams, response: { 200: Instance, ...errorResponses } },
    }, async (req) => instanceView(await fp.instances.start(req.owner, req.params.id)));

    app.post('/instances/:id/exec', {
      schema: {
        tags: ['exec'],
        summary: 'Run a command and wait for it',
        description:
          'Without `session`: the command runs on pipes (stdout and stderr apart) as a new process group, killed whole on timeout. ' +
          'With `session`: it runs in a persistent bash on a PTY inside the sandbox, so `cd`, `export` and background jobs persist; ' +
          'stdout and stderr are still apart. During a checkpoint the call waits; a command running across a checkpoint is carried in the dump and finishes after it. ' +
          'Output past 1 MiB per stream is kept on disk and streamed into the answer, so `max_output_bytes` up to 64 MiB costs the server no more memory; `output_encoding: "base64"` returns it byte for byte.',
        params: IdParams,
        body: ExecBody,
        response: { 200: ExecResult, ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body;
      const r = await fp.instances.exec(req.owner, req.params.id, {
        command: b.command, cwd: b.cwd, env: b.env, timeoutMs: b.timeout_ms, stdin: b.stdin, session: b.session, maxOutputBytes: b.max_output_bytes,
      });
      const encoding = b.output_encoding ?? 'utf8';
      return sendWithOutputs(reply, execFields(r, encoding), encoding);
    });

    app.get('/instances/:id/sessions', {
      schema: { tags: ['exec'], summary: 'List shell sessions', params: IdParams, response: { 200: z.object({ items: z.array(Session) }), ...errorResponses } },
    }, async (req) => ({
      items: (await fp.instances.listSessions(req.owner, req.params.id)).map((s) => ({ name: s.name, process_id: s.processId, running: s.running })),
    }));

    app.delete('/instances/:id/sessions/:name', {
      schema: { tags: ['exec'], summary: 'Close a shell session', params: SessionParams, response: { 204: z.null(), ...errorResponses } },
    }, async (req, reply) => {
      await fp.instances.closeSession(req.owner, req.params.id, req.params.name);
      return reply.code(204).send(null);
    });

    app.post('/instances/:id/processes', {
      schema: {
        tags: ['processes'],
        summary: 'Start a background process',
        description: 'It keeps running with no client attached; its output is kept in a bounded scrollback (256 KiB per stream).',
        params: IdParams,
        body: StartProcessBody,
        response: { 201: z.object({ process_id: z.number(), pid: z.number() }), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body;
      const p = await fp.instances.startProcess(req.owner, req.params.id, { command: b.command, cwd: b.cwd, env: b.env, pty: b.pty });
      return reply.code(201).send({ process_id: p.id, pid: p.pid });
    });

    app.get('/instances/:id/processes', {
      schema: { tags: ['processes'], summary: 'List processes the agent knows', params: IdParams, response: { 200: z.object({ items: z.array(ProcessInfo) }), ...errorResponses } },
    }, async (req) => ({ items: (await fp.instances.listProcesses(req.owner, req.params.id)).map(processView) }));

    app.get('/instances/:id/processes/:process_id', {
      schema: { tags: ['processes'], summary: 'Get a process', params: ProcessParams, response: { 200: ProcessInfo, ...errorResponses } },
    }, async (req) => processView(await fp.instances.processInfo(req.owner, req.params.id, req.params.process_id)));

    app.get('/instances/:id/processes/:process_id/output', {
      schema: { tags: ['processes'], summary: 'Read output from offsets on', params: ProcessParams, querystring: OutputQuery, response: { 200: ProcessOutput, ...errorResponses } },
    }, async (req) => {
      const o = await fp.instances.processOutput(req.owner, req.params.id, req.params.process_id, { stdout: req.query.stdout_offset, stderr: req.query.stderr_offset });
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
      schema: { tags: ['processes'], summary: 'Send a signal to the process group', params: ProcessParams, body: SignalBody, response: { 204: z.null(), ...errorResponses } },
    }, async (req, reply) => {
      await fp.instances.signalProcess(req.owner, req.params.id, req.params.process_id, req.body.signal);
      return reply.code(204).send(null);
    });

    app.delete('/instances/:id/processes/:process_id', {
      schema: { tags: ['processes'], summary: 'Kill (if running) and forget a process', params: ProcessParams, response: { 204: z.null(), ...errorResponses } },
    }, async (req, reply) => {
      await fp.instances.forgetProcess(req.owner, req.params.id, req.params.process_id);
      return reply.code(204).send(null);
    });
  };
