import { EngineError } from '../../seam/errors.js';
import { startPiped, type PipedRun } from '../run.js';
import type { FirewallEntry } from '../../seam/runtime.js';
import { ALWAYS_CLOSED, parseEntry, PRIVATE, type EgressPolicy } from '../../lib/egress-policy.js';

const ID = /^inst_[a-z0-9]{1,40}$/;
/** What a sandbox's refused connection gets: an immediate "administratively prohibited", so that
 * its tools fail at once instead of waiting out their timeouts. */
const REJECT = 'reject with icmpx type admin-prohibited';

export type { FirewallEntry } from '../../seam/runtime.js';

const NFT_DEADLINE_MS = 10_000;
// By the engine's spawner (run.ts): Node forking itself for each nft was ~2 ms of the event loop
// a run, ~45 runs in a burst of 100 forks. Its stdin ending (the server gone) ends it, unapplied.
const startNft = (): PipedRun => startPiped('nft', ['-f', '-']);

/** Removals wait for this long without any other script, at most REMOVAL_MAX_DELAY_MS (see
 * `retired`). */
const REMOVAL_QUIET_MS = 250;
const REMOVAL_MAX_DELAY_MS = 2000;

const chainOf = (id: string) => `egress_${id}`;
const learnedOf = (id: string) => `learned_${id}`;

function checkId(id: string): void {
  if (!ID.test(id)) throw new EngineError('NETWORK_FAILED', `not an instance id: ${id}`);
}

/**
 * The host's nftables rules for the sandboxes' network, in a table of their own: the host is reached only at the gateway's DNS, nothing new comes in to a
 * sandbox, a sandbox's connections out go through its own chain (its policy), and leave by
 * masquerade. Sandboxes cannot change any of it: it lives in the host's netns.
 */
export class Firewall {
  /** `inet <name>` */
  private readonly table: string;
  /** The sandboxes in the table now, by address, with their chain (nft 1.0 has no "delete if
   * there": a script may only delete what is there). */
  private readonly present = new Map<string, string>();

  constructor(
    private readonly cidr: string,
    private readonly gateway: string,
    /** The host-side links of the sandboxes are named with it. */
    private readonly linkPrefix: string,
    name: string,
  ) {
    this.table = `inet ${name}`;
  }

  /** An `nft -f -` started ahead, waiting for its script on stdin: starting nft (the server's
   * spawn and nft's own start-up) is most of a policy's cost, and a fork's policy goes in beside
   * its restore, whose CPU it took (a fork in a user namespace: 43 ms p50, 33 ms with the nft
   * already started). Its stdin closed unwritten (the server gone), it applies nothing. */
  private spare: PipedRun | undefined;
  private closed = false;

  /**
   * Deleted sandboxes' entries, by address, waiting to be removed together in a quiet moment:
   * nf_tables commits a transaction that deletes anything published only after an RCU grace
   * period (~15 ms here), holding its commit lock, so that a new sandbox's entry queued behind a
   * removal waited that long, and a fork's answer with it (one removal or twenty cost the same).
   * A deleted sandbox's entry is harmless meanwhile: its link is gone, and the prerouting check
   * drops its address coming from any other link. An address taken again before its removal
   * has the old entry replaced in the same transaction (`set`); the network hands out recently
   * released addresses last. A restart rebuilds the table from the live sandboxes (`init`).
   */
  private readonly retired = new Map<string, string>();
  private retiredSince: number | undefined;
  private lastApplied = 0;
  private retireTimer: NodeJS.Timeout | undefined;

  /** Ends the waiting nft; scripts applied from now on start their own. */
  close(): void {
    this.closed = true;
    this.spare?.kill();
    this.spare = undefined;
    clearTimeout(this.retireTimer);
    this.retireTimer = undefined;
  }

  /** Scripts waiting for the nft run under way to end; the next run applies them together. */
  private readonly queued: { script: string; done: (err: unknown) => void }[] = [];
  private draining = false;

  /** Applies `script`: at once if no nft runs, else with whatever else is waiting, in one run
   * once the current one ends. A burst of forks (100 at once) made 100 nft processes, each a
   * spawn of the server (a fork of its whole address space) and a start of nft: ~3 ms of CPU a
   * fork; together they are a few runs. */
  private apply(script: string): Promise<void> {
    this.lastApplied = performance.now();
    return new Promise<void>((resolve, reject) => {
      this.queued.push({ script, done: (err) => (err === undefined ? resolve() : reject(err)) });
      if (!this.draining) void this.drain();
    });
  }

  private async drain(): Promise<void> {
    this.draining = true;
    try {
      while (this.queued.length) {
        const batch = this.queued.splice(0);
        const err = await this.run(batch.map((b) => b.script).join('\n')).then(() => undefined, (e: unknown) => e);
        if (err === undefined || batch.length === 1 || (err instanceof EngineError && err.code === 'TIMEOUT')) {
          for (const b of batch) b.done(err);
          continue;
        }
        // A run is all or nothing: one script that nft refuses failed the others with it, and
        // nothing of the batch went in. Each alone says whose it was.
        for (const b of batch) b.done(await this.run(b.script).then(() => undefined, (e: unknown) => e));
      }
    } finally {
      this.draining = false;
    }
  }

