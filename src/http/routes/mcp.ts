import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { forkpointMcpServer, type RestPort } from '../../mcp/tools.js';

/** The REST face, called in process (no socket) with the caller's own credential: the tools
 * are checked exactly as that client's calls would be. */
function restOf(app: FastifyInstance, credential: Record<string, string>): RestPort {
  const call = async (method: 'GET' | 'POST' | 'PUT' | 'DELETE', url: string, payload?: string, type?: string) => {
    const r = await app.inject({ method, url, headers: { ...credential, ...(type ? { 'content-type': type } : {}) }, ...(payload !== undefined ? { payload } : {}) });
    if (r.statusCode >= 400) throw failure(r.statusCode, r.body);
    return r;
  };
  return {
    json: async (method, path, body) => {
      const r = await call(method, path, body !== undefined ? JSON.stringify(body) : undefined, body !== undefined ? 'application/json' : undefined);
      return (r.body ? JSON.parse(r.body) : undefined) as never;
    },
    // As a stream: a file of any size is read only as far as the tool needs.
    readBytes: async (path) => {
      const r = await app.inject({ method: 'GET', url: path, headers: credential, payloadAsStream: true });
      const stream = r.stream();
      if (r.statusCode >= 400) {
        const chunks: Buffer[] = [];
        for await (const c of stream) chunks.push(c as Buffer);
        throw failure(r.statusCode, Buffer.concat(chunks).toString('utf8'));
      }
      return (async function* () {
        try {
          for await (const c of stream) yield c as Uint8Array;
        } finally {
          // A reader that stopped early: the answer is closed as a client that went away closes
          // it, so the route lets go of the file (an injected answer has no socket to close).
          if (!stream.readableEnded) {
            stream.destroy();
            r.raw.res.emit('close');
          }
        }
      })();
    },
    writeText: async (path, text) => void (await call('PUT', path, text, 'application/octet-stream')),
  };
}

/** An error answer as the tools report it: the server's code and message. */
function failure(status: number, body: string): Error {
  let e: { code?: string; message?: string } | undefined;
  try {
    e = (JSON.parse(body) as { error?: { code?: string; message?: string } }).error;
  } catch {
    e = undefined;
  }
  return new Error(`${e?.code ?? `HTTP_${status}`}: ${e?.message ?? body.slice(0, 200)}`);
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
