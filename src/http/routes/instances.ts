import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { ConflictError, InvalidRequestError } from '../../core/errors.js';
import type { InstanceRecord } from '../../store/instances.js';
import {
  CreateInstanceRequest, DrainResult, errorResponses, IdParams, Instance, InstancePage, InstanceUsage, NodeList, noContent, ok, OPTIONAL_BODY, optionalBody, PageQuery, UpdateInstanceRequest,
} from '../schemas/index.js';
import { instanceView as viewOf } from '../views.js';

const limitsIn = (l: z.infer<typeof CreateInstanceRequest>['limits']) =>
  l && { memoryMb: l.memory_mb, pids: l.pids, cpuPercent: l.cpu_percent, diskMb: l.disk_mb };

export const instanceRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const instanceView = (r: InstanceRecord) => viewOf(r, fp.instances.networkCounters(r));
    const tags = ['instances'];
    app.post('/instances', {
      config: { placement: 'new' },
      schema: {
        operationId: 'createInstance',
        tags,
        summary: 'Create and start an instance',
        description: 'Boots a sandbox on the image (the default one without `image`) and answers once it runs. Every field is optional; so is the body.',
        body: optionalBody(CreateInstanceRequest),
        ...OPTIONAL_BODY,
        response: { 201: ok('The instance, running', Instance), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body ?? {};
      const input = {
        name: b.name, image: b.image, env: b.env, limits: limitsIn(b.limits), metadata: b.metadata, maxCheckpoints: b.max_checkpoints, idleTimeoutS: b.idle_timeout_s,
        egress: b.network, userNamespace: b.user_namespace, volumes: b.volumes?.map((v) => ({ name: v.name, path: v.path, readOnly: v.read_only })), secrets: b.secrets,
      };
      if (b.template && b.image) throw new InvalidRequestError('give `image` or `template`, not both');
      const rec = b.template ? await fp.templates.instantiate(req.owner, b.template, input) : await fp.instances.create(req.owner, input);
      return reply.code(201).send(instanceView(rec));
    });

    app.post('/instances/:id/recover', {
      config: { placement: 'here' },
      schema: {
        operationId: 'recoverInstance',
        tags,
        summary: 'Bring a lost instance back on this node',
        description:
          'For an instance whose node stopped answering (`lost`): restores it on the node this call reaches from its newest durable checkpoint (files, and with a memory checkpoint its processes). ' +
          'What it did after that checkpoint is gone with its node. 409 if it is not lost or has no durable checkpoint.',
        params: IdParams,
        response: { 200: ok('The instance, running on this node', Instance), ...errorResponses },
      },
    }, async (req) => instanceView(await fp.checkpoints.recoverLost(req.owner, req.params.id)));

    app.get('/nodes', {
      config: { scope: 'operator' },
      schema: {
        operationId: 'listNodes',
        tags,
        summary: 'The nodes sharing this store',
        description: 'Each with where it is reached, its last heartbeat, whether it counts as live, and how many instances it runs. One node with the embedded store. For an operator\'s token only (FORKPOINT_OPERATORS): 403 FORBIDDEN for any other.',
        response: { 200: ok('The nodes', NodeList), ...errorResponses },
      },
    }, async () => ({
      nodes: (await fp.cluster.nodes()).map((n) => ({ id: n.id, url: n.url, started_at: n.startedAt, heartbeat_at: n.heartbeatAt, live: n.live, load: n.load, self: n.self, draining: n.draining })),
    }));

    app.post('/nodes/drain', {
      config: { scope: 'operator' },
      schema: {
        operationId: 'drainNode',
        tags,
        summary: 'Drain the node that answers',
        description:
          'The node stops taking work (`/readyz` 503, no new instance placed on it) and hands its instances over: each gets a durable checkpoint of the moment (with memory when it runs), stops here and is taken over by another node, processes and all. ' +
          'Needs an object store and another live node; without, its instances stay and are re-adopted at its next start. Answers once every instance is handed over or kept. `forkpoint drain` calls it. For an operator\'s token only.',
        response: { 200: ok('What was handed over', DrainResult), ...errorResponses },
      },
    }, async () => {
      const r = await fp.drain();
      return { handed_over: r.handedOver, kept: r.kept, reason: r.reason };
    });

    app.get('/instances', {
      schema: {
        operationId: 'listInstances',
        tags,
        summary: 'List instances, newest first',
        description: 'A page at a time: pass `next_cursor` back as `cursor` until it is null.',
        querystring: PageQuery,
        response: { 200: ok('A page of instances', InstancePage), ...errorResponses },
      },
    }, async (req) => {
      const page = await fp.instances.list(req.owner, req.query.limit, req.query.cursor);
      return { items: page.items.map(instanceView), next_cursor: page.nextCursor };
    });

    app.get('/instances/:id', {
      schema: {
        operationId: 'getInstance',
        tags,
        summary: 'Get an instance',
        description: 'Its status, limits, metadata, and where it came from (for a fork, its source instance and checkpoint). Another owner\'s instance is a 404.',
        params: IdParams,
        response: { 200: ok('The instance', Instance), ...errorResponses },
      },
    }, async (req) => instanceView(await fp.instances.get(req.owner, req.params.id)));

    app.get('/instances/:id/usage', {
      schema: {
        operationId: 'getInstanceUsage',
        tags,
        summary: 'What a running instance uses now',
        description: 'CPU (over a 250 ms reading), memory and disk, beside its limits, read from its cgroups and its disk. 409 when it does not run.',
        params: IdParams,
        response: { 200: ok('The reading', InstanceUsage), ...errorResponses },
      },
    }, async (req) => {
      const u = await fp.instances.usage(req.owner, req.params.id);
      if (!u) throw new ConflictError(`instance ${req.params.id} is not running`, { reason: 'NOT_RUNNING' });
      return {
        at: u.at.toISOString(),
        cpu_count: u.cpuCount,
        cpu_used_percent: Math.round(u.cpuUsedPercent * 100) / 100,
        memory_bytes: u.memoryBytes,
        memory_limit_bytes: u.memoryLimitBytes,
        disk_bytes: u.diskBytes,
        disk_total_bytes: u.diskTotalBytes,
      };
    });

    app.patch('/instances/:id', {
      schema: {
        operationId: 'updateInstance',
        tags,
        summary: 'Rename an instance, replace its metadata, set its idle timeout or its network policy',
        description: 'A new name becomes the hostname at the next boot or fork; a running sandbox keeps its hostname.',
        params: IdParams,
        body: UpdateInstanceRequest,
        response: { 200: ok('The instance, updated', Instance), ...errorResponses },
      },
    }, async (req) => {
      const { name, metadata, idle_timeout_s: idle, network } = req.body;
      if (idle !== undefined) await fp.instances.setIdleTimeout(req.owner, req.params.id, idle);
      if (network) await fp.instances.setEgress(req.owner, req.params.id, network);
      return instanceView(await fp.instances.update(req.owner, req.params.id, { name, metadata }));
    });

    app.delete('/instances/:id', {
      schema: {
        operationId: 'deleteInstance',
        tags,
        summary: 'Delete an instance, its disk and its checkpoints',
        description:
          'Processes and mounts are gone when this returns. Forks of its checkpoints keep running: they hold their own references to the layers they stand on. ' +
          'A checkpoint being forked from is waited for (409 if that takes too long).',
        params: IdParams,
        response: { 204: noContent('Deleted'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.deleteInstance(req.owner, req.params.id);
      return reply.code(204).send(null);
    });

    app.post('/instances/:id/hibernate', {
      schema: {
        operationId: 'hibernateInstance',
        tags,
        summary: 'Hibernate: memory to disk, RAM freed',
        description:
          'A memory checkpoint of its own: the sandbox\'s memory, processes, sessions and terminals go to an image and its changes into a layer; then its processes are gone and its RAM is freed. ' +
          '`wake` (or any call that needs it running: exec, files, attach, checkpoint) restores it exactly as it was. Hibernating a hibernated instance is no error.',
        params: IdParams,
        response: { 200: ok('The instance, hibernated', Instance), ...errorResponses },
      },
    }, async (req) => instanceView(await fp.instances.hibernate(req.owner, req.params.id)));

    app.post('/instances/:id/wake', {
      schema: {
        operationId: 'wakeInstance',
        tags,
        summary: 'Wake a hibernated instance',
        description: 'Restores it exactly as it was hibernated: memory, processes, shell variables, running loops. Waking a running instance is no error.',
        params: IdParams,
        response: { 200: ok('The instance, running', Instance), ...errorResponses },
      },
    }, async (req) => instanceView(await fp.instances.wake(req.owner, req.params.id)));

    const stop = async (owner: string, id: string) => instanceView(await fp.instances.stop(owner, id));
    const start = async (owner: string, id: string) => instanceView(await fp.instances.start(owner, id));
    const stopDoc = {
      tags,
      summary: 'Stop the sandbox; the disk is kept',
      description: 'Its processes end and its memory is freed; its files and checkpoints stay. Calls on it answer 409 until it is started again.',
      params: IdParams,
      response: { 200: ok('The instance, stopped', Instance), ...errorResponses },
    };
    const startDoc = {
      tags,
      summary: 'Boot a stopped instance again on its disk',
      description: 'A fresh boot: processes do not come back (roll back to a memory checkpoint for that). The instance gets the newest agent.',
      params: IdParams,
      response: { 200: ok('The instance, running', Instance), ...errorResponses },
    };
    app.post('/instances/:id/stop', { schema: { operationId: 'stopInstance', ...stopDoc } }, async (req) => stop(req.owner, req.params.id));
    app.post('/instances/:id/start', { schema: { operationId: 'startInstance', ...startDoc } }, async (req) => start(req.owner, req.params.id));
    // Firecase's spelling of the same: the instance's VM.
    app.post('/instances/:id/vm', { schema: { operationId: 'startInstanceVm', ...startDoc, summary: 'Start the instance (as POST /start)' } }, async (req) => start(req.owner, req.params.id));
    app.delete('/instances/:id/vm', { schema: { operationId: 'stopInstanceVm', ...stopDoc, summary: 'Stop the instance (as POST /stop)' } }, async (req) => stop(req.owner, req.params.id));
  };