  private async run(script: string): Promise<void> {
    // A spare that ended meanwhile (killed by someone) is not used: its script would be lost.
    const spare = this.spare && !this.spare.ended ? this.spare : undefined;
    const nft = spare ?? startNft();
    this.spare = undefined;
    nft.feed(script);
    let late = false;
    const deadline = setTimeout(() => {
      late = true;
      nft.kill();
    }, NFT_DEADLINE_MS);
    const r = await nft.result.finally(() => clearTimeout(deadline));
    // The next one starts a moment later, not in the way of what this one was for.
    setTimeout(() => {
      if (!this.closed) this.spare ??= startNft();
    }, 25).unref();
    if (late) throw new EngineError('TIMEOUT', `nft did not finish within ${NFT_DEADLINE_MS / 1000} s`);
    if (r.code !== 0) throw new EngineError('NETWORK_FAILED', `nft: ${(r.stderr || `exit ${r.code}`).trim().split('\n').slice(0, 3).join(' / ')}`);
  }

  /** The whole table, from scratch, with these sandboxes in it. `proxy`: the egress proxy's
   * ports on the gateway, where sandboxes with secret rules reach ports 80 and 443. */
  async init(entries: FirewallEntry[], proxy: { http: number; https: number }): Promise<void> {
    const fp = `"${this.linkPrefix}*"`;
    const base = `
add table ${this.table}
delete table ${this.table}
table ${this.table} {
  set sandboxes { type ipv4_addr; }
  set proxied { type ipv4_addr; }
  map egress { type ipv4_addr : verdict; }
  chain proxy_redirect {
    type nat hook prerouting priority dstnat; policy accept;
    # A sandbox with secret rules reaches the hosts of its rules at the gateway (its DNS says so):
    # ports 80 and 443 there are the egress proxy's.
    iifname ${fp} ip saddr @proxied ip daddr ${this.gateway} tcp dport 80 dnat ip to ${this.gateway}:${proxy.http}
    iifname ${fp} ip saddr @proxied ip daddr ${this.gateway} tcp dport 443 dnat ip to ${this.gateway}:${proxy.https}
  }
  chain prerouting {
    type filter hook prerouting priority raw; policy accept;
    # A sandbox sends only as itself: the source must route back out of the link it came in
    # by (strict reverse-path, whatever the host's rp_filter); another sandbox's address, the
    # gateway's or the host's do not, and are dropped before conntrack sees them.
    iifname ${fp} fib saddr . iif oif missing drop
  }
  chain input {
    type filter hook input priority filter - 1; policy accept;
    iifname ${fp} ct state established,related accept
    # The resolver is UDP only: TCP 53 of the gateway would be whatever host service binds it.
    iifname ${fp} ip daddr ${this.gateway} udp dport 53 accept
    iifname ${fp} ip daddr ${this.gateway} icmp type echo-request accept
    iifname ${fp} ip saddr @proxied ip daddr ${this.gateway} tcp dport { ${proxy.http}, ${proxy.https} } ct status dnat accept
    iifname ${fp} ${REJECT}
    ip daddr ${this.cidr} iifname != "lo" drop
  }
  chain forward {
    type filter hook forward priority filter - 1; policy accept;
    iifname ${fp} jump from_sandbox
    oifname ${fp} ct state established,related accept
    oifname ${fp} drop
  }
  chain from_sandbox {
    meta nfproto ipv6 drop
    ct state established,related accept
    ip saddr != @sandboxes drop
    ip daddr { ${ALWAYS_CLOSED.join(', ')} } ${REJECT}
    ip saddr vmap @egress
    drop
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr ${this.cidr} oifname != ${fp} masquerade
  }
}
`;
    this.present.clear();
    this.retired.clear();
    await this.apply(base + entries.map((e) => this.entryScript(e, false)).join(''));
    for (const e of entries) this.present.set(e.address, chainOf(e.id));
  }

