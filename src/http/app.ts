import { mcpRoutes } from './routes/mcp.js';
import { consoleRoutes } from './console.js';
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import { serializerCompiler, validatorCompiler } from 'fastify-type-provider-zod';
import type { Logger } from 'pino';
import { MAX_EXEC_TIMEOUT_MS } from '../core/commands.js';
import type { Forkpoint } from '../core/forkpoint.js';
import websocket from '@fastify/websocket';
import replyFrom from '@fastify/reply-from';
import { installAuth, redactUrl } from './auth.js';
import { installClusterRouting } from './cluster-routing.js';
import { e2bSdkConstraint } from './e2b/sdk-constraint.js';
import { ENVD_PORT, envdHostSandbox } from './e2b/caller.js';
import { e2bFace, e2bPortRoute } from './e2b/index.js';
import { installBodyParsers } from './body-parsers.js';
import { installClientGone } from './client-gone.js';
import { ForwardAgent } from './forward-agent.js';
import { installErrorHandling } from './errors.js';
import { serverUrl, swaggerOptions, type OpenApiVersion } from './openapi.js';
import { healthRoutes } from './routes/health.js';
import { firecaseFace } from './routes/index.js';
import { hostRoute, previewSourceFor } from './routes/proxy.js';
import { openComputerRoutes } from './opencomputer/routes.js';
import { closeStreams } from './streams/sse.js';
import { httpServerOptions, installConnectionLimits, type ConnectionLimits } from './connection-limits.js';

export interface AppOptions {
  forkpoint: Forkpoint;
  logger: Logger | false;
  bodyLimitBytes: number;
  /** The document's rendition (3.1 unless asked otherwise; see openapi.ts). */
  openapi?: OpenApiVersion;
}

/** The largest WebSocket message a client may send (stdin); larger ones close the socket. */
const WS_MAX_MESSAGE = 1 << 20;

/** Request logs without tokens (a WebSocket may carry one in its query). */
function withRequestSerializers(log: Logger): FastifyBaseLogger {
  return log.child({}, {
    serializers: {
      req: (req: { method?: string; url?: string; hostname?: string; ip?: string }) => ({ method: req.method, url: redactUrl(req.url ?? ''), host: req.hostname, remoteAddress: req.ip }),
    },
  }) as FastifyBaseLogger;
}

/** How long a closing server waits for the answers under way before it cuts their connections. */
const CLOSE_GRACE_MS = 5000;

