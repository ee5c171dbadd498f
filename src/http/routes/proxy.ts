import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import { WebSocket } from 'ws';
import { ConflictError, InvalidRequestError } from '../../core/errors.js';
import { sendError } from '../errors.js';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { PreviewSource } from '../auth.js';

/** The query parameter a preview link carries its signature in; the cookie it becomes. */
export const PREVIEW_PARAM = 'fp_preview';
const MAX_WS_BUFFERED = 4 << 20;

/** `<port>-<instance id>.<domain>` or OpenComputer's `sb-<instance id>-p<port>.<domain>`; with
 * the preview domain `auto`, under any domain (the one the client used for the API). */
export function hostRoute(domain: string, host: string | undefined): { id: string; port: number } | undefined {
  if (domain === 'none' || !host) return undefined;
  const name = host.replace(/:\d+$/, '').toLowerCase();
  let label: string;
  if (domain === 'auto') {
    const dot = name.indexOf('.');
    if (dot <= 0 || dot === name.length - 1) return undefined;
    label = name.slice(0, dot);
  } else {
    if (!name.endsWith(`.${domain.toLowerCase()}`)) return undefined;
    label = name.slice(0, -domain.length - 1);
  }
  const m = /^(\d{1,5})-(inst_[a-z0-9]+)$/.exec(label) ?? /^sb-(inst_[a-z0-9]+)-p(\d{1,5})$/.exec(label);
  if (!m) return undefined;
  const [a, b] = [m[1]!, m[2]!];
  const port = Number(/^\d/.test(a) ? a : b);
  const id = /^\d/.test(a) ? b : a;
  return port >= 1 && port <= 65535 ? { id, port } : undefined;
}

/** Where a preview of the port lives: a host name of its own under the preview domain, so that
 * no two previews, and no preview and the API, share an origin (a page of one could read the
 * other with the visitor's cookie). The preview domain `auto` is the name the client reached the
 * API by (a load balancer's, `localhost`), or `localhost` when it used an address (no name has
 * subdomains there). The API's own port and scheme go with it, as the client had them. */
export function previewPath(fp: Forkpoint, api: { host: string; scheme: 'http' | 'https' }, id: string, port: number): string {
  const configured = fp.config.previewDomain;
  if (configured === 'none') {
    throw new ConflictError('previews are off on this server: it has no preview domain (FORKPOINT_PREVIEW_DOMAIN); the port is reachable with the API token under /instances/{id}/ports/{port}/', { reason: 'PREVIEW_DOMAIN_REQUIRED' });
  }
  const m = /^(.*?)(?::(\d{1,5}))?$/.exec(api.host)!;
  const name = m[1]!.toLowerCase();
  const byName = /^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z]([a-z0-9-]{0,61}[a-z0-9])?$/.test(name) && !hostRoute('auto', name);
  const domain = configured === 'auto' ? (byName ? name : 'localhost') : configured;
  return `${api.scheme}://${port}-${id}.${domain}${m[2] ? `:${m[2]}` : ''}/`;
}

/** A preview link's signature, in the link's query or in the cookie it set: on the preview's own
 * host only. Under the API's origin (`/instances/{id}/ports/{port}/`) a preview credential opens
 * nothing: a page of another preview served there would share its origin. */
export function previewSourceFor(domain: string): PreviewSource {
  return {
    signed: (req: FastifyRequest): string | undefined => {
      if (!hostRoute(domain, req.headers.host)) return undefined;
      return new URL(req.url, 'http://x').searchParams.get(PREVIEW_PARAM) ?? cookie(req, PREVIEW_PARAM);
    },
  };
}

function cookie(req: FastifyRequest, name: string): string | undefined {
  for (const part of (req.headers.cookie ?? '').split(';')) {
    const [k, ...v] = part.trim().split('=');
    if (k === name) return v.join('=');
  }
  return undefined;
}

interface Target {
  owner: string;
  host: string;
  port: number;
  /** The path and query to ask upstream. */
  path: string;
}

/**
 * `/instances/{id}/ports/{port}/...`: HTTP and WebSocket requests proxied to a port inside the
 * instance (waking it if it hibernates), for a client with the API token or a preview link.
 * Neither the token nor the link's signature goes on to the sandbox.
 */
