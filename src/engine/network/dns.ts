import { createSocket, type Socket } from 'node:dgram';
import { readFile } from 'node:fs/promises';
import { isIP } from 'node:net';
import dnsPacket from 'dns-packet';
import type { Logger } from 'pino';
import { hostMatches, nameMatches, parseEntry, type EgressPolicy } from '../../lib/egress-policy.js';

/** How long an upstream has to answer before the next one is asked. */
const UPSTREAM_TIMEOUT_MS = 2000;
const MAX_QUERY = 512;
/** Queries under way at once, over all sandboxes (each holds a socket), and for one sandbox: a
 * sandbox flooding a name no resolver answers has its own queries dropped, not the others'. */
const MAX_IN_FLIGHT = 512;
export const MAX_IN_FLIGHT_PER_SANDBOX = 16;

export interface DnsLookup {
  /** The sandbox at a source address, its policy, and the hosts of its secret rules (reached
   * through the egress proxy, on the gateway). */
  policyOf(address: string): { id: string; policy: EgressPolicy; proxiedHosts: string[] } | undefined;
  /** Addresses an answer gave for a name the policy allows: opened before the answer reaches
   * the sandbox, so that the connection that follows finds them. */
  learn(id: string, ips: string[], ttlS: number): Promise<void>;
}

/** The nameservers of the host's resolv.conf. */
export async function hostResolvers(): Promise<string[]> {
  const text = await readFile('/etc/resolv.conf', 'utf8').catch(() => '');
  return [...text.matchAll(/^\s*nameserver\s+(\S+)/gm)].map((m) => m[1]!).filter((ip) => isIP(ip) === 4);
}

/**
 * The sandboxes' resolver, on the gateway's port 53: it forwards their queries to the host's
 * resolvers (which they could not reach themselves: they are the host's, often on loopback or
 * in a private range), answers REFUSED to a sandbox whose egress is denied for names its policy
 * does not list, NXDOMAIN for names it denies, and tells the firewall the addresses of names it
 * allows. Each query goes upstream from a socket of its own (a fresh random port).
 */
export class DnsForwarder {
  private socket: Socket | undefined;
  private inFlight = 0;
  private readonly inFlightOf = new Map<string, number>();

  constructor(
    private readonly gateway: string,
    private readonly upstreams: () => Promise<string[]>,
    private readonly lookup: DnsLookup,
    private readonly log: Logger,
    private readonly port = 53,
  ) {}

  async start(): Promise<void> {
    const s = createSocket({ type: 'udp4', reuseAddr: true });
    // A query is a sandbox's bytes: whatever it makes fail is logged, never thrown at the server.
    s.on('message', (msg, from) => void this.answer(msg, from.address, from.port).catch((err: unknown) => this.log.warn({ err, from: from.address }, 'sandbox DNS query dropped')));
    s.on('error', (err) => this.log.warn({ err }, 'sandbox DNS socket error'));
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.bind(this.port, this.gateway, () => {
        s.off('error', reject);
        resolve();
      });
    });
    this.socket = s;
  }

  close(): void {
    this.socket?.close();
    this.socket = undefined;
  }

  private reply(query: dnsPacket.Packet, rcode: string, to: string, port: number): void {
    const answer = dnsPacket.encode({ id: query.id, type: 'response', flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE, rcode, questions: query.questions } as dnsPacket.Packet);
    this.socket?.send(answer, port, to);
  }

  private answerProxied(query: dnsPacket.Packet, to: string, port: number): void {
    const q = query.questions![0]!;
    const answers: dnsPacket.Answer[] = q.type === 'A' ? [{ type: 'A', name: q.name, ttl: 5, data: this.gateway }] : [];
    const answer = dnsPacket.encode({ id: query.id, type: 'response', flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE, rcode: 'NOERROR', questions: query.questions, answers } as dnsPacket.Packet);
    this.socket?.send(answer, port, to);
  }

  private async answer(msg: Buffer, from: string, port: number): Promise<void> {
    const who = this.lookup.policyOf(from);
    if (!who || msg.length > MAX_QUERY || this.inFlight >= MAX_IN_FLIGHT) return;
    if ((this.inFlightOf.get(who.id) ?? 0) >= MAX_IN_FLIGHT_PER_SANDBOX) return;
    let query: dnsPacket.Packet;
    try {
      query = dnsPacket.decode(msg);
    } catch {
      return; // not DNS: no answer
    }
    const name = query.questions?.[0]?.name;
    if (query.type !== 'query' || query.questions?.length !== 1 || !name) return this.reply(query, 'FORMERR', from, port);
    // A host of a secret rule is the egress proxy's, on the gateway: its own address, A only.
    if (who.proxiedHosts.some((h) => hostMatches(h, name))) return this.answerProxied(query, from, port);
    const entries = (list: string[]) => list.map(parseEntry).flatMap((e) => (e?.kind === 'host' && nameMatches(e, name) ? [e] : []));
    const denied = entries(who.policy.deny).length > 0;
    const allowed = entries(who.policy.allow).length > 0;
    if (denied) return this.reply(query, 'NXDOMAIN', from, port);
    if (who.policy.egress === 'deny' && !allowed) return this.reply(query, 'REFUSED', from, port);
    this.inFlight++;
    this.inFlightOf.set(who.id, (this.inFlightOf.get(who.id) ?? 0) + 1);
    try {
      const answer = await this.forward(msg);
      if (!answer) return this.reply(query, 'SERVFAIL', from, port);
      if (allowed) {
        const parsed = dnsPacket.decode(answer);
        const a = (parsed.answers ?? []).filter((r): r is dnsPacket.StringAnswer => r.type === 'A');
        if (a.length) await this.lookup.learn(who.id, a.map((r) => r.data), Math.max(...a.map((r) => r.ttl ?? 60)));
      }
      this.socket?.send(answer, port, from);
    } catch (err) {
      this.log.warn({ err, sandbox: who.id, name }, 'sandbox DNS query failed');
      this.reply(query, 'SERVFAIL', from, port);
    } finally {
      this.inFlight--;
      const left = (this.inFlightOf.get(who.id) ?? 1) - 1;
      if (left > 0) this.inFlightOf.set(who.id, left);
      else this.inFlightOf.delete(who.id);
    }
  }

  /** The first upstream answer with the query's id, or undefined. */
  private async forward(msg: Buffer): Promise<Buffer | undefined> {
    const id = msg.readUInt16BE(0);
    for (const server of await this.upstreams()) {
      const got = await new Promise<Buffer | undefined>((resolve) => {
        const s = createSocket('udp4');
        const done = (b: Buffer | undefined) => {
          clearTimeout(timer);
          s.close();
          resolve(b);
        };
        const timer = setTimeout(() => done(undefined), UPSTREAM_TIMEOUT_MS);
        s.on('error', () => done(undefined));
        s.on('message', (b) => b.length >= 12 && b.readUInt16BE(0) === id && done(b));
        s.send(msg, 53, server);
      });
      if (got) return got;
    }
    return undefined;
  }
}
