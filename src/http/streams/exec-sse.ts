import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Forkpoint } from '../../core/forkpoint.js';
import { SseStream } from './sse.js';
import { Utf8Pieces, type TextPiece } from './utf8.js';

/** `Last-Event-ID` of an output event: the stdout and stderr offsets it ends at. */
export function offsetsFromEventId(id: string | undefined): [number, number] | undefined {
  const m = id ? /^(\d{1,15})-(\d{1,15})$/.exec(id.trim()) : null;
  return m ? [Number(m[1]), Number(m[2])] : undefined;
}

/**
 * Streams an execution as Server-Sent Events: `stdout` and `stderr` events as the bytes come
 * (each with an id that resumes after it), then `exit`. The client going away detaches it; the
 * command runs on and can be streamed again from where the client was.
 */
export async function streamExecution(
  fp: Forkpoint,
  req: FastifyRequest,
  reply: FastifyReply,
  target: { owner: string; id: string; execId: string },
  opts: { from: [number, number]; heartbeatMs?: number | undefined; first?: { event: string; data: unknown } | undefined },
): Promise<void> {
  const { owner, id, execId } = target;
  const pieces = { 1: new Utf8Pieces(opts.from[0]), 2: new Utf8Pieces(opts.from[1]) };
  let sse: SseStream | undefined;
  const early: (() => void)[] = [];
  const whenOpen = (fn: () => void) => (sse ? fn() : early.push(fn));
  const send = (stream: 1 | 2, list: TextPiece[]) => {
    for (const p of list) {
      const data = p.encoding === 'utf8' ? { data: p.data, offset: p.offset } : { data: p.data, offset: p.offset, encoding: 'base64' };
      sse!.event(stream === 1 ? 'stdout' : 'stderr', data, `${pieces[1].emitted}-${pieces[2].emitted}`);
    }
  };
  const attachment = await fp.executions.attach(owner, id, execId, opts.from, {
    output: (stream, offset, data) => whenOpen(() => send(stream, pieces[stream].push(offset, data))),
    replayed: () => {},
    exit: (exitCode, signal) =>
      whenOpen(() => {
        send(1, pieces[1].flush());
        send(2, pieces[2].flush());
        void fp.executions
          .get(owner, id, execId)
          .catch(() => undefined)
          .then((st) => {
            sse!.event('exit', { exit_code: exitCode, signal, duration_ms: st?.durationMs ?? null, timed_out: st?.timedOut ?? false });
            sse!.close();
          });
      }),
    lost: (reason) =>
      whenOpen(() => {
        sse!.event('detached', { reason, message: 'the stream ended without the command\'s exit; stream it again by its id to go on' });
        sse!.close();
      }),
  });
  sse = new SseStream(req, reply, opts.heartbeatMs, { 'x-exec-id': execId });
  sse.onClose(() => attachment.detach());
  if (opts.first) sse.event(opts.first.event, opts.first.data);
  for (const fn of early.splice(0)) fn();
}
