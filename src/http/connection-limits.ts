import type { IncomingMessage, Server } from 'node:http';
import type { Socket } from 'node:net';

/** Deadlines and bounds on the HTTP server's connections: no client holds the server's sockets
 * or memory by sending slowly or by opening many (README, "Security"). */
export interface ConnectionLimits {
  /** A request's headers must arrive whole within it (then 408 and the connection closes). */
  headersTimeoutMs: number;
  /** A request body must move at least `MIN_BODY_PROGRESS` bytes in every window this long,
   * unless the server is the one not reading (a stream's backpressure). */
  bodyStallMs: number;
  /** Connections one client address may hold at once (0: no bound). Behind a reverse proxy every
   * client has its address: raise it there. */
  perClient: number;
}

const MIN_BODY_PROGRESS = 1024;

/** What Node's server itself enforces (given at its creation; see `installConnectionLimits`). */
export function httpServerOptions(l: ConnectionLimits): { headersTimeout: number; connectionsCheckingInterval: number } {
  return { headersTimeout: l.headersTimeoutMs, connectionsCheckingInterval: Math.max(250, Math.min(5000, Math.floor(l.headersTimeoutMs / 4))) };
}

/** The rest: the per-client bound at accept, and the body watch. Returns its stop. */
export function installConnectionLimits(server: Server, l: ConnectionLimits): () => void {
  const perClient = new Map<string, number>();
  server.on('connection', (socket: Socket) => {
    if (l.perClient <= 0) return;
    const who = socket.remoteAddress ?? '';
    const n = (perClient.get(who) ?? 0) + 1;
    // Closed before a byte is read: there is no request to answer yet.
    if (n > l.perClient) return void socket.destroy();
    perClient.set(who, n);
    socket.once('close', () => {
      const left = (perClient.get(who) ?? 1) - 1;
      if (left > 0) perClient.set(who, left);
      else perClient.delete(who);
    });
  });

  const bodies = new Map<IncomingMessage, { bytes: number; since: number }>();
  server.on('request', (req: IncomingMessage) => {
    if (req.complete) return;
    bodies.set(req, { bytes: req.socket.bytesRead, since: Date.now() });
    const done = () => bodies.delete(req);
    req.once('end', done);
    req.once('close', done);
  });
  const timer = setInterval(() => {
    const now = Date.now();
    for (const [req, seen] of bodies) {
      if (req.complete || req.socket.destroyed) {
        bodies.delete(req);
        continue;
      }
      // Bytes waiting to be read, or a paused stream: the server is slow, not the client.
      if (req.readableLength > 0 || req.isPaused()) {
        bodies.set(req, { bytes: req.socket.bytesRead, since: now });
        continue;
      }
      if (now - seen.since < l.bodyStallMs) continue;
      if (req.socket.bytesRead - seen.bytes < MIN_BODY_PROGRESS) {
        bodies.delete(req);
        req.socket.destroy();
      } else {
        bodies.set(req, { bytes: req.socket.bytesRead, since: now });
      }
    }
  }, Math.max(100, Math.min(1000, Math.floor(l.bodyStallMs / 4))));
  timer.unref();
  return () => clearInterval(timer);
}
