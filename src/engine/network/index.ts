import { writeFile } from 'node:fs/promises';
import { execa } from 'execa';
import type { Logger } from 'pino';
import { EngineError } from '../../seam/errors.js';
import type { EgressSecrets, NetworkCounters } from '../../seam/runtime.js';
import { gatewayOf, linkPrefixOf, macOf, nextFree, parseCidr, toIp, type Subnet } from '../../lib/ipv4.js';
import { DnsForwarder, hostResolvers } from './dns.js';
import { EgressProxy } from './egress-proxy.js';
import { Firewall, type FirewallEntry } from './firewall.js';
import { linkCounters, newHostIf, setUpLink, type LinkRequest, type SandboxNetwork } from './link.js';
import type { EgressPolicy } from '../../lib/egress-policy.js';

export type { EgressPolicy } from '../../lib/egress-policy.js';
export { DEFAULT_POLICY, parseEntry } from '../../lib/egress-policy.js';
export type { SandboxNetwork } from './link.js';
export type { FirewallEntry } from './firewall.js';

export interface NetworkOptions {
  agentPath: string;
  /** The sandboxes' subnet; the host keeps its first address (the gateway). */
  cidr: string;
  /** Resolvers the sandboxes' DNS asks; default: the host's resolv.conf. */
  dnsServers?: string[] | undefined;
  /** CA certificates (PEM) the egress proxy also trusts for upstream hosts. */
  upstreamCa?: string | undefined;
  /** Where the egress proxy writes request bodies too long to hold in memory (egress-proxy.ts). */
  spoolDir?: string;
  log: Logger;
}

export type { NetworkCounters } from '../../seam/runtime.js';

/**
 * The sandboxes' network on this host: one routed veth per sandbox (no bridge), the host's
 * firewall table for the subnet, and the sandboxes' DNS on the gateway. Each server has a subnet
 * of its own, and its links, table and resolver are named after it, so that two servers on one
 * host (tests, benchmarks) leave each other alone.
 */
/** How many released addresses are handed out again only when no other is free (allocate). */
const RECENTLY_RELEASED = 64;

export class Network {
  readonly subnet: Subnet;
  readonly gateway: string;
  /** Host-side link names of this server's sandboxes start with it. */
  readonly linkPrefix: string;
  private readonly firewall: Firewall;
  private readonly dns: DnsForwarder;
  private readonly proxy: EgressProxy;
  private readonly byAddress = new Map<string, { id: string; policy: EgressPolicy; secrets: EgressSecrets | null }>();
  /** The current host-side link of each sandbox, and the bytes of the links it had before. */
  private readonly links = new Map<string, { hostIf: string; before: NetworkCounters }>();
  /** Addresses released lately, the latest last. */
  private released: string[] = [];

  constructor(private readonly opts: NetworkOptions) {
    this.subnet = parseCidr(opts.cidr);
    this.gateway = gatewayOf(this.subnet);
    const cidr = `${toIp(this.subnet.base)}/${this.subnet.prefix}`;
    this.linkPrefix = linkPrefixOf(cidr);
    this.firewall = new Firewall(cidr, this.gateway, this.linkPrefix, `forkpoint_${this.linkPrefix}`);
    const upstreams = async () => opts.dnsServers ?? (await hostResolvers());
    this.dns = new DnsForwarder(this.gateway, upstreams, {
      policyOf: (address) => {
        const e = this.byAddress.get(address);
        return e && { id: e.id, policy: e.policy, proxiedHosts: e.secrets?.rules.flatMap((r) => r.hosts) ?? [] };
      },
      learn: (id, ips, ttl) => this.firewall.learn(id, ips, ttl),
    }, opts.log);
    this.proxy = new EgressProxy(this.gateway, (address) => this.byAddress.get(address), upstreams, opts.upstreamCa, cidr, opts.log, opts.spoolDir);
  }

  /** Readies the host: the gateway address, forwarding, the firewall with these sandboxes in it,
   * the DNS. */
  async init(entries: FirewallEntry[]): Promise<void> {
    const ip = await execa('ip', ['addr', 'replace', `${this.gateway}/32`, 'dev', 'lo'], { reject: false });
    if (ip.exitCode !== 0) throw new EngineError('NETWORK_FAILED', `the gateway address: ${ip.stderr.trim()}`);
    // Routing between the sandboxes' links and the host's: the firewall decides what passes.
    await writeFile('/proc/sys/net/ipv4/ip_forward', '1');
    try {
      // Listening first: the firewall redirects sandboxes' ports 80 and 443 to its ports.
      await this.proxy.start();
      await this.firewall.init(entries, this.proxy.ports());
      for (const e of entries) this.byAddress.set(e.address, { id: e.id, policy: e.policy, secrets: e.secrets ?? null });
      await this.dns.start();
    } catch (err) {
      // A start that fails here leaves nothing on the host's network, unless sandboxes left
      // running use it (they keep their gateway for the next start).
      if (entries.length === 0) await this.destroy().catch(() => {});
      throw err;
    }
  }

