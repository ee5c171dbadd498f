import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Credential, Credentials } from '../core/credentials.js';
import type { EnvdFileLink } from '../core/previews.js';
import { sendError } from './errors.js';

/**
 * What a route opens to, declared in its `config.scope` (default `owner`):
 * - `public`: anyone (health, the documents);
 * - `owner`: an API token, for its owner's objects;
 * - `operator`: an API token of an operator's (FORKPOINT_OPERATORS): the cluster's nodes;
 * - `sandbox`: a sandbox's own access token (E2B's envd: `E2b-Sandbox-Id` + `X-Access-Token`);
 * - `envd-file`: envd's `/files`: the sandbox's access token, or a URL E2B's SDK signed with it
 *   for that path, user and operation (`?signature=`, `?signature_expiration=`);
 * - `port`: a port inside an instance (`/instances/{id}/ports/{port}`): an API token, that
 *   instance's access token, or a preview link of that port;
 * - `file`: one file of an instance, by a signed file link of that path and direction (its
 *   `?signature=`), or an API token.
 * - `volume`: one persistent volume's files (`:volumeID`), by its content token (E2B's volume
 *   token, `Authorization: Bearer`), or an API token.
 */
export type Scope = 'public' | 'owner' | 'operator' | 'sandbox' | 'envd-file' | 'port' | 'file' | 'volume';

declare module 'fastify' {
  interface FastifyRequest {
    /** What the request was let in with (none on public routes). */
    credential: Credential | undefined;
    /** Whose objects the request may touch: its credential's owner. */
    owner: string;
    /** For a call into a sandbox on E2B's envd face: the sandbox it is for. */
    sandboxId: string | undefined;
  }
  interface FastifyContextConfig {
    scope?: Scope;
  }
}

/** The one table of which credential opens which scope. `port` also needs the credential to be
 * for the route's instance (and a preview link for its port): see `admits`. */
const OPENS: Record<Exclude<Scope, 'public'>, readonly Credential['kind'][]> = {
  owner: ['owner'],
  operator: ['owner'],
  sandbox: ['sandbox'],
  'envd-file': ['sandbox', 'file'],
  port: ['owner', 'sandbox', 'traffic', 'preview'],
  file: ['owner', 'file'],
  volume: ['owner', 'volume'],
};

type ScopeParams = { id?: string; port?: string; volumeID?: string };

function admits(scope: Exclude<Scope, 'public'>, c: Credential, params: ScopeParams): boolean {
  if (c.kind === 'file') return c.form === 'envd' ? scope === 'envd-file' : scope === 'file' && c.sandboxId === params.id;
  if (c.kind === 'volume') return scope === 'volume' && c.volumeId === params.volumeID;
  if (!OPENS[scope].includes(c.kind)) return false;
  if (scope === 'operator') return c.kind === 'owner' && c.operator;
  if (scope === 'port' && c.kind !== 'owner') return c.sandboxId === params.id && (c.kind !== 'preview' || String(c.port) === params.port);
  return true;
}

const WHAT_OPENS: Record<Exclude<Scope, 'public'>, string> = {
  owner: 'an API token: Authorization: Bearer <token> or X-API-Key: <token>',
  operator: "an operator's API token (FORKPOINT_OPERATORS)",
  sandbox: "the sandbox's E2b-Sandbox-Id and X-Access-Token",
  'envd-file': "the sandbox's E2b-Sandbox-Id and X-Access-Token, or a URL its SDK signed for this path, user and operation",
  port: "an API token, the instance's access or traffic token, or a valid preview link",
  file: 'an API token, or a signed link of this file made for this method',
  volume: "an API token, or this volume's content token",
};

/** Query parameters a WebSocket upgrade may carry its token in (browsers' WebSocket cannot
 * set headers; OpenComputer's SDK sends `api_key`). Nowhere else: URLs end up in logs. */
