import type { FastifyInstance } from 'fastify';

declare module 'fastify' {
  interface FastifyRequest {
    /** Aborted when the client goes away before its answer is sent: work done only for this
     * request (a command run and waited for) stops with it. */
    clientGone: AbortSignal;
  }
}

/** Gives every request a signal its client's going away aborts. */
export function installClientGone(app: FastifyInstance): void {
  app.decorateRequest('clientGone', undefined as unknown as AbortSignal);
  app.addHook('onRequest', async (req, reply) => {
    const controller = new AbortController();
    req.clientGone = controller.signal;
    reply.raw.once('close', () => {
      if (!reply.raw.writableFinished) controller.abort(new Error('the client went away before the answer'));
    });
  });
}