  /** A free address of the subnet (`used`: every instance's), with its MAC; none when the
   * subnet is full (the caller says so: a pool running out is not an engine failure). */
  allocate(used: Set<string>): SandboxNetwork | undefined {
    // Recently released ones last: their firewall entries may still be waiting to go
    // (Firewall.retired), and replacing one costs the new sandbox a removal's grace period.
    const address = nextFree(this.subnet, used, new Set(this.released));
    return address ? { address, mac: macOf(address) } : undefined;
  }

  /** Puts a sandbox's policy in force (a new one, or a change), and its secret rules
   * (undefined: those it has). */
  async setPolicy(id: string, address: string, policy: EgressPolicy, secrets?: EgressSecrets | null): Promise<void> {
    const prev = this.byAddress.get(address);
    const kept = secrets === undefined ? (prev?.id === id ? prev.secrets : null) : secrets;
    await this.firewall.set({ id, address, policy, secrets: kept });
    this.byAddress.set(address, { id, policy, secrets: kept });
    if (secrets !== undefined) this.proxy.forget(id);
  }

  /** A deleted instance's rules go; its address is free again. */
  async forget(id: string): Promise<void> {
    for (const [address, e] of [...this.byAddress]) if (e.id === id) await this.release(id, address);
  }

  async release(id: string, address: string): Promise<void> {
    this.byAddress.delete(address);
    this.proxy.forget(id);
    this.links.delete(id);
    this.firewall.remove(id, address);
    this.released = [...this.released.filter((a) => a !== address), address].slice(-RECENTLY_RELEASED);
  }

  /** A new link for a sandbox about to be booted or restored. The bytes of the one it replaces
   * are carried over. */
  async newLink(id: string, net: SandboxNetwork): Promise<LinkRequest> {
    const prev = this.links.get(id);
    const before = prev ? this.countersOf(prev) : { sentBytes: 0, receivedBytes: 0 };
    const hostIf = newHostIf(this.linkPrefix);
    this.links.set(id, { hostIf, before });
    return { hostIf, address: net.address, gateway: this.gateway, mac: net.mac };
  }

  /** The link made for `from` (a rollback's standby, under a name of its own) is `id`'s from
   * now on; the bytes of the one it replaces are carried over. */
  takeLink(id: string, from: string): void {
    const l = this.links.get(from);
    if (!l) return;
    const prev = this.links.get(id);
    this.links.delete(from);
    this.links.set(id, { hostIf: l.hostIf, before: prev ? this.countersOf(prev) : l.before });
  }

  /** The host's end of the sandbox's link. */
  linkOf(id: string): string | undefined {
    return this.links.get(id)?.hostIf;
  }

  /** A link made for a sandbox that is gone without taking it (a standby's). */
  dropLink(id: string): void {
    this.links.delete(id);
  }

  /** Makes the link of a booted sandbox (a restore's is made by its restorer). */
  async connectBooted(pid: number, link: LinkRequest): Promise<void> {
    await setUpLink(this.opts.agentPath, pid, link);
  }

  private countersOf(l: { hostIf: string; before: NetworkCounters }): NetworkCounters {
    const now = linkCounters(l.hostIf);
    return { sentBytes: l.before.sentBytes + (now?.sent ?? 0), receivedBytes: l.before.receivedBytes + (now?.received ?? 0) };
  }

  /** Bytes the sandbox sent and received since this server started. */
  counters(id: string): NetworkCounters {
    const l = this.links.get(id);
    return l ? this.countersOf(l) : { sentBytes: 0, receivedBytes: 0 };
  }

  /** What resolv.conf a sandbox gets. */
  get resolvConf(): string {
    return `# forkpoint: the sandbox's resolver, on its gateway\nnameserver ${this.gateway}\noptions timeout:2 attempts:2\n`;
  }

  close(): void {
    this.dns.close();
    this.proxy.close();
    this.firewall.close();
  }

  /** Removes the firewall table and the gateway address: no sandbox of this server is left. */
  async destroy(): Promise<void> {
    this.dns.close();
    this.proxy.close();
    this.firewall.close();
    try {
      await this.firewall.destroy();
    } finally {
      await execa('ip', ['addr', 'del', `${this.gateway}/32`, 'dev', 'lo'], { reject: false });
    }
  }
}