/** The HTTP server: config in, Fastify instance out. Nothing here touches the engine. */
export async function buildApp(opts: AppOptions): Promise<FastifyInstance> {
  const domain = opts.forkpoint.config.previewDomain;
  const limits: ConnectionLimits = {
    headersTimeoutMs: opts.forkpoint.config.httpHeadersTimeoutMs,
    bodyStallMs: opts.forkpoint.config.httpBodyStallMs,
    perClient: opts.forkpoint.config.httpConnectionsPerClient,
  };
  const base = {
    bodyLimit: opts.bodyLimitBytes,
    http: httpServerOptions(limits),
    routerOptions: { ignoreTrailingSlash: true, constraints: { e2bSdk: e2bSdkConstraint } },
    // A preview host name (<port>-<instance>.<domain>) is that port's proxy, at its root.
    rewriteUrl: (req: { url?: string; headers: Record<string, string | string[] | undefined> }) => {
      const to = hostRoute(domain, req.headers.host as string | undefined) ?? e2bPortRoute(req.headers);
      // envd's own host name is envd's routes (E2B's SDKs' signed file URLs come by it).
      return to && to.port !== ENVD_PORT ? `/instances/${to.id}/ports/${to.port}${req.url ?? '/'}` : (req.url ?? '/');
    },
  };
  const app: FastifyInstance = opts.logger ? Fastify({ ...base, loggerInstance: withRequestSerializers(opts.logger) }) : Fastify({ ...base, logger: false });
  const stopLimits = installConnectionLimits(app.server, limits);
  app.addHook('onClose', async () => stopLimits());
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  installBodyParsers(app);
  installErrorHandling(app);
  installClientGone(app);
  // Upgrades are routed as GETs through the hooks (a bad token is a plain 401). The plugin's
  // own hooks come first: they close the socket of an upgrade that was answered, not upgraded.
  await app.register(websocket, { options: { maxPayload: WS_MAX_MESSAGE } });
  installAuth(app, opts.forkpoint.credentials, previewSourceFor(domain), (host) => envdHostSandbox(domain, host));
  // Streams to other nodes and to ports inside instances; no deadline on bodies (streams).
  // A forwarded call is answered when its node has done it: a command run and waited for may take
  // its whole timeout. A node that vanishes meanwhile is found by TCP keep-alive (undici's
  // default); streams (bodyTimeout) may be quiet for as long as their clients keep them open.
  // Forwards to other nodes: a call in flight to a node judged lost ends then, not by keep-alive.
  const forwards = new ForwardAgent({ headersTimeout: MAX_EXEC_TIMEOUT_MS + 60_000, bodyTimeout: 0 });
  opts.forkpoint.cluster.whenNodeLost((node) => forwards.cut(node.url, node.id));
  await app.register(replyFrom, { undici: forwards });
  installClusterRouting(app, opts.forkpoint);
  app.addHook('preClose', async () => closeStreams(app.server));
  // Node closes the connections that are idle when the server closes; one whose answer ends
  // later would hold the close for its keep-alive time (72 s), and one a client left with half a
  // request (an aborted fetch can) for the headers timeout: each goes as it becomes idle, and
  // whatever is left after CLOSE_GRACE_MS is cut (a command in a sandbox runs on regardless).
  let idleSweep: NodeJS.Timeout | undefined;
  let cutOff: NodeJS.Timeout | undefined;
  app.addHook('preClose', async () => {
    idleSweep = setInterval(() => app.server.closeIdleConnections(), 100);
    cutOff = setTimeout(() => app.server.closeAllConnections(), CLOSE_GRACE_MS);
    idleSweep.unref();
    cutOff.unref();
  });
  app.addHook('onClose', async () => {
    clearInterval(idleSweep);
    clearTimeout(cutOff);
  });
  // By the route's pattern, not its URL: ids would make every request a series of its own.
  app.addHook('onResponse', async (request, reply) => {
    opts.forkpoint.metrics.observeRequest(request.method, request.routeOptions.url ?? 'unmatched', reply.statusCode, reply.elapsedTime / 1000);
  });
  // The plugin leaves WebSocket routes out of the document; ours are part of the contract.
  app.addHook('onRoute', (route) => {
    if (route.websocket && route.schema) route.schema = { ...route.schema, hide: false };
  });

  const fp = opts.forkpoint;
  const openapi = opts.openapi ?? '3.1.0';
  await app.register(swagger, swaggerOptions({ version: fp.version, openapi, host: fp.config.host, port: fp.config.port }));
  // Swagger UI's own routes need no token; the hook must exist before they are added.
  app.addHook('onRoute', (route) => {
    if (route.url.startsWith('/docs')) route.config = { ...(route.config as object), scope: 'public' };
  });
  await app.register(swaggerUi, { routePrefix: '/docs', uiConfig: { docExpansion: 'list' } });
  // Served with the address the server is bound to (the configured port may be 0: any).
  const here = (doc: unknown) => {
    const addr = app.server.address();
    if (!addr || typeof addr === 'string') return doc;
    return { ...(doc as object), servers: [{ url: serverUrl(fp.config.host, addr.port), description: 'this server' }] };
  };
  app.get('/openapi.json', { config: { scope: 'public' }, schema: { hide: true } }, async () => here(app.swagger()));
  // The 3.0 rendition comes from the same routes, registered once more in a server of its own.
  let v30: Promise<unknown> | undefined;
  app.get('/openapi-3.0.json', { config: { scope: 'public' }, schema: { hide: true } }, async () => {
    v30 ??= openApiDocument(fp, '3.0.3');
    return here(await v30);
  });

  await app.register(healthRoutes(fp));
  await app.register(firecaseFace(fp, { documented: true }));
  await app.register(firecaseFace(fp, { documented: false }), { prefix: '/v1' });
  await app.register(openComputerRoutes(fp), { prefix: '/api' });
  await app.register(e2bFace(fp));
  // Agents: forkpoint's tools over MCP, calling the faces above in process.
  await app.register(mcpRoutes);
  // People: the web console, a page over the same API.
  await app.register(consoleRoutes);
  return app;
}

/** The OpenAPI document of these routes, in the rendition asked for. */
export async function openApiDocument(fp: Forkpoint, openapi: OpenApiVersion): Promise<unknown> {
  const app = await buildApp({ forkpoint: fp, logger: false, bodyLimitBytes: fp.config.bodyLimitBytes, openapi });
  await app.ready();
  const doc = app.swagger();
  await app.close();
  return doc;
}