  private entryScript(e: FirewallEntry, present: boolean): string {
    checkId(e.id);
    const addr = parseEntry(e.address);
    if (addr?.kind !== 'cidr' || !addr.cidr.endsWith('/32')) throw new EngineError('NETWORK_FAILED', `not an address: ${e.address}`);
    const ip = addr.cidr.slice(0, -3);
    const cidrs = (list: string[]) => list.map(parseEntry).flatMap((x) => (x?.kind === 'cidr' ? [x.cidr] : []));
    const deny = cidrs(e.policy.deny);
    const allow = cidrs(e.policy.allow);
    const chain = chainOf(e.id);
    const rules = [
      ...(deny.length ? [`ip daddr { ${deny.join(', ')} } ${REJECT}`] : []),
      ...(allow.length ? [`ip daddr { ${allow.join(', ')} } accept`] : []),
      `ip daddr @${learnedOf(e.id)} accept`,
      `ip daddr { ${[...PRIVATE, this.cidr].join(', ')} } ${REJECT}`,
      e.policy.egress === 'allow' ? 'accept' : REJECT,
    ];
    // A new entry's script deletes nothing (the address left the proxied set with its last
    // holder's removal): nf_tables frees what a transaction deleted after an RCU grace period,
    // and the nft that committed it holds the commit lock through that period as it exits
    // (~10 ms here), which every veth registered meanwhile waits for, the fork's own among them
    // (4.7 ms a fork in a user namespace on average, off-CPU traces of 11 forks).
    return `
add set ${this.table} ${learnedOf(e.id)} { type ipv4_addr; flags timeout; }
add chain ${this.table} ${chain}
flush chain ${this.table} ${chain}
${rules.map((r) => `add rule ${this.table} ${chain} ${r}`).join('\n')}
${present ? `delete element ${this.table} egress { ${ip} }\ndelete element ${this.table} sandboxes { ${ip} }\n${this.unproxy(ip)}` : ''}
add element ${this.table} sandboxes { ${ip} }
add element ${this.table} egress { ${ip} : jump ${chain} }
${e.secrets?.rules.length ? `add element ${this.table} proxied { ${ip} }` : ''}
`;
  }

  /** Adds a sandbox, or replaces its policy. */
  async set(e: FirewallEntry): Promise<void> {
    const stale = this.present.get(e.address);
    // A removal still waiting goes in with this script (below).
    this.retired.delete(e.address);
    // An address whose element still names another (deleted) instance's chain: that goes first.
    const script = stale && stale !== chainOf(e.id) ? this.removeScript(e.address, stale) + this.entryScript(e, false) : this.entryScript(e, stale !== undefined);
    await this.apply(script);
    this.present.set(e.address, chainOf(e.id));
  }

  /** Takes the address out of the proxied set whether or not it is in it (added first: nft 1.0
   * refuses to delete what is not there). */
  private unproxy(address: string): string {
    return `add element ${this.table} proxied { ${address} }\ndelete element ${this.table} proxied { ${address} }`;
  }

  private removeScript(address: string, chain: string): string {
    const id = chain.slice('egress_'.length);
    return `
delete element ${this.table} egress { ${address} }
delete element ${this.table} sandboxes { ${address} }
${this.unproxy(address)}
delete chain ${this.table} ${chain}
delete set ${this.table} ${learnedOf(id)}
`;
  }

  /** Takes a deleted sandbox's entry out, in the next quiet moment (`retired`). */
  remove(id: string, address: string): void {
    checkId(id);
    const chain = this.present.get(address);
    if (chain !== chainOf(id) || this.closed) return;
    this.retired.set(address, chain);
    this.retiredSince ??= performance.now();
    this.retireSoon(REMOVAL_QUIET_MS);
  }

  private retireSoon(delayMs: number): void {
    if (this.retireTimer) return;
    this.retireTimer = setTimeout(() => {
      this.retireTimer = undefined;
      if (!this.retired.size || this.closed) return;
      const now = performance.now();
      const quietFor = now - this.lastApplied;
      const busy = this.draining || quietFor < REMOVAL_QUIET_MS;
      if (busy && now - this.retiredSince! < REMOVAL_MAX_DELAY_MS) return this.retireSoon(Math.max(10, REMOVAL_QUIET_MS - quietFor));
      this.retireNow();
    }, delayMs);
    this.retireTimer.unref();
  }

  /** Removes every retired entry: one apply each, which the queue runs as one transaction (and
   * alone each if nft refuses the batch). One that fails stays present, for `set` to replace. */
  private retireNow(): void {
    const batch = [...this.retired];
    this.retired.clear();
    this.retiredSince = undefined;
    for (const [address, chain] of batch) {
      this.present.delete(address);
      this.apply(this.removeScript(address, chain)).catch(() => {
        if (!this.present.has(address)) this.present.set(address, chain);
      });
    }
  }

  /** Opens the addresses a sandbox's DNS answer gave for a name its policy allows, for as long
   * as the answer lives (at least 30 s). */
  async learn(id: string, ips: string[], ttlS: number): Promise<void> {
    checkId(id);
    const list = ips.map(parseEntry).flatMap((x) => (x?.kind === 'cidr' && x.cidr.endsWith('/32') ? [x.cidr.slice(0, -3)] : []));
    if (!list.length) return;
    const t = Math.max(30, Math.min(ttlS, 86400));
    await this.apply(`add element ${this.table} ${learnedOf(id)} { ${list.map((ip) => `${ip} timeout ${t}s`).join(', ')} }\n`);
  }

  /** Removes the table (tests; a host that stops running sandboxes). */
  async destroy(): Promise<void> {
    this.retired.clear();
    await this.apply(`add table ${this.table}\ndelete table ${this.table}\n`);
  }
}
