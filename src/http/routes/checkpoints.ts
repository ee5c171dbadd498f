import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import {
  Checkpoint, CheckpointPage, CheckpointParams, CreateCheckpointBody, errorResponses, ForkBody, ForkResult, IdParams,
  Instance, Lineage, PageQuery, RollbackBody, WaitQuery,
} from '../schemas.js';
import { checkpointView, instanceView } from '../views.js';

const WAIT_MS = 120_000;

export const checkpointRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['checkpoints'];
    app.post('/instances/:id/checkpoints', {
      schema: {
        tags,
        summary: 'Take a checkpoint',
        description:
          'Answers 202 with status `processing`; the work runs in the job queue (one at a time per instance). ' +
          'The instance pauses for the dump and runs on; the checkpoint becomes `ready` once its layer is on disk, or `failed` with `error` (the instance runs on as before). ' +
          'With `?wait=true` the answer comes when it is no longer processing.',
        params: IdParams,
        querystring: WaitQuery,
        body: CreateCheckpointBody,
        response: { 200: Checkpoint, 202: Checkpoint, ...errorResponses },
      },
    }, async (req, reply) => {
      const { checkpoint } = fp.checkpoints.create(req.owner, req.params.id, {
        label: req.body.label, memory: req.body.memory, retention: req.body.retention,
      });
      if (!req.query.wait) return reply.code(202).send(checkpointView(checkpoint));
      return reply.code(200).send(checkpointView(await fp.checkpoints.wait(req.owner, req.params.id, checkpoint.id, WAIT_MS)));
    });

    app.get('/instances/:id/checkpoints', {
      schema: { tags, summary: 'List checkpoints, newest first', params: IdParams, querystring: PageQuery, response: { 200: CheckpointPage, ...errorResponses } },
    }, async (req) => {
      const page = fp.checkpoints.list(req.owner, req.params.id, req.query.limit, req.query.cursor);
      return { items: page.items.map(checkpointView), next_cursor: page.nextCursor };
    });

    app.get('/instances/:id/checkpoints/:checkpoint_id', {
      schema: { tags, summary: 'Get a checkpoint (`?wait=true`: once not processing)', params: CheckpointParams, querystring: WaitQuery, response: { 200: Checkpoint, ...errorResponses } },
    }, async (req) => {
      const c = req.query.wait
        ? await fp.checkpoints.wait(req.owner, req.params.id, req.params.checkpoint_id, WAIT_MS)
        : fp.checkpoints.get(req.owner, req.params.id, req.params.checkpoint_id);
      return checkpointView(c);
    });

    app.delete('/instances/:id/checkpoints/:checkpoint_id', {
      schema: {
        tags,
        summary: 'Delete a checkpoint',
        description: '409 while processing. Layers it shares with the instance, other checkpoints or forks stay until nothing stands on them.',
        params: CheckpointParams,
        response: { 204: z.null(), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.checkpoints.delete(req.owner, req.params.id, req.params.checkpoint_id);
      return reply.code(204).send(null);
    });

    app.post('/instances/:id/rollback', {
      schema: {
        tags,
        summary: 'Roll the instance back to one of its checkpoints, in place',
        description: 'Files return to exactly the checkpoint; a memory checkpoint also brings back its processes, a files-only one boots fresh on that disk. Commands running at the time are lost (their calls answer 409).',
        params: IdParams,
        body: RollbackBody,
        response: { 200: Instance, ...errorResponses },
      },
    }, async (req) => instanceView(await fp.checkpoints.rollback(req.owner, req.params.id, req.body.checkpoint_id)));

    app.post('/instances/:id/fork', {
      schema: {
        tags,
        summary: 'Fork new instances from a checkpoint (or from now)',
        description: 'Each fork gets its own namespaces and upper over the checkpoint\'s shared layers. Without `checkpoint_id`, an implicit checkpoint (label "fork") is taken first. A checkpoint still processing is waited for.',
        params: IdParams,
        body: ForkBody,
        response: { 201: ForkResult, ...errorResponses },
      },
    }, async (req, reply) => {
      const made = await fp.checkpoints.fork(req.owner, req.params.id, { name: req.body.name, checkpointId: req.body.checkpoint_id, count: req.body.count });
      return reply.code(201).send({ instances: made.map(instanceView) });
    });

    app.get('/instances/:id/lineage', {
      schema: { tags, summary: 'The tree below an instance: checkpoints by parent, and forks of each', params: IdParams, response: { 200: Lineage, ...errorResponses } },
    }, async (req) => fp.checkpoints.lineage(req.owner, req.params.id));
  };
