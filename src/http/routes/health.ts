import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { errorResponses, ok } from '../schemas/common.js';
import { Health } from '../schemas/health.js';

export const healthRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    app.get('/healthz', {
      config: { scope: 'public' },
      schema: {
        operationId: 'getHealth',
        tags: ['health'],
        summary: 'Version, and whether the engine\'s parts are there',
        description: 'Needs no token.',
        security: [],
        response: { 200: ok('The server and its engine', Health), 500: errorResponses[500] },
      },
    }, async () => fp.health());
  };
