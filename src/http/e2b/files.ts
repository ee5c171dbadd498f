import { posix } from 'node:path';
import type { Readable } from 'node:stream';
import multipart from '@fastify/multipart';
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { FastifyReply } from 'fastify';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { ForkpointError, httpStatusOf } from '../../core/errors.js';
import { callerOfRequest, envdPath } from './caller.js';

const FilesQuery = z.object({ path: z.string().max(4096).optional(), username: z.string().max(64).optional() });
const MAX_PARTS = 1000;

/** envd's errors: `{code, message}` with the HTTP status as the code. */
function envdError(reply: FastifyReply, err: unknown): FastifyReply {
  const status = err instanceof ForkpointError ? httpStatusOf[err.code] : 500;
  const message = err instanceof ForkpointError ? err.message : 'internal error; see the server log';
  if (!(err instanceof ForkpointError)) reply.log.error({ err }, 'envd files call failed');
  return reply.code(status).send({ code: status, message });
}

/** envd's plain HTTP: `GET /files` (a file's bytes), `POST /files` (multipart or raw bytes),
 * `GET /health`. For a sandbox's own calls only (its access token). */
export const envdFileRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    await app.register(multipart, { limits: { files: MAX_PARTS, fileSize: Number.MAX_SAFE_INTEGER } });
    app.addContentTypeParser(['application/octet-stream', 'application/x-gzip'], (_req, payload, done) => done(null, payload));
    const hidden = { hide: true };
    const config = { scope: 'sandbox' as const };

    app.get('/health', { config, schema: hidden }, async (req, reply) => {
      if (!callerOfRequest(req)) return reply.code(401).send({ code: 401, message: 'E2b-Sandbox-Id and X-Access-Token are required' });
      return reply.code(204).send();
    });

    app.get('/files', { config, schema: { ...hidden, querystring: FilesQuery } }, async (req, reply) => {
      const c = callerOfRequest(req);
      if (!c) return reply.code(401).send({ code: 401, message: 'E2b-Sandbox-Id and X-Access-Token are required' });
      const path = envdPath(req.query.path ?? '');
      try {
        const { size, stream } = await fp.files.readStream(c.owner, c.id, path);
        reply.type('application/octet-stream');
        if (size !== undefined) reply.header('content-length', size);
        return reply.send(stream);
      } catch (err) {
        return envdError(reply, err);
      }
    });

    app.post('/files', { config, schema: { ...hidden, querystring: FilesQuery } }, async (req, reply) => {
      const c = callerOfRequest(req);
      if (!c) return reply.code(401).send({ code: 401, message: 'E2b-Sandbox-Id and X-Access-Token are required' });
      const written: { name: string; type: 'file'; path: string }[] = [];
      try {
        if (req.isMultipart()) {
          for await (const part of req.files()) {
            const path = envdPath(req.query.path ?? part.filename);
            await fp.files.writeStream(c.owner, c.id, path, part.file);
            written.push({ name: posix.basename(path), type: 'file', path });
          }
        } else {
          if (!req.query.path) return reply.code(400).send({ code: 400, message: 'path is required' });
          const path = envdPath(req.query.path);
          await fp.files.writeStream(c.owner, c.id, path, req.body as Readable);
          written.push({ name: posix.basename(path), type: 'file', path });
        }
      } catch (err) {
        return envdError(reply, err);
      }
      return reply.send(written);
    });
  };
