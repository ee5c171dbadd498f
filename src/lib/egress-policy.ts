import { isIP } from 'node:net';
import { contains, parseCidr, toIp } from './ipv4.js';

/** Where a sandbox may open connections to. Entries are IPv4 addresses, CIDRs or host names
 * (`example.com`, or `*.example.com` for its subdomains). A `deny` entry wins over an `allow`
 * one; private ranges are closed unless an `allow` entry opens them. */
export interface EgressPolicy {
  egress: 'allow' | 'deny';
  allow: string[];
  deny: string[];
}

export const DEFAULT_POLICY: EgressPolicy = { egress: 'allow', allow: [], deny: [] };

/** Closed to every sandbox whatever its policy: link-local (cloud metadata), loopback,
 * "this network", multicast and reserved. */
export const ALWAYS_CLOSED = ['169.254.0.0/16', '127.0.0.0/8', '0.0.0.0/8', '224.0.0.0/4', '240.0.0.0/4'];
/** Closed unless allowed: the networks a host usually sits in (RFC 1918, CGNAT). */
export const PRIVATE = ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10'];

const HOST = /^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

export type Entry = { kind: 'cidr'; cidr: string } | { kind: 'host'; name: string; subdomains: boolean };

/** An entry in the one form the firewall writes (a CIDR re-printed from numbers, a lower-case
 * name), or undefined if it is neither. Nothing else reaches an nft script. */
export function parseEntry(raw: string): Entry | undefined {
  const s = raw.trim().toLowerCase();
  const [addr, len] = s.split('/');
  if (addr && isIP(addr) === 4 && (len === undefined || /^\d{1,2}$/.test(len))) {
    try {
      const c = parseCidr(s);
      return { kind: 'cidr', cidr: `${toIp(c.base)}/${c.prefix}` };
    } catch {
      return undefined;
    }
  }
  if (s.length > 253 || !HOST.test(s) || isIP(s)) return undefined;
  return s.startsWith('*.') ? { kind: 'host', name: s.slice(2), subdomains: true } : { kind: 'host', name: s, subdomains: false };
}

/** Whether a DNS name is covered by a host entry. */
export function nameMatches(entry: Extract<Entry, { kind: 'host' }>, name: string): boolean {
  const n = name.toLowerCase().replace(/\.$/, '');
  return n === entry.name || (entry.subdomains && n.endsWith(`.${entry.name}`));
}

/** Whether a host name pattern (`api.example.com`, or `*.example.com` for its subdomains) names
 * `host`. */
export function hostMatches(pattern: string, host: string): boolean {
  const e = parseEntry(pattern);
  return e?.kind === 'host' && nameMatches(e, host);
}

/**
 * What the firewall would decide for a connection to `ip` (reached as `name`) under `policy`:
 * the egress proxy connects on a sandbox's behalf and must allow no more. Never the always-closed
 * ranges or `sandboxes` (the sandboxes' own subnet); then deny, then allow (by address or name),
 * then private ranges closed, then the policy's default.
 */
export function egressAllows(policy: EgressPolicy, name: string, ip: string, sandboxes?: string): boolean {
  const inAny = (cidrs: string[]) => cidrs.some((c) => contains(parseCidr(c), ip));
  if (inAny([...ALWAYS_CLOSED, ...(sandboxes ? [sandboxes] : [])])) return false;
  const matches = (list: string[]) =>
    list.some((raw) => {
      const e = parseEntry(raw);
      return e?.kind === 'cidr' ? contains(parseCidr(e.cidr), ip) : e?.kind === 'host' ? nameMatches(e, name) : false;
    });
  if (matches(policy.deny)) return false;
  if (matches(policy.allow)) return true;
  if (inAny(PRIVATE)) return false;
  return policy.egress === 'allow';
}
