import type { FastifyInstance, FastifyRequest } from 'fastify';
import { sendError } from './errors.js';

declare module 'fastify' {
  interface FastifyRequest {
    owner: string;
    /** For a call into a sandbox on E2B's envd face: the sandbox it is for. */
    sandboxId: string | undefined;
  }
  interface FastifyContextConfig {
    /** No token needed (health, docs). */
    public?: boolean;
  }
}

/** Query parameters a WebSocket upgrade may carry its token in (browsers' WebSocket cannot
 * set headers; OpenComputer's SDK sends `api_key`). Nowhere else: URLs end up in logs. */
const WS_TOKEN_PARAMS = ['api_key', 'token', 'access_token'] as const;

/** The token of a request: `Authorization: Bearer <token>` or `X-API-Key: <token>`; for a
 * WebSocket upgrade also `?api_key=`, `?token=` or `?access_token=`. */
export function tokenOf(request: FastifyRequest): string | undefined {
  const auth = request.headers.authorization;
  if (auth?.startsWith('Bearer ')) return auth.slice(7).trim();
  const key = request.headers['x-api-key'];
  if (typeof key === 'string') return key.trim();
  if (request.headers.upgrade?.toLowerCase() !== 'websocket') return undefined;
  const query = new URL(request.url, 'http://x').searchParams;
  for (const name of WS_TOKEN_PARAMS) {
    const v = query.get(name);
    if (v) return v.trim();
  }
  return undefined;
}

/** A URL with the values of token parameters replaced, for logs. */
export function redactUrl(url: string): string {
  return url.replace(/([?&](?:api_key|token|access_token)=)[^&#]*/gi, '$1[redacted]');
}

/** `owner` answers whose a token is (undefined: not a valid token); `sandboxOwner` whose a
 * sandbox is, given its own access token (E2B's envd `X-Access-Token` with `E2b-Sandbox-Id`):
 * such a call is for that sandbox only. */
export function installAuth(
  app: FastifyInstance,
  owner: (token: string) => Promise<string | undefined>,
  sandboxOwner: (id: string, token: string) => Promise<string | undefined>,
): void {
  app.decorateRequest('owner', '');
  app.decorateRequest('sandboxId', undefined);
  app.addHook('onRequest', async (request, reply) => {
    if (request.routeOptions.config?.public) return;
    const sandbox = request.headers['e2b-sandbox-id'];
    const access = request.headers['x-access-token'];
    if (typeof sandbox === 'string' && typeof access === 'string') {
      const who = await sandboxOwner(sandbox, access);
      if (!who) return sendError(reply, 'UNAUTHENTICATED', 'the access token is not valid for this sandbox');
      request.owner = who;
      request.sandboxId = sandbox;
      return;
    }
    const token = tokenOf(request);
    const who = token ? await owner(token) : undefined;
    if (!who) {
      return sendError(reply, 'UNAUTHENTICATED', token ? 'the API token is not valid' : 'an API token is required: Authorization: Bearer <token> or X-API-Key: <token>');
    }
    request.owner = who;
  });
}
