import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import { jsonSchemaTransform, serializerCompiler, validatorCompiler } from 'fastify-type-provider-zod';
import type { Logger } from 'pino';
import type { Forkpoint } from '../core/forkpoint.js';
import { installAuth } from './auth.js';
import { installErrorHandling } from './errors.js';
import { checkpointRoutes } from './routes/checkpoints.js';
import { healthRoutes } from './routes/health.js';
import { instanceRoutes } from './routes/instances.js';
import { openComputerRoutes } from './opencomputer/routes.js';

export interface AppOptions {
  forkpoint: Forkpoint;
  logger: Logger | false;
  bodyLimitBytes: number;
}

/** The HTTP server: config in, Fastify instance out. Nothing here touches the engine. */
export async function buildApp(opts: AppOptions): Promise<FastifyInstance> {
  const base = { bodyLimit: opts.bodyLimitBytes, routerOptions: { ignoreTrailingSlash: true } };
  const app: FastifyInstance = opts.logger ? Fastify({ ...base, loggerInstance: opts.logger as FastifyBaseLogger }) : Fastify({ ...base, logger: false });
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  installErrorHandling(app);
  installAuth(app, opts.forkpoint.store.tokens);

  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'forkpoint',
        version: opts.forkpoint.version,
        description: 'Self-hosted sandboxes with instant checkpoints, rollback and fork. Authenticate with `Authorization: Bearer <token>` or `X-API-Key: <token>`.',
      },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' }, apiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key' } } },
      security: [{ bearer: [] }, { apiKey: [] }],
    },
    transform: jsonSchemaTransform,
  });
  // Swagger UI's own routes need no token; the hook must exist before they are added.
  app.addHook('onRoute', (route) => {
    if (route.url.startsWith('/docs')) route.config = { ...(route.config as object), public: true };
  });
  await app.register(swaggerUi, { routePrefix: '/docs', uiConfig: { docExpansion: 'list' } });
  app.get('/openapi.json', { config: { public: true }, schema: { hide: true } }, async () => app.swagger());

  await app.register(healthRoutes(opts.forkpoint));
  await app.register(instanceRoutes(opts.forkpoint));
  await app.register(checkpointRoutes(opts.forkpoint));
  await app.register(openComputerRoutes(opts.forkpoint), { prefix: '/api' });
  return app;
}