const WS_TOKEN_PARAMS = ['api_key', 'token', 'access_token'] as const;

/** The API token of a request: `Authorization: Bearer <token>` or `X-API-Key: <token>`; for a
 * WebSocket upgrade also `?api_key=`, `?token=` or `?access_token=`. */
export function tokenOf(request: FastifyRequest): string | undefined {
  const auth = request.headers.authorization;
  if (auth?.startsWith('Bearer ')) return auth.slice(7).trim();
  const key = request.headers['x-api-key'];
  if (typeof key === 'string') return key.trim();
  if (request.headers.upgrade?.toLowerCase() !== 'websocket') return undefined;
  const query = new URL(request.url, 'http://x').searchParams;
  for (const name of WS_TOKEN_PARAMS) {
    const v = query.get(name);
    if (v) return v.trim();
  }
  return undefined;
}

/** A URL with the values of token parameters replaced, for logs. */
export function redactUrl(url: string): string {
  return url.replace(/([?&](?:api_key|token|access_token|fp_preview|signature)=)[^&#]*/gi, '$1[redacted]');
}

/** Where a preview link's signature comes from: the link's query, or the cookie it set. */
export interface PreviewSource {
  signed(request: FastifyRequest): string | undefined;
}

/** The sandbox a host name of envd's (`49983-<id>.<domain>`) names, if it is one. */
export type EnvdHostSandbox = (host: string | undefined) => string | undefined;

/** Every credential the request presents that is valid, the scope's own kind first. */
async function credentialOf(request: FastifyRequest, scope: Exclude<Scope, 'public'>, credentials: Credentials, preview: PreviewSource, envdHost: EnvdHostSandbox): Promise<Credential | undefined> {
  const sandbox = request.headers['e2b-sandbox-id'];
  const access = request.headers['x-access-token'];
  const token = tokenOf(request);
  const params = (request.params ?? {}) as ScopeParams;
  const tries: (() => Promise<Credential | undefined> | Credential | undefined)[] = [
    () => (token ? credentials.apiToken(token) : undefined),
    () => (typeof sandbox === 'string' && typeof access === 'string' ? credentials.accessToken(sandbox, access) : undefined),
  ];
  if (scope === 'sandbox' || scope === 'envd-file') tries.reverse();
  if (scope === 'envd-file') {
    const link = envdLinkOf(request);
    // The sandbox is named by the header or by envd's host name (`49983-<id>.<domain>`), else
    // looked for (behind `E2B_SANDBOX_URL` the SDK's URL names none).
    const named = typeof sandbox === 'string' ? sandbox : envdHost(request.headers.host);
    if (link) tries.push(() => credentials.envdFileLink(link.signature, link, named));
  }
  if (scope === 'file') {
    // The link signs the path and the direction: a GET reads what it signed, a PUT writes it.
    const query = new URL(request.url, 'http://x').searchParams;
    const signed = query.get('signature');
    const path = query.get('path');
    const direction = request.method === 'GET' ? 'download' : request.method === 'PUT' ? 'upload' : undefined;
    tries.push(() => (signed && path && direction && params.id ? credentials.fileLink(signed, params.id, path, direction) : undefined));
  }
  if (scope === 'volume') {
    tries.push(() => (token && params.volumeID ? credentials.volumeToken(params.volumeID, token) : undefined));
  }
  if (scope === 'port') {
    const traffic = request.headers['e2b-traffic-access-token'];
    tries.push(() => (typeof sandbox === 'string' && typeof traffic === 'string' ? credentials.trafficToken(sandbox, traffic) : undefined));
    tries.push(() => {
      const signed = preview.signed(request);
      return signed && params.id && params.port ? credentials.previewLink(signed, params.id, Number(params.port)) : undefined;
    });
  }
  let first: Credential | undefined;
  for (const attempt of tries) {
    const c = await attempt();
    if (c && admits(scope, c, params)) return c;
    first ??= c;
  }
  return first;
}

/** The E2B-signed file URL a request to envd's `/files` is, if it is one: what its SDK signed
 * (the path and user as the query has them, empty when absent) and the signature. */
function envdLinkOf(request: FastifyRequest): (EnvdFileLink & { signature: string }) | undefined {
  const query = new URL(request.url, 'http://x').searchParams;
  const signature = query.get('signature');
  const operation = request.method === 'GET' ? 'read' : request.method === 'POST' ? 'write' : undefined;
  const path = query.get('path') ?? '';
  const expiration = query.get('signature_expiration');
  // A link opens the one path it signs: an empty one (envd's "any file the upload names") none.
  if (!signature || !operation || !path || (expiration !== null && !/^-?\d{1,12}$/.test(expiration))) return undefined;
  return { signature, path, user: query.get('username') ?? '', operation, expiration: expiration === null ? undefined : Number(expiration) };
}

/** Why a signed envd URL is refused before anyone looks for its sandbox, in envd's words. */
function envdLinkRefusal(request: FastifyRequest, scope: Scope): string | undefined {
  if (scope !== 'envd-file') return undefined;
  const link = envdLinkOf(request);
  return link?.expiration !== undefined && link.expiration < Date.now() / 1000 ? 'signature is already expired' : undefined;
}

/** Checks every request's credential against its route's scope, in this one place. */
export function installAuth(app: FastifyInstance, credentials: Credentials, preview: PreviewSource, envdHost: EnvdHostSandbox): void {
  app.decorateRequest('credential', undefined);
  app.decorateRequest('owner', '');
  app.decorateRequest('sandboxId', undefined);
  app.addHook('onRequest', async (request, reply) => {
    const scope = request.routeOptions.config?.scope ?? 'owner';
    if (scope === 'public') return;
    const refused = envdLinkRefusal(request, scope);
    if (refused) return sendError(reply, 'UNAUTHENTICATED', refused);
    const c = await credentialOf(request, scope, credentials, preview, envdHost);
    if (!c) {
      // E2B's proxy answers a call for a sandbox that is not there (killed) before envd looks at
      // its token; its SDKs read that answer as "not running" (isRunning() false).
      const named = request.headers['e2b-sandbox-id'];
      if ((scope === 'sandbox' || scope === 'envd-file') && typeof named === 'string' && !(await credentials.sandboxExists(named))) {
        return sendError(reply, 'SANDBOX_NOT_RUNNING', `sandbox ${named} is not running: it was killed, or never was`);
      }
      const presented = tokenOf(request) !== undefined || request.headers['x-access-token'] !== undefined || (scope === 'envd-file' && envdLinkOf(request) !== undefined);
      return sendError(reply, 'UNAUTHENTICATED', presented ? `the credential is not valid: this route needs ${WHAT_OPENS[scope]}` : `this route needs ${WHAT_OPENS[scope]}`);
    }
    if (!admits(scope, c, (request.params ?? {}) as ScopeParams)) {
      return sendError(reply, 'FORBIDDEN', `${describe(c)} does not open this route: it needs ${WHAT_OPENS[scope]}`, { credential: c.kind, scope });
    }
    request.credential = c;
    request.owner = c.owner;
    if (c.kind === 'sandbox' || (c.kind === 'file' && c.form === 'envd')) request.sandboxId = c.sandboxId;
  });
}

function describe(c: Credential): string {
  switch (c.kind) {
    case 'owner':
      return 'an API token';
    case 'sandbox':
      return `the access token of sandbox ${c.sandboxId}`;
    case 'traffic':
      return `the traffic token of sandbox ${c.sandboxId}`;
    case 'file':
      return `a signed ${c.direction} link of ${c.path} in ${c.sandboxId}`;
    case 'preview':
      return `a preview link of port ${c.port} of ${c.sandboxId}`;
    case 'volume':
      return `the content token of volume ${c.volumeId}`;
  }
}
