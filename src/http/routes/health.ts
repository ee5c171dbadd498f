import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { Health } from '../schemas.js';

export const healthRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    app.get('/healthz', {
      config: { public: true },
      schema: { tags: ['health'], summary: 'Version and whether the engine parts are present (no token needed)', response: { 200: Health } },
    }, async () => fp.health());
  };
