import { createServer as createHttpServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from 'node:http';
import { createSecureContext, rootCertificates, TLSSocket, type SecureContext } from 'node:tls';
import { createServer as createTcpServer, isIP, type AddressInfo, type Server as TcpServer, type Socket } from 'node:net';
import { Resolver } from 'node:dns/promises';
import { pipeline } from 'node:stream/promises';
import type { Logger } from 'pino';
import { Agent, request } from 'undici';
import { issueServerCertificate } from '../../lib/egress-ca.js';
import { egressAllows, hostMatches, type EgressPolicy } from '../../lib/egress-policy.js';
import type { EgressSecrets, SecretRule } from '../../seam/runtime.js';
import { BODIES_SPOOLED_PER_SANDBOX, BODIES_SPOOLED_TOTAL, BodyBudget, bodyWithSecrets, type BodySpool } from './request-body.js';
import { substituteText } from './secret-substitution.js';

/** Connections one sandbox may hold open through the proxy at once. */
export const PROXY_CONNECTIONS_PER_SANDBOX = 64;
/** Server certificates kept (one per sandbox and host): issuing one costs a key generation. */
const MAX_CERTIFICATES = 1024;
const HEADERS_TIMEOUT_MS = 30_000;
/** A TLS handshake the sandbox starts and never ends holds one of its connections: not for long. */
const HANDSHAKE_TIMEOUT_MS = 10_000;
/** Server certificates kept for one sandbox (a `*.domain` rule lets it ask for any number of
 * names; each costs a key generation, and the cache is every sandbox's). */
const CERTIFICATES_PER_SANDBOX = 64;
/** A request the sandbox sends, whole, and an upstream's answer: bounded, like every wait. */
const REQUEST_TIMEOUT_MS = 10 * 60_000;
const UPSTREAM_CONNECT_MS = 10_000;
// `expect`: the proxy's own server answered a 100-continue already (and undici refuses to send one).
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'proxy-authorization', 'proxy-authenticate', 'host', 'expect']);

/** The sandbox at a source address: its policy and secrets. */
export type ProxyLookup = (address: string) => { id: string; policy: EgressPolicy; secrets: EgressSecrets | null } | undefined;

interface Caller {
  id: string;
  policy: EgressPolicy;
  secrets: EgressSecrets;
  /** The host a TLS connection asked for (its SNI): the only one its requests may name. */
  servername: string | null;
}

/**
 * The sandboxes' egress proxy for secrets. A sandbox with secret rules resolves the rules' hosts
 * to its gateway (dns.ts) and its connections there on ports 80 and 443 are redirected here by
 * the firewall. TLS is terminated only for hosts with a rule (a certificate from the sandbox's
 * own CA; any other name fails the handshake); each request's headers have the placeholders of
 * the rules for its host replaced by their values, and it goes on to the real host (verified
 * TLS for 443) if the sandbox's policy lets it reach that address. The values live only here,
 * in the server's memory: never in the sandbox, its checkpoints, the store in clear, or a log.
 */
export class EgressProxy {
  private plain: TcpServer | undefined;
  private tls: TcpServer | undefined;
  private readonly http: HttpServer;
  private readonly callers = new WeakMap<Socket, Caller>();
  private readonly open = new Map<string, number>();
  private readonly certificates = new Map<string, Promise<SecureContext>>();
  private readonly agent: Agent;
  private readonly resolver = new Resolver({ timeout: 2000, tries: 2 });
  private readonly bodies = new BodyBudget();
  private readonly spool: BodySpool | undefined;

