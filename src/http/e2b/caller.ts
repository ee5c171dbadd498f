import { Code, ConnectError, createContextKey, type HandlerContext } from '@connectrpc/connect';
import type { FastifyRequest } from 'fastify';

/** Who an in-sandbox (envd) call is for: the sandbox, by its `E2b-Sandbox-Id`, and its owner,
 * proven by the sandbox's own `X-Access-Token` (the auth hook checked both). */
export interface SandboxCaller {
  owner: string;
  id: string;
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

export function callerOf(ctx: HandlerContext): SandboxCaller {
  const c = ctx.values.get(callerKey);
  if (!c) throw new ConnectError('E2b-Sandbox-Id and X-Access-Token are required', Code.Unauthenticated);
  return c;
}

export function callerOfRequest(req: FastifyRequest): SandboxCaller | undefined {
  return req.sandboxId ? { owner: req.owner, id: req.sandboxId } : undefined;
}

/** A path as envd reads it: relative ones (and `~`) from the user's home. */
export function envdPath(path: string): string {
  if (path === '~' || path === '') return E2B_HOME;
  if (path.startsWith('~/')) return `${E2B_HOME}/${path.slice(2)}`;
  return path.startsWith('/') ? path : `${E2B_HOME}/${path}`;
}
