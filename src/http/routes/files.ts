import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { Readable } from 'node:stream';
import type { Forkpoint } from '../../core/forkpoint.js';
import {
  Binary, errorResponses, FileInfo, FileList, IdParams, MakeDirectoryRequest, noContent, ok, PathQuery, WatchQuery, WriteFileResult, WriteQuery,
} from '../schemas/index.js';
import { z } from 'zod';
import { SseStream } from '../streams/sse.js';
import { fileInfoView } from '../views.js';
import { sendFileBytes } from '../file-bytes.js';

const tags = ['files'];
const bytes = (description: string) => ({ description, content: { 'application/octet-stream': { schema: Binary } } });

/** File contents: raw bytes both ways, streamed, whatever the request's content type. */
const contentRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    app.removeAllContentTypeParsers();
    app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));

    app.get('/instances/:id/files', {
      schema: {
        operationId: 'readFile',
        tags,
        summary: 'Read a file',
        description: 'The bytes as they are, streamed (a file of any size). 400 for a directory.',
        params: IdParams,
        querystring: PathQuery,
        produces: ['application/octet-stream'],
        response: { 200: bytes('The file\'s bytes'), ...errorResponses },
      },
    }, async (req, reply) => {
      return sendFileBytes(reply, fp.files.readStream(req.owner, req.params.id, req.query.path));
    });

    app.put('/instances/:id/files', {
      schema: {
        operationId: 'writeFile',
        tags,
        summary: 'Write a file (the raw body), making its parent directories',
        description: 'Streamed into a temporary name beside it and renamed over the path once whole: readers never see half a file, and a failed upload leaves nothing.',
        params: IdParams,
        querystring: WriteQuery,
        consumes: ['application/octet-stream'],
        body: Binary,
        response: { 200: ok('Written', WriteFileResult), ...errorResponses },
      },
    }, async (req) => {
      const r = await fp.files.writeStream(req.owner, req.params.id, req.query.path, req.body as Readable, req.query.mode ? { mode: parseInt(req.query.mode, 8) } : {});
      return { path: req.query.path, bytes: r.bytes };
    });

    app.delete('/instances/:id/files', {
      schema: {
        operationId: 'deleteFile',
        tags,
        summary: 'Remove a file or an empty directory',
        description: 'Removing what is not there is no error.',
        params: IdParams,
        querystring: PathQuery,
        response: { 204: noContent('Removed'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.files.remove(req.owner, req.params.id, req.query.path);
      return reply.code(204).send(null);
    });
  };

export const fileRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    await app.register(contentRoutes(fp));

    app.get('/instances/:id/files/list', {
      schema: {
        operationId: 'listFiles',
        tags,
        summary: 'List a directory',
        description: 'Its entries with their type (symlinks as links, not followed) and size.',
        params: IdParams,
        querystring: PathQuery,
        response: { 200: ok('Its entries', FileList), ...errorResponses },
      },
    }, async (req) => ({ path: req.query.path, items: await fp.files.list(req.owner, req.params.id, req.query.path) }));

    app.get('/instances/:id/files/stat', {
      schema: {
        operationId: 'statFile',
        tags,
        summary: 'What is at a path',
        description: 'A symlink is described as such (with its target), not followed.',
        params: IdParams,
        querystring: PathQuery,
        response: { 200: ok('What is there', FileInfo), ...errorResponses },
      },
    }, async (req) => fileInfoView(await fp.files.stat(req.owner, req.params.id, req.query.path)));

    app.get('/instances/:id/files/watch', {
      schema: {
        operationId: 'watchDirectory',
        tags,
        summary: 'Follow the changes in a directory (Server-Sent Events)',
        description:
          'A `watching` event once the watch is in place, then one event per change: `create`, `write` (a file closed after writing), `remove`, `rename` (moved away), `chmod`; ' +
          'each event\'s data is `{name}`, relative to the directory (`sub/file` below it when `recursive`). ' +
          'A checkpoint or rollback does not end the watch; the instance stopping, or more changes than the watch can hold, ends it with an `error` event `{code, message}`. ' +
          'A sandbox has at most 16 watches open at once (429 `QUOTA_EXCEEDED` past that). 404 for a missing directory, 400 for a file.',
        params: IdParams,
        querystring: WatchQuery,
        produces: ['text/event-stream'],
        response: { 200: { description: 'The changes', content: { 'text/event-stream': { schema: z.string().describe('Server-Sent Events') } } }, ...errorResponses },
      },
    }, async (req, reply) => {
      const watch = await fp.files.watch(req.owner, req.params.id, req.query.path, { recursive: req.query.recursive });
      const sse = new SseStream(req, reply);
      sse.onClose(() => watch.close());
      sse.event('watching', { path: req.query.path, recursive: req.query.recursive });
      void (async () => {
        try {
          for await (const e of watch) sse.event(e.op, { name: e.name });
        } catch (err) {
          const e = err as Error & { code?: unknown };
          sse.event('error', { code: typeof e.code === 'string' ? e.code : 'INTERNAL', message: e.message });
        } finally {
          sse.close();
        }
      })();
    });

    app.post('/instances/:id/files/mkdir', {
      schema: {
        operationId: 'makeDirectory',
        tags,
        summary: 'Make a directory and its parents',
        description: 'Like mkdir -p: a directory that is already there is no error.',
        params: IdParams,
        body: MakeDirectoryRequest,
        response: { 204: noContent('Made (or already there)'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.files.mkdir(req.owner, req.params.id, req.body.path);
      return reply.code(204).send(null);
    });
  };
