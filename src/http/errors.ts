import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { hasZodFastifySchemaValidationErrors } from 'fastify-type-provider-zod';
import { ForkpointError, httpStatusOf, isNoSpace, isStoreAway, type ErrorCode } from '../core/errors.js';

export interface ErrorBody {
  error: { code: ErrorCode; message: string; details?: unknown };
}

/** The OpenComputer-compatible face answers errors in OpenComputer's own envelope. */
const isOpenComputer = (request: FastifyRequest) => request.url === '/api' || request.url.startsWith('/api/');
/** E2B's control plane and envd's file routes answer `{code, message}` (the status as code). */
const isE2b = (request: FastifyRequest) => /^\/(v2\/)?(sandboxes|snapshots)(\/|\?|$)|^\/(files|health)(\?|$)/.test(request.url) || request.sandboxId !== undefined;

/**
 * One error answer for every failure, in the envelope of the face asked: the Firecase-style
 * `{"error": {"code", "message", "details"}}`, or OpenComputer's `{"error": "message"}` under
 * /api. The status comes from the stable code.
 */
export function sendError(reply: FastifyReply, code: ErrorCode, message: string, details?: unknown): FastifyReply {
  reply.code(httpStatusOf[code]).type('application/json; charset=utf-8');
  if (isOpenComputer(reply.request)) return reply.send({ error: message });
  if (isE2b(reply.request)) return reply.send({ code: httpStatusOf[code], message });
  const body: ErrorBody = { error: { code, message, ...(details === undefined ? {} : { details }) } };
  return reply.send(body);
}

export function installErrorHandling(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError, request: FastifyRequest, reply: FastifyReply) => {
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
    if (isNoSpace(err)) {
      request.log.warn({ err }, 'disk full');
      return sendError(reply, 'INSUFFICIENT_STORAGE', 'the disk under the data directory is full; free some space (delete checkpoints or instances) and try again');
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
