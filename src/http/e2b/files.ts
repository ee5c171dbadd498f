import { posix } from 'node:path';
import { Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import multipart from '@fastify/multipart';
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { FastifyReply } from 'fastify';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { ForkpointError, httpStatusOf } from '../../core/errors.js';
import { callerOfRequest, envdFilePath, envdPath, envdUser } from './caller.js';

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
 * `GET /health`. For a sandbox's own calls (its access token), and `/files` for the URLs its SDK
 * signs with that token. */
export const envdFileRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    // A part's file name is its path in the sandbox (the SDK's multi-file write): busboy keeps
    // only the base name unless told to preserve the path.
    await app.register(multipart, { preservePath: true, limits: { files: MAX_PARTS, fileSize: Number.MAX_SAFE_INTEGER } });
    app.addContentTypeParser(['application/octet-stream', 'application/x-gzip'], (_req, payload, done) => done(null, payload));
    const hidden = { hide: true };
    const config = { scope: 'sandbox' as const };
    // A file's bytes also open to a URL the SDK signed (downloadUrl, uploadUrl) for that path.
    const fileConfig = { scope: 'envd-file' as const };

    // The SDK's isRunning(): 204 while the sandbox runs, 502 (E2B's proxy's answer) once it is
    // paused, stopped or being killed.
    app.get('/health', { config, schema: hidden }, async (req, reply) => {
      const c = callerOfRequest(req);
      if (!c) return reply.code(401).send({ code: 401, message: 'E2b-Sandbox-Id and X-Access-Token are required' });
      try {
        const { status } = await fp.instances.get(c.owner, c.id);
        if (status !== 'running') return envdError(reply, new ForkpointError('SANDBOX_NOT_RUNNING', `sandbox ${c.id} is ${status}, not running`));
        if (fp.instances.isBeingDeleted(c.id)) return envdError(reply, new ForkpointError('SANDBOX_NOT_RUNNING', `sandbox ${c.id} is being killed`));
      } catch (err) {
        return envdError(reply, err);
      }
      return reply.code(204).send();
    });

    app.get('/files', { config: fileConfig, schema: { ...hidden, querystring: FilesQuery } }, async (req, reply) => {
      const c = callerOfRequest(req, req.query.username);
      if (!c) return reply.code(401).send({ code: 401, message: 'E2b-Sandbox-Id and X-Access-Token are required' });
      try {
        const user = await envdUser(fp, c);
        const path = envdPath(envdFilePath(req, req.query.path) ?? '', user.home);
        const { size, stream } = await fp.files.readStream(c.owner, c.id, path, { user });
        reply.type('application/octet-stream');
        if (size !== undefined) reply.header('content-length', size);
        return reply.send(stream);
      } catch (err) {
        return envdError(reply, err);
      }
    });

    app.post('/files', { config: fileConfig, schema: { ...hidden, querystring: FilesQuery } }, async (req, reply) => {
      const c = callerOfRequest(req, req.query.username);
      if (!c) return reply.code(401).send({ code: 401, message: 'E2b-Sandbox-Id and X-Access-Token are required' });
      const written: { name: string; type: 'file'; path: string; metadata?: Record<string, string> }[] = [];
      // envd's file metadata: `X-Metadata-<key>` headers, the key lower-cased (as Node has the
      // names already), the same for every file of the upload, replacing what the file had.
      const metadata = Object.fromEntries(
        Object.entries(req.headers).flatMap(([name, value]) => (name.startsWith('x-metadata-') && typeof value === 'string' ? [[name.slice('x-metadata-'.length), value]] : [])),
      );
      const withMetadata = Object.keys(metadata).length ? { metadata } : {};
      try {
        const user = await envdUser(fp, c);
        const as = { ...withMetadata, user };
        if (req.isMultipart()) {
          for await (const part of req.parts()) {
            // A form field named `file` is a file too (envd takes it; E2B's docs upload so),
            // written where the query's path says; other fields are not files.
            if (part.type === 'field' && part.fieldname !== 'file') continue;
            // A field is read whole into memory, up to the parser's bound: past it, refused
            // rather than written cut short.
            if (part.type === 'field' && part.valueTruncated) return reply.code(413).send({ code: 413, message: 'a form field named file holds at most 1 MiB: send a larger file as a file part, or as the body' });
            const named = part.type === 'file' ? part.filename : undefined;
            const target = envdFilePath(req, req.query.path) ?? named;
            if (!target) return reply.code(400).send({ code: 400, message: 'path is required for a form field (or give the part a file name)' });
            const path = envdPath(target, user.home);
            const content = part.type === 'file' ? part.file : Readable.from([Buffer.from(String(part.value))]);
            await fp.files.writeStream(c.owner, c.id, path, content, as);
            written.push({ name: posix.basename(path), type: 'file', path, ...withMetadata });
          }
        } else {
          const target = envdFilePath(req, req.query.path);
          if (!target) return reply.code(400).send({ code: 400, message: 'path is required' });
          const encoding = (req.headers['content-encoding'] ?? 'identity').toLowerCase();
          if (encoding !== 'identity' && encoding !== 'gzip') return reply.code(415).send({ code: 415, message: `content-encoding ${encoding} is not supported (gzip or none)` });
          const path = envdPath(target, user.home);
          // The SDK's gzip upload: the file is what the body decompresses to. Its size is bounded
          // where every write is, by the sandbox's disk, not by the compressed length.
          const body = req.body as Readable;
          if (encoding === 'gzip') {
            const gunzip = createGunzip();
            let corrupt: Error | undefined;
            gunzip.once('error', (err) => (corrupt = err));
            try {
              await fp.files.writeStream(c.owner, c.id, path, body.pipe(gunzip), as);
            } catch (err) {
              if (corrupt) return reply.code(400).send({ code: 400, message: `the body is not valid gzip: ${corrupt.message}` });
              throw err;
            }
          } else {
            await fp.files.writeStream(c.owner, c.id, path, body, as);
          }
          written.push({ name: posix.basename(path), type: 'file', path, ...withMetadata });
        }
      } catch (err) {
        return envdError(reply, err);
      }
      return reply.send(written);
    });
  };

