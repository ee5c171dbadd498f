import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { errorResponses, ok } from '../schemas/common.js';
import { z } from 'zod';
import { Health, Readiness } from '../schemas/health.js';

export const healthRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    app.get('/healthz', {
      config: { scope: 'public' },
      schema: {
        operationId: 'getHealth',
        tags: ['health'],
        summary: 'Version, and whether the engine\'s parts are there',
        description: 'Liveness: the server answers (200 whatever its parts say; `ok` says whether the engine\'s parts are there). Needs no token.',
        security: [],
        response: { 200: ok('The server and its engine', Health), 500: errorResponses[500] },
      },
    }, async () => fp.health());

    app.get('/readyz', {
      config: { scope: 'public' },
      schema: {
        operationId: 'getReadiness',
        tags: ['health'],
        summary: 'Whether this node should be sent work',
        description: 'Readiness: 200 when the engine\'s parts are there, the database and the object store (when configured) answer, and the server is not shutting down; 503 with the same body otherwise. Needs no token.',
        security: [],
        response: { 200: ok('Ready', Readiness), 503: ok('Not ready, and why', Readiness), 500: errorResponses[500] },
      },
    }, async (_req, reply) => {
      const r = await fp.readiness();
      return reply.code(r.ready ? 200 : 503).send(r);
    });

    app.get('/metrics', {
      config: { scope: 'operator' },
      schema: {
        operationId: 'getMetrics',
        tags: ['health'],
        summary: 'Prometheus metrics',
        description: 'In Prometheus\' text format: API requests by route and status, checkpoint pause and ready time, failed checkpoints, rollbacks, forks, wakes, instances of this node by status, the job queue, the durable upload backlog, free disk, and the process\'s own. For an operator\'s token (FORKPOINT_OPERATORS).',
        response: { 200: { description: 'The metrics', content: { 'text/plain': { schema: z.string() } } }, ...errorResponses },
      },
    }, async (_req, reply) => {
      const { contentType, body } = await fp.metrics.text();
      return reply.type(contentType).send(body);
    });
  };
