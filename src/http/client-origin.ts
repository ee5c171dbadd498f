import type { FastifyRequest } from 'fastify';

/** Where the client reached this server: the host and scheme its own URL had, which a load
 * balancer, a TLS proxy or another node (forwarding) says in X-Forwarded-Host and
 * X-Forwarded-Proto (their first value: the client's side), else the request's own. Links a
 * node answers with name this, never the node's internal address. */
export function clientOrigin(req: FastifyRequest): { host: string; scheme: 'http' | 'https' } {
  const first = (v: string | string[] | undefined) => (typeof v === 'string' ? v.split(',')[0]!.trim() : undefined) || undefined;
  const host = first(req.headers['x-forwarded-host']) ?? req.headers.host ?? 'localhost';
  return { host, scheme: first(req.headers['x-forwarded-proto']) === 'https' ? 'https' : 'http' };
}
