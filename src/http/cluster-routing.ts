import { connect } from 'node:net';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Forkpoint } from '../core/forkpoint.js';
import { sendError } from './errors.js';
import { NodeLostError } from './forward-agent.js';
import { hostRoute } from './routes/proxy.js';

declare module 'fastify' {
  interface FastifyContextConfig {
    /**
     * Which node runs the call. Unset: a call naming an instance runs on the instance's node
     * (forwarded there if that is another). `here`: on the node it reached, whatever the
     * instance (recoveries). `new`: a creation, on the node running fewest instances. `fork`:
     * here when the body names a durable checkpoint (its data comes from the object store),
     * else on the instance's node.
     */
    placement?: 'here' | 'new' | 'fork' | 'volume';
    /** The path parameter that names the instance (default `id`). */
    instanceParam?: string;
  }
}

/** Set on a forwarded call: the node it reaches runs it, whatever it would decide itself. */
const FORWARDED = 'x-forkpoint-forwarded-by';
const TUNNEL_CONNECT_MS = 10_000;
/** What a lost instance still answers anywhere: its view, its deletion. */
const ON_LOST = new Set(['GET', 'HEAD', 'DELETE']);
/** What an instance whose node does not answer still answers here, from the store. */
const READS = new Set(['GET', 'HEAD']);

/** A forward that never reached the node (refused, timed out connecting, reset before any
 * answer), as opposed to a node that answered with an error. */
function isConnectFailure(err: unknown): boolean {
  for (let e = err, depth = 0; e && depth < 5; e = (e as Error).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && /^(ECONNREFUSED|ECONNRESET|EHOSTUNREACH|ENETUNREACH|ETIMEDOUT|UND_ERR_CONNECT_TIMEOUT|UND_ERR_SOCKET)$/.test(code)) return true;
  }
  return false;
}

const instanceIdOf = (req: FastifyRequest): string | undefined => {
  const params = req.params as Record<string, unknown> | undefined;
  const id = params?.[req.routeOptions.config?.instanceParam ?? 'id'] ?? req.sandboxId;
  return typeof id === 'string' ? id : undefined;
};

/**
 * Any node answers any call: one for an instance on another node goes on to that node, bodies
 * and answers streamed, WebSocket upgrades tunnelled; a creation goes to the node running
 * fewest. Runs after authentication: the token is checked here and again there (one store).
 */
export function installClusterRouting(app: FastifyInstance, fp: Forkpoint): void {
  // One node (the embedded store): nothing is anywhere else.
  if (fp.cluster.soleNode) return;
  app.addHook('onRequest', async (req, reply) => {
    const placement = req.routeOptions.config?.placement;
    // Public routes naming an instance (its ports, by preview link) go on too: the node there
    // checks the link.
    if (placement === 'here' || placement === 'fork') return;
    // Anyone can send the header: it only stops a second forward, never makes a node act on an
    // instance that is not its own.
    const forwarded = req.headers[FORWARDED] !== undefined;
    // A creation is placed once its body is read (below): it may name volumes, which decide.
    if (placement === 'new' || placement === 'volume') return;
    return route(req, reply, fp, forwarded);
  });
  // A volume's own calls go to its node (its disk is there).
  app.addHook('preHandler', async (req, reply) => {
    const placement = req.routeOptions.config?.placement;
    if ((placement !== 'new' && placement !== 'volume') || req.headers[FORWARDED] !== undefined) return;
    const body = req.body as { volumes?: { name?: unknown }[]; volumeMounts?: { name?: unknown }[] } | undefined;
    // A volume's calls name it by `name` (forkpoint's) or `volumeID` (E2B's); a creation by name.
    const params = req.params as { name?: unknown; volumeID?: unknown };
    const named = placement === 'volume' ? params.name : (body?.volumes ?? body?.volumeMounts)?.[0]?.name;
    const volume = typeof params.volumeID === 'string' && placement === 'volume' ? { id: params.volumeID } : typeof named === 'string' ? { name: named } : undefined;
    if (placement === 'volume' && !volume) return;
    const to = volume ? await fp.cluster.placeForVolume(req.owner, volume) : await fp.cluster.placeNew();
    return to.kind === 'node' ? forward(req, reply, fp, to.node.url) : undefined;
  });
  // A fork's node depends on its checkpoint (in the body, or the path's): decided once the body
  // is parsed. One with a durable copy runs here; another on the node that has it.
  app.addHook('preHandler', async (req, reply) => {
    if (req.routeOptions.config?.placement !== 'fork') return;
    const checkpoint = (req.body as { checkpoint_id?: unknown } | undefined)?.checkpoint_id ?? (req.params as { checkpointId?: unknown }).checkpointId;
    if (typeof checkpoint === 'string' && (await fp.durable.state(checkpoint)).durable) return;
    const forwarded = req.headers[FORWARDED] !== undefined;
    if (instanceIdOf(req) || typeof checkpoint !== 'string') return route(req, reply, fp, forwarded);
    const instance = await fp.cluster.instanceOfCheckpoint(checkpoint);
    return instance ? route(req, reply, fp, forwarded, instance) : undefined;
  });
}

