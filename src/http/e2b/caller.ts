import { Code, ConnectError, createContextKey, type HandlerContext } from '@connectrpc/connect';
import { posix } from 'node:path';
import type { FastifyRequest } from 'fastify';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { SandboxUser } from '../../core/users.js';
import { hostRoute } from '../routes/proxy.js';

/** Who an in-sandbox (envd) call is for: the sandbox, by its `E2b-Sandbox-Id`, and its owner,
 * proven by the sandbox's own `X-Access-Token` (the auth hook checked both). */
export interface SandboxCaller {
  owner: string;
  id: string;
  /** The user the call names (envd's `Authorization: Basic <user>:`, or the files API's
   * `username`); the sandbox's default user when absent (envdUser). */
  user?: string | undefined;
}

export const callerKey = createContextKey<SandboxCaller | undefined>(undefined);

/** Cuts the call's connection, as a sandbox that dies under envd does: E2B's SDKs read a
 * connection dropped mid-stream, then a failed health check, as "the sandbox was killed". */
export const dropConnectionKey = createContextKey<() => void>(() => {});

/** Where E2B's envd puts a user's files and starts commands: its default user's home. */
export const E2B_HOME = '/home/user';
/** The envd version this face speaks: what the SDK's feature checks compare against. */
export const ENVD_VERSION = '0.6.4';
/** The port envd listens on inside an E2B sandbox; calls for any other port are proxied. */
export const ENVD_PORT = 49983;

/** The sandbox envd's own host name names (`49983-<id>.<domain>`: E2B's SDKs address envd so
 * outside debug mode), if the request came by one. */
export function envdHostSandbox(domain: string, host: string | undefined): string | undefined {
  const to = hostRoute(domain, host);
  return to?.port === ENVD_PORT ? to.id : undefined;
}

export function callerOf(ctx: HandlerContext): SandboxCaller {
  const c = ctx.values.get(callerKey);
  if (!c) throw new ConnectError('E2b-Sandbox-Id and X-Access-Token are required', Code.Unauthenticated);
  return c;
}

export function callerOfRequest(req: FastifyRequest, username?: string): SandboxCaller | undefined {
  // A signed URL acts as the user it signs, whatever else the request says.
  const signed = req.credential?.kind === 'file' ? req.credential : undefined;
  const user = signed ? signed.user || undefined : username || basicUser(req.headers.authorization);
  return req.sandboxId ? { owner: req.owner, id: req.sandboxId, user } : undefined;
}

/** The path an envd `/files` call names: its query's, or for a signed URL the one it signs (the
 * same words, as the auth hook read them: no second parser decides). */
export function envdFilePath(req: FastifyRequest, query: string | undefined): string | undefined {
  return req.credential?.kind === 'file' ? req.credential.path : query;
}

/** The user of envd's `Authorization: Basic base64(<user>:)` (the SDKs' `user` option). */
function basicUser(header: string | undefined): string | undefined {
  if (!header?.startsWith('Basic ')) return undefined;
  const decoded = Buffer.from(header.slice(6).trim(), 'base64').toString('utf8');
  const name = decoded.slice(0, decoded.includes(':') ? decoded.indexOf(':') : undefined);
  return name || undefined;
}

/** E2B's default user, which its `base` template has and its SDKs assume. */
export const DEFAULT_USER = 'user';

/** Who an envd call acts as: the user it names, else `user` where the sandbox has one (E2B's
 * base, forkpoint's debian image), else root in E2B's home for `user` (an image made without
 * it: files and commands land where E2B's SDKs expect them). */
export async function envdUser(fp: Forkpoint, c: SandboxCaller): Promise<SandboxUser> {
  if (c.user) return fp.files.user(c.owner, c.id, c.user);
  const u = await fp.files.user(c.owner, c.id, DEFAULT_USER, { orRoot: true });
  return u.name === DEFAULT_USER ? u : { ...u, home: E2B_HOME };
}

/** A path as envd reads it: relative ones (and `~`) from the user's home. */
export function envdPath(path: string, home = E2B_HOME): string {
  if (path === '~' || path === '') return home;
  if (path.startsWith('~/')) return posix.join(home, path.slice(2));
  return path.startsWith('/') ? path : posix.join(home, path);
}
