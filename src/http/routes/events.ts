import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { errorResponses, IdParams } from '../schemas/index.js';
import { SseStream } from '../streams/sse.js';

const EventsQuery = z.object({
  heartbeat_ms: z.coerce.number().int().min(100).max(120_000).optional().describe('a heartbeat comment after this long without an event; default 15000'),
});

export const eventRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    app.get('/instances/:id/events', {
      schema: {
        operationId: 'instanceEvents',
        tags: ['instances'],
        summary: 'Follow what happens to an instance (Server-Sent Events)',
        description:
          'One event per change, as it happens: `checkpoint.processing`, `checkpoint.ready`, `checkpoint.failed`, `rollback`, `fork`, `exec.started`, `exec.ended`, ' +
          '`instance.hibernated`, `instance.woken`, `instance.stopped`, `instance.started`, `instance.deleted` (the stream then ends). ' +
          'Each event\'s data is `{seq, type, instance_id, at, data}`; its SSE id is `seq`: reconnect with `Last-Event-ID` to get the events missed meanwhile (the last 200 are kept). ' +
          'A `: heartbeat` comment comes when nothing was sent for `heartbeat_ms`.',
        params: IdParams,
        querystring: EventsQuery,
        produces: ['text/event-stream'],
        response: { 200: { description: 'The events', content: { 'text/event-stream': { schema: z.string().describe('Server-Sent Events') } } }, ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.instances.get(req.owner, req.params.id);
      const last = Number(req.headers['last-event-id']);
      const sse = new SseStream(req, reply, req.query.heartbeat_ms);
      const unfollow = fp.events.follow(req.params.id, Number.isSafeInteger(last) ? last : undefined, (e) => {
        sse.event(e.type, e, String(e.seq));
        if (e.type === 'instance.deleted') sse.close();
      });
      sse.onClose(unfollow);
    });
  };