/** Sends a call naming an instance (or about one) on to the instance's node, if that is another. */
async function route(req: FastifyRequest, reply: FastifyReply, fp: Forkpoint, forwarded: boolean, about = instanceIdOf(req)): Promise<FastifyReply | undefined> {
  const id = about;
  if (!id) return undefined;
  const where = await fp.cluster.locate(id);
  if (where.kind === 'lost' && !ON_LOST.has(req.method)) {
    return sendError(reply, 'CONFLICT', `instance ${id} is lost: its node stopped answering; POST /instances/${id}/recover brings it back from its newest durable checkpoint`, { node: where.node });
  }
  if (where.kind === 'unreachable') {
    if (READS.has(req.method)) return undefined; // from the store, here
    return sendError(reply, 'UNAVAILABLE', `instance ${id}'s node ${where.node.id} is not answering; try again in a moment`, { node: where.node.id, reason: 'NODE_UNREACHABLE' });
  }
  if (where.kind !== 'node') return undefined;
  if (forwarded) return sendError(reply, 'CONFLICT', `instance ${id} is on node ${where.node.id}, not this one`, { node: where.node.id });
  return forward(req, reply, fp, where.node.url, where.node.id);
}

/** A request made to a preview's own host name goes on as it came, host and path: the node
 * there checks the link on that host (a preview link opens nothing under a node's address). */
const previewHostOf = (req: FastifyRequest, fp: Forkpoint): string | undefined =>
  hostRoute(fp.config.previewDomain, req.headers.host) ? req.headers.host : undefined;

function forward(req: FastifyRequest, reply: FastifyReply, fp: Forkpoint, base: string, nodeId?: string): FastifyReply | undefined {
  if (req.headers.upgrade?.toLowerCase() === 'websocket') {
    tunnel(req, reply, fp, base);
    return reply;
  }
  // Not parsed yet (or a stream already): the body goes on as it came.
  if (req.body === undefined && req.method !== 'GET' && req.method !== 'HEAD') req.body = req.raw;
  const preview = previewHostOf(req, fp);
  return reply.from(base + (preview ? req.originalUrl : req.url), {
    // The host the client used goes along (a load balancer's, if one said it): URLs the other
    // node answers (preview links) name it, not this node's address.
    rewriteRequestHeaders: (_r, headers) => ({ ...headers, [FORWARDED]: fp.cluster.nodeId, 'x-forwarded-host': req.headers['x-forwarded-host'] ?? req.headers.host ?? '', ...(preview ? { host: preview } : {}) }),
    onError: (_r, { error }) => {
      if (nodeId && isConnectFailure(error)) fp.cluster.unreachableNow(nodeId);
      const lost = lostNodeOf(error);
      void sendError(reply, 'UNAVAILABLE', `the instance's node did not answer: ${lost?.message ?? error.message}`, lost ? { node: lost.node, reason: 'NODE_LOST' } : undefined);
    },
  });
}

function lostNodeOf(err: unknown): NodeLostError | undefined {
  for (let e = err, depth = 0; e && depth < 5; e = (e as Error).cause, depth++) if (e instanceof NodeLostError) return e;
  return undefined;
}

/** A WebSocket upgrade for an instance on another node: the upgrade request goes on as it came,
 * and from then on the two sockets are joined. */
function tunnel(req: FastifyRequest, reply: FastifyReply, fp: Forkpoint, base: string): void {
  reply.hijack();
  const client = req.raw.socket;
  const url = new URL(base);
  const upstream = connect({ host: url.hostname, port: Number(url.port || 80), timeout: TUNNEL_CONNECT_MS });
  const close = () => {
    client.destroy();
    upstream.destroy();
  };
  upstream.once('timeout', close);
  upstream.once('connect', () => {
    upstream.setTimeout(0);
    const preview = previewHostOf(req, fp);
    const head = [`${req.raw.method} ${preview ? req.originalUrl : req.raw.url} HTTP/1.1`];
    for (let i = 0; i < req.raw.rawHeaders.length; i += 2) {
      const name = req.raw.rawHeaders[i]!;
      if (name.toLowerCase() === 'host' || name.toLowerCase() === FORWARDED) continue;
      head.push(`${name}: ${req.raw.rawHeaders[i + 1]}`);
    }
    head.push(`Host: ${preview ?? url.host}`, `${FORWARDED}: ${fp.cluster.nodeId}`, '', '');
    upstream.write(head.join('\r\n'));
    upstream.pipe(client);
    client.pipe(upstream);
  });
  upstream.on('error', close);
  client.on('error', close);
  client.once('close', close);
  upstream.once('close', close);
}