  constructor(
    private readonly gateway: string,
    private readonly lookup: ProxyLookup,
    private readonly upstreams: () => Promise<string[]>,
    /** CA certificates upstream hosts may also be signed by (PEM), beyond the system's. */
    upstreamCa: string | undefined,
    /** The sandboxes' subnet: never reached through the proxy. */
    private readonly sandboxesCidr: string,
    private readonly log: Logger,
    /** Where bodies too long to hold in memory are written to keep their stated length. */
    spoolDir?: string,
  ) {
    this.spool = spoolDir ? { dir: spoolDir, budget: new BodyBudget(BODIES_SPOOLED_PER_SANDBOX, BODIES_SPOOLED_TOTAL) } : undefined;
    this.http = createHttpServer({ headersTimeout: HEADERS_TIMEOUT_MS, requestTimeout: REQUEST_TIMEOUT_MS }, (req, res) => void this.handle(req, res));
    this.agent = new Agent({
      connectTimeout: UPSTREAM_CONNECT_MS,
      headersTimeout: REQUEST_TIMEOUT_MS,
      bodyTimeout: REQUEST_TIMEOUT_MS,
      connect: upstreamCa ? { ca: [...rootCertificates, upstreamCa] } : {},
    });
  }

  /** The ports it listens on, on the gateway (the firewall redirects 80 and 443 to them). */
  ports(): { http: number; https: number } {
    return { http: (this.plain!.address() as AddressInfo).port, https: (this.tls!.address() as AddressInfo).port };
  }

