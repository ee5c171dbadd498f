import type { FastifyReply, FastifyRequest } from 'fastify';
import type { BuildLogLine } from '../../core/build/builder.js';
import { ForkpointError } from '../../core/errors.js';
import { SseStream } from './sse.js';

/** Whether the client asked for the build log as it happens. */
export const wantsEvents = (req: FastifyRequest) => (req.headers.accept ?? '').includes('text/event-stream');

/**
 * A build answered as Server-Sent Events: `build_log` events ({step, total, type, message}) as
 * the steps run and print, then `result` with the answer, or `error` ({error, code, details}:
 * the failing line and the end of its output). The shape OpenComputer's SDK reads.
 */
export async function streamBuild<T>(req: FastifyRequest, reply: FastifyReply, run: (onLog: (l: BuildLogLine) => void) => Promise<T>, result: (t: T) => unknown): Promise<void> {
  return streamWork(req, reply, 'build_log', run, result);
}

/** Long work answered as Server-Sent Events: `event` events as it goes, then `result`, or `error`
 * with the error's code and details. */
export async function streamWork<T, L>(req: FastifyRequest, reply: FastifyReply, event: string, run: (onLog: (l: L) => void) => Promise<T>, result: (t: T) => unknown): Promise<void> {
  const sse = new SseStream(req, reply);
  try {
    const done = await run((l) => sse.event(event, l));
    sse.event('result', result(done));
  } catch (err) {
    if (err instanceof ForkpointError) {
      sse.event('error', { error: err.message, code: err.code, details: err.details ?? null });
    } else {
      req.log.error({ err }, `${event} work failed inside forkpoint`);
      sse.event('error', { error: 'internal error; see the server log', code: 'INTERNAL', details: { request_id: req.id } });
    }
  } finally {
    sse.close();
  }
}
