import { isIP } from 'node:net';
import { parseCidr, toIp } from './ipv4.js';

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
