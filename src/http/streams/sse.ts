import type { FastifyReply, FastifyRequest } from 'fastify';

/** A client this far behind is let go (it can come back from where it was). */
const MAX_BUFFERED = 4 << 20;
export const DEFAULT_HEARTBEAT_MS = 15_000;

/** The streams open on each server, ended when it closes (they would hold its close up). */
const openStreams = new WeakMap<object, Set<SseStream>>();

export function closeStreams(server: object): void {
  for (const s of openStreams.get(server) ?? []) s.close();
}

/**
 * A Server-Sent Events response: events written as they come, a comment as a heartbeat when
 * nothing was written for a while (proxies close idle connections), and an end when the
 * client goes or falls too far behind.
 */
export class SseStream {
  private closed = false;
  private lastWrite = Date.now();
  private readonly heartbeat: NodeJS.Timeout;
  private readonly closers: (() => void)[] = [];

  constructor(req: FastifyRequest, private readonly reply: FastifyReply, heartbeatMs = DEFAULT_HEARTBEAT_MS, headers: Record<string, string> = {}) {
    reply.hijack();
    reply.raw.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache, no-transform',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
      ...headers,
    });
    reply.raw.flushHeaders();
    this.heartbeat = setInterval(() => {
      if (Date.now() - this.lastWrite >= heartbeatMs - 5) this.write(`: heartbeat ${new Date().toISOString()}\n\n`);
    }, heartbeatMs);
    // The response's close: the client went away (the request's own fires when its body is read).
    reply.raw.on('close', () => this.close());
    reply.raw.on('error', () => this.close());
    let streams = openStreams.get(req.server.server);
    if (!streams) openStreams.set(req.server.server, (streams = new Set()));
    streams.add(this);
    this.closers.push(() => streams.delete(this));
  }

  get isOpen(): boolean {
    return !this.closed;
  }

  /** Called once when the stream ends, whoever ends it. */
  onClose(fn: () => void): void {
    if (this.closed) fn();
    else this.closers.push(fn);
  }

  event(name: string, data: unknown, id?: string): void {
    this.write(`${id !== undefined ? `id: ${id}\n` : ''}event: ${name}\ndata: ${JSON.stringify(data)}\n\n`);
  }

  private write(text: string): void {
    if (this.closed) return;
    this.lastWrite = Date.now();
    this.reply.raw.write(text);
    if (this.reply.raw.writableLength > MAX_BUFFERED) {
      const why = { code: 'CLIENT_TOO_SLOW', message: 'the client fell too far behind; reattach from the last event id' };
      this.reply.raw.write(`event: error\ndata: ${JSON.stringify(why)}\n\n`);
      this.close();
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.heartbeat);
    if (!this.reply.raw.writableEnded) this.reply.raw.end();
    for (const fn of this.closers.splice(0)) fn();
  }
}
