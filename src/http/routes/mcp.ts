import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { forkpointMcpServer, type RestPort } from '../../mcp/tools.js';

/** The most of a file the read tool hands an agent. */
const MAX_TEXT = 1 << 20;

/** The REST face, called in process (no socket) with the caller's own credential: the tools
 * are checked exactly as that client's calls would be. */
function restOf(app: FastifyInstance, credential: Record<string, string>): RestPort {
  const call = async (method: 'GET' | 'POST' | 'PUT' | 'DELETE', url: string, payload?: string, type?: string) => {
    const r = await app.inject({ method, url, headers: { ...credential, ...(type ? { 'content-type': type } : {}) }, ...(payload !== undefined ? { payload } : {}) });
    if (r.statusCode >= 400) {
      let e: { code?: string; message?: string } | undefined;
      try {
        e = (JSON.parse(r.body) as { error?: { code?: string; message?: string } }).error;
      } catch {
        e = undefined;
      }
      throw new Error(`${e?.code ?? `HTTP_${r.statusCode}`}: ${e?.message ?? r.body.slice(0, 200)}`);
    }
    return r;
  };
  return {
    json: async (method, path, body) => {
      const r = await call(method, path, body !== undefined ? JSON.stringify(body) : undefined, body !== undefined ? 'application/json' : undefined);
      return (r.body ? JSON.parse(r.body) : undefined) as never;
    },
    readText: async (path) => {
      const r = await call('GET', path);
      return r.rawPayload.length > MAX_TEXT ? `${r.rawPayload.subarray(0, MAX_TEXT).toString('utf8')}\n[cut at ${MAX_TEXT} bytes of ${r.rawPayload.length}]` : r.body;
    },
    writeText: async (path, text) => void (await call('PUT', path, text, 'application/octet-stream')),
  };
}

/**
 * `/mcp`: forkpoint's tools for agents over MCP's streamable HTTP, stateless (a server and a
 * transport per request), for an API token (the route's scope: owner).
 */
export const mcpRoutes: FastifyPluginAsync = async (app) => {
  const schema = { hide: true };
  app.post('/mcp', { schema }, async (req, reply) => {
    const credential: Record<string, string> = {};
    for (const h of ['authorization', 'x-api-key'] as const) {
      const v = req.headers[h];
      if (typeof v === 'string') credential[h] = v;
    }
    const server = forkpointMcpServer(restOf(app, credential));
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    reply.hijack();
    reply.raw.on('close', () => {
      void transport.close();
      void server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req.raw, reply.raw, req.body);
  });
  // Stateless: no stream to resume, no session to end.
  for (const method of ['GET', 'DELETE'] as const) {
    app.route({ method, url: '/mcp', schema, handler: async (_req, reply) => reply.code(405).header('allow', 'POST').send({ error: { code: 'METHOD_NOT_ALLOWED', message: 'MCP here is stateless: POST each message' } }) });
  }
};
