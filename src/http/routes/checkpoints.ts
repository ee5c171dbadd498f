import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { InstanceRecord } from '../../store/instances.js';
import {
  Checkpoint, CheckpointPage, CheckpointParams, CreateCheckpointRequest, errorResponses, ForkRequest, ForkResult, IdParams,
  Instance, Lineage, noContent, ok, OPTIONAL_BODY, optionalBody, PageQuery, RollbackRequest, WaitQuery,
} from '../schemas/index.js';
import type { CheckpointRecord } from '../../store/checkpoints.js';
import { checkpointView as baseView, instanceView as viewOf } from '../views.js';

const WAIT_MS = 120_000;

export const checkpointRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const checkpointView = async (c: CheckpointRecord) => baseView(c, await fp.durable.state(c.id));
    // Up to WAIT_MS, and no longer than the client waits.
    const waited = (req: { owner: string; clientGone: AbortSignal }, id: string, checkpointId: string, how: true | 'durable') => {
      const signal = AbortSignal.any([req.clientGone, AbortSignal.timeout(WAIT_MS)]);
      return how === 'durable' ? fp.checkpoints.waitDurable(req.owner, id, checkpointId, signal, fp.durable) : fp.checkpoints.wait(req.owner, id, checkpointId, signal);
    };
    const instanceView = (r: InstanceRecord) => viewOf(r, fp.instances.networkCounters(r));
    const tags = ['checkpoints'];
    app.post('/instances/:id/checkpoints', {
      schema: {
        operationId: 'createCheckpoint',
        tags,
        summary: 'Take a checkpoint',
        description:
          'Answers 202 with status `processing`; the work runs in the job queue (one at a time per instance). ' +
          'The instance pauses for the dump and runs on; the checkpoint becomes `ready` once its layer is on disk, or `failed` with `error` (the instance runs on as before). ' +
          'With `?wait=true` the answer (200) comes when it is no longer processing; with `?wait=durable`, once it is also in the object store (`durable: true`; 409 without an object store). The body may be left out.',
        params: IdParams,
        querystring: WaitQuery,
        body: optionalBody(CreateCheckpointRequest),
        ...OPTIONAL_BODY,
        response: {
          200: ok('With wait=true: the checkpoint, ready or failed', Checkpoint),
          202: ok('The checkpoint, processing', Checkpoint),
          ...errorResponses,
        },
      },
    }, async (req, reply) => {
      const b = req.body ?? {};
      const { checkpoint } = await fp.checkpoints.create(req.owner, req.params.id, { label: b.label, memory: b.memory, retention: b.retention });
      if (!req.query.wait) return reply.code(202).send(await checkpointView(checkpoint));
      return reply.code(200).send(await checkpointView(await waited(req, req.params.id, checkpoint.id, req.query.wait)));
    });

    app.get('/instances/:id/checkpoints', {
      schema: {
        operationId: 'listCheckpoints',
        tags,
        summary: 'List checkpoints, newest first',
        description: 'A page at a time, with their status, sizes and pause. `next_cursor` pages on.',
        params: IdParams,
        querystring: PageQuery,
        response: { 200: ok('A page of checkpoints', CheckpointPage), ...errorResponses },
      },
    }, async (req) => {
      const page = await fp.checkpoints.list(req.owner, req.params.id, req.query.limit, req.query.cursor);
      return { items: await Promise.all(page.items.map((c) => checkpointView(c))), next_cursor: page.nextCursor };
    });

    app.get('/instances/:id/checkpoints/:checkpoint_id', {
      schema: {
        operationId: 'getCheckpoint',
        tags,
        summary: 'Get a checkpoint',
        description: 'With `?wait=true`, once it is no longer processing; with `?wait=durable`, once it is in the object store too.',
        params: CheckpointParams,
        querystring: WaitQuery,
        response: { 200: ok('The checkpoint', Checkpoint), ...errorResponses },
      },
    }, async (req) => {
      const c = req.query.wait
        ? await waited(req, req.params.id, req.params.checkpoint_id, req.query.wait)
        : await fp.checkpoints.get(req.owner, req.params.id, req.params.checkpoint_id);
      return checkpointView(c);
    });

    app.delete('/instances/:id/checkpoints/:checkpoint_id', {
      schema: {
        operationId: 'deleteCheckpoint',
        tags,
        summary: 'Delete a checkpoint',
        description:
          '409 while it is processing or being forked from. Layers it shares with the instance, other checkpoints or forks stay until nothing stands on them. ' +
          'Its children point at its parent from then on.',
        params: CheckpointParams,
        response: { 204: noContent('Deleted'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.checkpoints.delete(req.owner, req.params.id, req.params.checkpoint_id);
      return reply.code(204).send(null);
    });

    app.post('/instances/:id/rollback', {
      schema: {
        operationId: 'rollbackInstance',
        tags,
        summary: 'Roll the instance back to one of its checkpoints, in place',
        description: 'Files return to exactly the checkpoint; a memory checkpoint also brings back its processes, a files-only one boots fresh on that disk. Commands running at the time are lost (their calls answer 409).',
        params: IdParams,
        body: RollbackRequest,
        response: { 200: ok('The instance, running on the checkpoint', Instance), ...errorResponses },
      },
    }, async (req) => instanceView(await fp.checkpoints.rollback(req.owner, req.params.id, req.body.checkpoint_id)));

    app.post('/instances/:id/fork', {
      config: { placement: 'fork' },
      schema: {
        operationId: 'forkInstance',
        tags,
        summary: 'Fork new instances from a checkpoint (or from now)',
        description:
          'Each fork gets its own namespaces and upper over the checkpoint\'s shared layers. Without `checkpoint_id`, an implicit checkpoint (label "fork") is taken first; a checkpoint still processing is waited for. ' +
          'Without `count` the answer is the new instance itself; with it, `{instances: [...]}` (with `name` as a prefix: name-1, name-2, ...). All or nothing: if one fork fails the others are removed. The body may be left out.',
        params: IdParams,
        body: optionalBody(ForkRequest),
        ...OPTIONAL_BODY,
        response: { 201: ok('The new instance, or with count the new instances', z.union([Instance, ForkResult])), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body ?? {};
      const made = await fp.checkpoints.fork(req.owner, req.params.id, { name: b.name, checkpointId: b.checkpoint_id, count: b.count, env: b.env, volumes: b.volumes });
      return reply.code(201).send(b.count === undefined ? instanceView(made[0]!) : { instances: made.map((r) => instanceView(r)) });
    });

    app.get('/instances/:id/lineage', {
      schema: {
        operationId: 'getLineage',
        tags,
        summary: 'The tree below an instance: checkpoints by parent, and the forks of each',
        description: 'Each checkpoint under the one it followed; each fork (and its own checkpoints and forks) under the checkpoint it came from.',
        params: IdParams,
        response: { 200: ok('The tree', Lineage), ...errorResponses },
      },
    }, async (req) => fp.checkpoints.lineage(req.owner, req.params.id));
  };
