import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { hasZodFastifySchemaValidationErrors } from 'fastify-type-provider-zod';
import { ForkpointError, httpStatusOf, isNoSpace, isStaleWrite, isStoreAway, type ErrorCode } from '../core/errors.js';

export interface ErrorBody {
  error: { code: ErrorCode; message: string; details?: unknown };
}

/** The API faces: each answers errors in its own envelope. */
export type Face = 'firecase' | 'opencomputer' | 'e2b' | 'connect';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Whose envelope the route's errors are in: declared by its face (faceOf), default Firecase. */
    face?: Face;
    /** A Firecase route E2B's SDK calls too (its snapshots are templates here): a request with
     * E2B's `X-API-Key` header gets E2B's envelope, which that SDK reads (404 → false). */
    sharedWithE2b?: boolean;
  }
}

/** Connect RPC's error codes (E2B's envd speaks Connect) for forkpoint's. */
const CONNECT_CODES: Record<ErrorCode, string> = {
  INVALID_REQUEST: 'invalid_argument',
  UNAUTHENTICATED: 'unauthenticated',
  FORBIDDEN: 'permission_denied',
  NOT_FOUND: 'not_found',
  CONFLICT: 'failed_precondition',
  QUOTA_EXCEEDED: 'resource_exhausted',
  PAYLOAD_TOO_LARGE: 'resource_exhausted',
  UNAVAILABLE: 'unavailable',
  INSUFFICIENT_STORAGE: 'resource_exhausted',
  SANDBOX_NOT_RUNNING: 'unavailable',
  DOCKERFILE_INVALID: 'invalid_argument',
  BUILD_STEP_FAILED: 'failed_precondition',
  INTERNAL: 'internal',
};

/** Marks every route a face's plugin adds as that face's. */
export function declareFace(app: FastifyInstance, face: Face): void {
  app.addHook('onRoute', (route) => {
    route.config = { ...(route.config as object), face };
  });
}

/** The face of a request: its route's; a port call with a sandbox's access token is E2B's (its
 * SDK made it); a request no route matched, by the prefix it came with. */
function faceOf(request: FastifyRequest): Face {
  const declared = request.routeOptions.config?.face;
  if (declared === 'connect') return declared;
  if (request.sandboxId !== undefined) return 'e2b';
  if (request.routeOptions.config?.sharedWithE2b && request.headers['x-api-key'] !== undefined) return 'e2b';
  if (declared) return declared;
  if (request.routeOptions.url) return 'firecase';
  if (request.url === '/api' || request.url.startsWith('/api/')) return 'opencomputer';
  return /^\/(v2\/)?(sandboxes|snapshots)(\/|\?|$)/.test(request.url) ? 'e2b' : 'firecase';
}

/**
 * One error answer for every failure, in the envelope of the face asked: the Firecase-style
 * `{"error": {"code", "message", "details"}}`, OpenComputer's `{"error": "message"}`, or E2B's
 * `{"code": status, "message"}`. The status comes from the stable code.
 */
export function sendError(reply: FastifyReply, code: ErrorCode, message: string, details?: unknown): FastifyReply {
  reply.code(httpStatusOf[code]).type('application/json; charset=utf-8');
  const face = faceOf(reply.request);
  if (face === 'opencomputer') return reply.send({ error: message });
  if (face === 'e2b') {
    // On a shared Firecase route the declared responses are Firecase's: E2B's envelope is not one.
    if (reply.request.routeOptions.config?.sharedWithE2b) reply.serializer((body: unknown) => JSON.stringify(body));
    return reply.send({ code: httpStatusOf[code], message });
  }
  if (face === 'connect') return reply.send({ code: CONNECT_CODES[code], message });
  const body: ErrorBody = { error: { code, message, ...(details === undefined ? {} : { details }) } };
  return reply.send(body);
}

export function installErrorHandling(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError, request: FastifyRequest, reply: FastifyReply) => {
    // A body read part-way (an upload refused mid-stream) is left unread: the connection closes
    // after the answer, or the client's next request on it would be taken for the rest of it.
    if (!request.raw.complete && !reply.sent) reply.header('connection', 'close');
    if (err instanceof ForkpointError) return sendError(reply, err.code, err.message, err.details);
    if (hasZodFastifySchemaValidationErrors(err)) {
      const issues = err.validation.map((v) => ({
        where: err.validationContext,
        path: v.instancePath || '/',
        message: v.message,
      }));
      const first = issues[0];
      return sendError(reply, 'INVALID_REQUEST', `invalid ${first?.where ?? 'request'}: ${first?.path} ${first?.message}`, { issues });
    }
    if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return sendError(reply, 'PAYLOAD_TOO_LARGE', 'request body is too large');
    if (err.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || err instanceof SyntaxError) {
      return sendError(reply, 'INVALID_REQUEST', `malformed JSON body: ${err.message}`);
    }
    if (err.statusCode && err.statusCode >= 400 && err.statusCode < 500) {
      return sendError(reply, 'INVALID_REQUEST', err.message, { fastify: err.code });
    }
    if (isUpstreamBreakOff(err)) {
      // A proxied answer (a sandbox's port, another node) that stopped before its first byte
      // reached the client: the server behind it hung up, which is not forkpoint's bug.
      request.log.warn({ err }, 'a proxied answer broke off');
      return sendError(reply, 'UNAVAILABLE', `the server behind this address broke off its answer: ${err.message}`, { reason: 'UPSTREAM_BROKE_OFF' });
    }
    if (isNoSpace(err)) {
      request.log.warn({ err }, 'disk full');
      return sendError(reply, 'INSUFFICIENT_STORAGE', 'the disk under the data directory is full; free some space (delete checkpoints or instances) and try again');
    }
    if (isStaleWrite(err)) {
      request.log.warn({ err }, 'a write of a lease that ended was refused');
      return sendError(reply, 'CONFLICT', err.message, { reason: 'STALE_WRITE', instance: err.instanceId });
    }
    if (isStoreAway(err)) {
      request.log.warn({ err }, 'the database is not answering');
      return sendError(reply, 'UNAVAILABLE', 'the database is not answering; try again in a moment');
    }
    request.log.error({ err }, 'internal error');
    return sendError(reply, 'INTERNAL', 'internal error; see the server log', { request_id: request.id });
  });
  app.setNotFoundHandler((request, reply) => sendError(reply, 'NOT_FOUND', `no route ${request.method} ${request.url.split('?')[0]}`));
}

/** undici's failures of a connection or of an answer's body (reply-from streams through it). */
function isUpstreamBreakOff(err: { code?: unknown; name?: unknown }): boolean {
  return (typeof err.code === 'string' && (err.code.startsWith('UND_ERR_') || err.code === 'ECONNRESET')) || err.name === 'SocketError';
}