export const proxyRoutes = (fp: Forkpoint): FastifyPluginAsync =>
  async (app) => {
    // Bodies go through as they are, streamed.
    app.removeAllContentTypeParsers();
    app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));

    const targets = new WeakMap<FastifyRequest, Target>();
    /** The auth hook let the request in (scope `port`); here: where it goes, and a preview
     * link's signature kept as a cookie so that the page's own requests carry it. */
    const resolve = async (req: FastifyRequest, reply: FastifyReply): Promise<void> => {
      const { id, port: p } = req.params as { id: string; port: string };
      const port = Number(p);
      if (!Number.isInteger(port) || port < 1 || port > 65535) throw new InvalidRequestError(`not a port: ${p}`);
      const url = new URL(req.url, 'http://x');
      const fromQuery = url.searchParams.get(PREVIEW_PARAM);
      url.searchParams.delete(PREVIEW_PARAM);
      // Host-only (no Domain): a cookie of this preview's host name and of no other.
      if (req.credential?.kind === 'preview' && fromQuery) reply.header('set-cookie', `${PREVIEW_PARAM}=${fromQuery}; Path=/; HttpOnly; SameSite=Lax; Max-Age=${7 * 86400}`);
      const to = await fp.ports.target(req.owner, id, port);
      const prefix = `/instances/${id}/ports/${port}`;
      const rest = url.pathname.startsWith(prefix) ? url.pathname.slice(prefix.length) : url.pathname;
      targets.set(req, { owner: req.owner, host: to.host, port: to.port, path: `${rest || '/'}${url.search}` });
    };

    const forward = (req: FastifyRequest, reply: FastifyReply) => {
      const t = targets.get(req)!;
      // The request is the instance's activity for as long as it lasts: a long download or a
      // slow answer was cut by the idle timeout, the instance hibernated under it. (A
      // WebSocket holds its own, below.)
      reply.raw.once('close', fp.access.lease((req.params as { id: string }).id));
      return reply.from(`http://${t.host}:${t.port}${t.path}`, {
        // Nothing listening, or a server that does not answer: the sandbox's doing, not a bug.
        onError: (_r, { error }) => void sendError(reply, 'UNAVAILABLE', `port ${t.port} of the instance did not answer: ${error.message}`),
        rewriteRequestHeaders: (_r, headers) => {
          const { authorization: _a, 'x-api-key': _k, 'x-access-token': _t, ...rest } = headers;
          if (typeof rest.cookie === 'string') rest.cookie = rest.cookie.split(';').filter((c) => !c.trim().startsWith(`${PREVIEW_PARAM}=`)).join(';');
          return rest;
        },
      });
    };

    const config = { scope: 'port' as const };
    const schema = { hide: true };
    for (const url of ['/instances/:id/ports/:port', '/instances/:id/ports/:port/*']) {
      app.route({ method: ['DELETE', 'PATCH', 'POST', 'PUT', 'OPTIONS'], url, config, schema, preHandler: resolve, handler: forward });
      app.route({
        method: 'GET',
        url,
        config,
        schema,
        preHandler: resolve,
        handler: forward,
        wsHandler: (socket, req) => {
          const t = targets.get(req)!;
          const protocols = req.headers['sec-websocket-protocol']?.split(',').map((p) => p.trim()).filter(Boolean);
          const upstream = new WebSocket(`ws://${t.host}:${t.port}${t.path}`, protocols);
          const release = fp.access.lease((req.params as { id: string }).id);
          const early: [Buffer, boolean][] = [];
          const end = () => {
            release();
            socket.close();
            upstream.close();
          };
          socket.on('message', (data: Buffer, binary: boolean) => {
            if (upstream.readyState === WebSocket.OPEN) upstream.send(data, { binary });
            else early.push([data, binary]);
          });
          upstream.on('open', () => {
            for (const [d, b] of early.splice(0)) upstream.send(d, { binary: b });
          });
          upstream.on('message', (data: Buffer, binary: boolean) => {
            socket.send(data, { binary });
            if (socket.bufferedAmount > MAX_WS_BUFFERED) end();
          });
          upstream.on('close', end);
          upstream.on('error', end);
          socket.on('close', end);
          socket.on('error', end);
        },
      });
    }
  };