  async start(): Promise<void> {
    const listen = (server: TcpServer) => new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, this.gateway, () => {
        server.off('error', reject);
        resolve();
      });
    });
    this.plain = createTcpServer((socket) => this.accept(socket, false));
    this.tls = createTcpServer((socket) => this.accept(socket, true));
    await Promise.all([listen(this.plain), listen(this.tls)]);
  }

  close(): void {
    this.plain?.close();
    this.tls?.close();
    this.plain = this.tls = undefined;
    this.http.close();
    this.http.closeAllConnections();
    if (!this.agent.destroyed) this.agent.destroy().catch(() => {});
  }

  /** A sandbox's connection: known, with rules, within its bound; TLS terminated by name. */
  private accept(socket: Socket, tls: boolean): void {
    socket.on('error', () => {});
    const who = socket.remoteAddress ? this.lookup(socket.remoteAddress.replace(/^::ffff:/, '')) : undefined;
    if (!who?.secrets?.rules.length || (this.open.get(who.id) ?? 0) >= PROXY_CONNECTIONS_PER_SANDBOX) {
      socket.destroy();
      return;
    }
    const { id, policy, secrets } = { ...who, secrets: who.secrets };
    this.open.set(id, (this.open.get(id) ?? 0) + 1);
    socket.once('close', () => {
      const left = (this.open.get(id) ?? 1) - 1;
      if (left > 0) this.open.set(id, left);
      else this.open.delete(id);
    });
    if (!tls) {
      this.callers.set(socket, { id, policy, secrets, servername: null });
      this.http.emit('connection', socket);
      return;
    }
    const secure = new TLSSocket(socket, {
      isServer: true,
      SNICallback: (name, done) => {
        const host = name.toLowerCase();
        if (!rulesFor(secrets.rules, host).length) return done(new Error(`no secret rule for ${host}`));
        this.contextFor(id, secrets, host).then((ctx) => done(null, ctx), (err: Error) => done(err));
      },
    });
    secure.on('error', () => socket.destroy());
    const handshake = setTimeout(() => secure.destroy(), HANDSHAKE_TIMEOUT_MS);
    secure.once('close', () => clearTimeout(handshake));
    secure.once('secure', () => {
      clearTimeout(handshake);
      this.callers.set(secure, { id, policy, secrets, servername: (secure as TLSSocket & { servername?: string }).servername?.toLowerCase() ?? null });
      this.http.emit('connection', secure);
    });
  }

  private contextFor(id: string, secrets: EgressSecrets, host: string): Promise<SecureContext> {
    const key = `${id} ${host}`;
    let ctx = this.certificates.get(key);
    if (!ctx) {
      // The sandbox's own oldest goes first when it has its share; the oldest of all at the cap.
      const own = [...this.certificates.keys()].filter((k) => k.startsWith(`${id} `));
      if (own.length >= CERTIFICATES_PER_SANDBOX) this.certificates.delete(own[0]!);
      else if (this.certificates.size >= MAX_CERTIFICATES) this.certificates.delete(this.certificates.keys().next().value!);
      ctx = issueServerCertificate(secrets.ca, host).then((c) => createSecureContext({ cert: c.certPem + secrets.ca.certPem, key: c.keyPem }));
      ctx.catch(() => this.certificates.delete(key));
      this.certificates.set(key, ctx);
    }
    return ctx;
  }

  /** The sandbox's instance was deleted or its rules changed: its certificates go. */
  forget(id: string): void {
    for (const key of [...this.certificates.keys()]) if (key.startsWith(`${id} `)) this.certificates.delete(key);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const caller = this.callers.get(req.socket);
    const refuse = (status: number, why: string) => {
      if (!res.headersSent) res.writeHead(status, { 'content-type': 'text/plain', connection: 'close' });
      res.end(`forkpoint egress proxy: ${why}\n`);
    };
    if (!caller) return refuse(403, 'not a sandbox with secret rules');
    // Origin-form only: a proxy-style absolute URL would name its own host past the checks below.
    if (!req.url?.startsWith('/')) return refuse(400, 'a request to the proxy names a path, not a URL');
    const host = (caller.servername ?? hostOf(req.headers.host)).toLowerCase();
    const rules = rulesFor(caller.secrets.rules, host);
    if (!host || !rules.length) return refuse(403, `no secret rule for ${host || 'this request'}`);
    if (caller.servername && hostOf(req.headers.host).toLowerCase() !== caller.servername) return refuse(421, 'the Host header is not the TLS server name');
    try {
      const address = await this.resolve(host);
      if (!address || !egressAllows(caller.policy, host, address, this.sandboxesCidr)) return refuse(403, `the instance's network policy does not let it reach ${host}`);
      const headers: Record<string, string | string[]> = {};
      for (const [name, value] of Object.entries(req.headers)) {
        if (value === undefined || HOP_BY_HOP.has(name)) continue;
        headers[name] = Array.isArray(value) ? value.map((v) => substituteText(v, rules)) : substituteText(value, rules);
      }
      // In the path and query, the value as a URL component (a key in `?key=`).
      const target = substituteText(req.url, rules, encodeURIComponent);
      // To the address checked above, not the name again (a second answer could be another
      // address); the name goes as Host and as the TLS server name, which the certificate must match.
      const origin = caller.servername ? `https://${address}:443` : `http://${address}:80`;
      const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
      const body = hasBody ? await bodyWithSecrets(caller.id, req, headers, rules, this.bodies, this.spool) : null;
      const upstream = await request(`${origin}${target}`, {
        method: (req.method ?? 'GET') as 'GET',
        headers: { ...headers, host },
        body: body?.body ?? null,
        dispatcher: this.agent,
        signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      }).finally(() => body?.release());
      const out: Record<string, string | string[]> = {};
      for (const [name, value] of Object.entries(upstream.headers)) if (value !== undefined && !HOP_BY_HOP.has(name)) out[name] = value;
      res.writeHead(upstream.statusCode, out);
      await pipeline(upstream.body, res);
    } catch (err) {
      this.log.warn({ instance: caller.id, host, err: (err as Error).message }, 'a request through the egress proxy failed');
      if (!res.headersSent) refuse(502, `${host} could not be reached: ${(err as Error).message}`);
      else res.destroy();
    }
  }

  /** The host's address, from the sandboxes' upstream resolvers (an address itself as it is). */
  private async resolve(host: string): Promise<string | undefined> {
    if (isIP(host) === 4) return host;
    this.resolver.setServers(await this.upstreams());
    const ips = await this.resolver.resolve4(host).catch(() => [] as string[]);
    return ips[0];
  }
}

const hostOf = (header: string | undefined) => (header ?? '').replace(/:\d+$/, '');

const rulesFor = (rules: SecretRule[], host: string) => rules.filter((r) => r.hosts.some((h) => hostMatches(h, host)));
