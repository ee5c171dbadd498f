import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { CheckpointRecord } from '../../store/checkpoints.js';
import type { InstanceRecord } from '../../store/instances.js';
import { sendWithOutputs } from '../output-json.js';
import { errorResponses } from '../schemas.js';
import {
  CheckpointInfo, CheckpointOnlyParams, CreateCheckpointBody, CreateSandboxBody, EntryInfo, FromCheckpointBody,
  PathQuery, RunBody, RunResult, SandboxCheckpointParams, SandboxData, SandboxParams,
} from './schemas.js';

const STATUS: Record<InstanceRecord['status'], string> = { starting: 'creating', running: 'running', stopped: 'hibernated', error: 'error' };

const sandboxView = (r: InstanceRecord) => ({
  sandboxID: r.id,
  status: STATUS[r.status],
  templateID: r.image,
  alias: r.name,
  envs: r.env,
  metadata: r.metadata,
  cpuCount: Math.max(1, Math.round(r.limits.cpuPercent / 100)),
  memoryMB: r.limits.memoryMb,
  startedAt: r.createdAt,
  // Everything goes through this server; no direct worker URL or token.
  connectURL: '',
  token: '',
  sandboxDomain: '',
});

const checkpointView = (c: CheckpointRecord) => ({
  id: c.id,
  sandboxId: c.instanceId,
  orgId: c.owner,
  name: c.label ?? '',
  sandboxConfig: { memory: c.memory, parentId: c.parentId },
  status: c.status,
  sizeBytes: (c.deltaBytes ?? 0) + (c.memoryBytes ?? 0),
  createdAt: c.createdAt,
});

/** `/api/...`, so that the published `@opencomputer/sdk` works against forkpoint unchanged.
 * Same core, same auth (its `X-API-Key` header), same error envelope as the other face. */
export const openComputerRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['opencomputer'];
    // The SDK posts `Content-Type: application/json` with no body on some calls.
    app.removeContentTypeParser('application/json');
    app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, body, done) => {
      const text = String(body).trim();
      if (!text) return done(null, {});
      try {
        done(null, JSON.parse(text));
      } catch (err) {
        done(Object.assign(err as Error, { statusCode: 400, code: 'FST_ERR_CTP_INVALID_JSON_BODY' }), undefined);
      }
    });

    app.post('/sandboxes', {
      schema: { tags, summary: 'Create a sandbox', body: CreateSandboxBody, response: { 201: SandboxData, ...errorResponses } },
    }, async (req, reply) => {
      const b = req.body;
      const image = !b.templateID || b.templateID === 'base' ? undefined : b.templateID;
      const rec = await fp.instances.create(req.owner, {
        image,
        env: b.envs,
        metadata: b.metadata,
        limits: { memoryMb: b.memoryMB, cpuPercent: b.cpuCount ? b.cpuCount * 100 : undefined },
      });
      return reply.code(201).send(sandboxView(rec));
    });

    app.get('/sandboxes', {
      schema: { tags, summary: 'List sandboxes', response: { 200: z.array(SandboxData), ...errorResponses } },
    }, async (req) => fp.instances.list(req.owner, 500).items.map(sandboxView));

    app.get('/sandboxes/:id', {
      schema: { tags, summary: 'Get a sandbox', params: SandboxParams, response: { 200: SandboxData, ...errorResponses } },
    }, async (req) => sandboxView(fp.instances.get(req.owner, req.params.id)));

    app.delete('/sandboxes/:id', {
      schema: { tags, summary: 'Kill a sandbox', params: SandboxParams, response: { 204: z.null(), ...errorResponses } },
    }, async (req, reply) => {
      await fp.instances.delete(req.owner, req.params.id, (id) => fp.checkpoints.deleteAllOf(id));
      return reply.code(204).send(null);
    });

    app.post('/sandboxes/:id/hibernate', {
      schema: { tags, summary: 'Stop the sandbox, keeping its disk', params: SandboxParams, response: { 200: SandboxData, ...errorResponses } },
    }, async (req) => sandboxView(await fp.instances.stop(req.owner, req.params.id)));

    app.post('/sandboxes/:id/wake', {
      schema: { tags, summary: 'Boot a stopped sandbox again', params: SandboxParams, response: { 200: SandboxData, ...errorResponses } },
    }, async (req) => sandboxView(await fp.instances.start(req.owner, req.params.id)));

    app.post('/sandboxes/:id/exec/run', {
      schema: { tags, summary: 'Run a command and wait for it', params: SandboxParams, body: RunBody, response: { 200: RunResult, ...errorResponses } },
    }, async (req, reply) => {
      const b = req.body;
      const r = await fp.instances.exec(req.owner, req.params.id, {
        command: [b.cmd, ...(b.args ?? [])],
        env: b.envs,
        cwd: b.cwd,
        timeoutMs: b.timeout ? Math.round(b.timeout * 1000) : undefined,
      });
      return sendWithOutputs(reply, [['exitCode', r.exitCode], ['stdout', r.stdout], ['stderr', r.stderr]], 'utf8');
    });

    app.post('/sandboxes/:id/checkpoints', {
      schema: { tags, summary: 'Take a checkpoint (memory and files)', params: SandboxParams, body: CreateCheckpointBody, response: { 201: CheckpointInfo, ...errorResponses } },
    }, async (req, reply) => {
      const { checkpoint } = fp.checkpoints.create(req.owner, req.params.id, { label: req.body.name, memory: true });
      return reply.code(201).send(checkpointView(checkpoint));
    });

    app.get('/sandboxes/:id/checkpoints', {
      schema: { tags, summary: 'List checkpoints', params: SandboxParams, response: { 200: z.array(CheckpointInfo), ...errorResponses } },
    }, async (req) => fp.checkpoints.list(req.owner, req.params.id, 500).items.map(checkpointView));

    app.post('/sandboxes/:id/checkpoints/:checkpointId/restore', {
      schema: { tags, summary: 'Roll the sandbox back to a checkpoint', params: SandboxCheckpointParams, response: { 200: SandboxData, ...errorResponses } },
    }, async (req) => sandboxView(await fp.checkpoints.rollback(req.owner, req.params.id, req.params.checkpointId)));

    app.delete('/sandboxes/:id/checkpoints/:checkpointId', {
      schema: { tags, summary: 'Delete a checkpoint', params: SandboxCheckpointParams, response: { 204: z.null(), ...errorResponses } },
    }, async (req, reply) => {
      await fp.checkpoints.delete(req.owner, req.params.id, req.params.checkpointId);
      return reply.code(204).send(null);
    });

    app.post('/sandboxes/from-checkpoint/:checkpointId', {
      schema: { tags, summary: 'A new sandbox from a checkpoint (a fork)', params: CheckpointOnlyParams, body: FromCheckpointBody, response: { 201: SandboxData, ...errorResponses } },
    }, async (req, reply) => {
      const c = fp.checkpoints.find(req.owner, req.params.checkpointId);
      const [rec] = await fp.checkpoints.fork(req.owner, c.instanceId, { checkpointId: c.id });
      return reply.code(201).send(sandboxView(rec!));
    });

    await app.register(fileRoutes(fp));
  };

const fileRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['opencomputer'];
    // File bodies are raw bytes whatever their content type.
    app.removeAllContentTypeParsers();
    app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));

    app.get('/sandboxes/:id/files', {
      schema: { tags, summary: 'Read a file', params: SandboxParams, querystring: PathQuery },
    }, async (req, reply) => reply.type('application/octet-stream').send(await fp.files.read(req.owner, req.params.id, req.query.path)));

    app.put('/sandboxes/:id/files', {
      schema: { tags, summary: 'Write a file (the raw body), making parent directories', params: SandboxParams, querystring: PathQuery, response: { 204: z.null(), ...errorResponses } },
    }, async (req, reply) => {
      const body = Buffer.isBuffer(req.body) ? req.body : Buffer.from(typeof req.body === 'string' ? req.body : '');
      await fp.files.write(req.owner, req.params.id, req.query.path, body);
      return reply.code(204).send(null);
    });

    app.delete('/sandboxes/:id/files', {
      schema: { tags, summary: 'Remove a file or an empty directory', params: SandboxParams, querystring: PathQuery, response: { 204: z.null(), ...errorResponses } },
    }, async (req, reply) => {
      await fp.files.remove(req.owner, req.params.id, req.query.path);
      return reply.code(204).send(null);
    });

    app.get('/sandboxes/:id/files/list', {
      schema: { tags, summary: 'List a directory', params: SandboxParams, querystring: PathQuery, response: { 200: z.array(EntryInfo), ...errorResponses } },
    }, async (req) => {
      const base = req.query.path.replace(/\/+$/, '');
      return (await fp.files.list(req.owner, req.params.id, req.query.path)).map((e) => ({
        name: e.name,
        isDir: e.type === 'dir',
        path: `${base}/${e.name}`,
        size: e.size,
      }));
    });

    app.post('/sandboxes/:id/files/mkdir', {
      schema: { tags, summary: 'Make a directory and its parents', params: SandboxParams, querystring: PathQuery, response: { 204: z.null(), ...errorResponses } },
    }, async (req, reply) => {
      await fp.files.mkdir(req.owner, req.params.id, req.query.path);
      return reply.code(204).send(null);
    });
  };
