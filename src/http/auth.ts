import type { FastifyInstance, FastifyRequest } from 'fastify';
import { sendError } from './errors.js';

declare module 'fastify' {
  interface FastifyRequest {
    owner: string;
  }
  interface FastifyContextConfig {
    /** No token needed (health, docs). */
    public?: boolean;
  }
}

/** The token of a request: `Authorization: Bearer <token>` or `X-API-Key: <token>`. */
export function tokenOf(request: FastifyRequest): string | undefined {
  const auth = request.headers.authorization;
  if (auth?.startsWith('Bearer ')) return auth.slice(7).trim();
  const key = request.headers['x-api-key'];
  return typeof key === 'string' ? key.trim() : undefined;
}

/** `owner` answers whose a token is (undefined: not a valid token). */
export function installAuth(app: FastifyInstance, owner: (token: string) => string | undefined): void {
  app.decorateRequest('owner', '');
  app.addHook('onRequest', async (request, reply) => {
    if (request.routeOptions.config?.public) return;
    const token = tokenOf(request);
    const who = token ? owner(token) : undefined;
    if (!who) {
      return sendError(reply, 'UNAUTHENTICATED', token ? 'the API token is not valid' : 'an API token is required: Authorization: Bearer <token> or X-API-Key: <token>');
    }
    request.owner = who;
  });
}
