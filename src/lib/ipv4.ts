/** IPv4 addresses of the sandboxes' network: pure arithmetic, no state. */
import { createHash } from 'node:crypto';

export interface Subnet {
  /** The network address, as a number. */
  base: number;
  prefix: number;
}

export function toNumber(ip: string): number {
  const parts = ip.split('.').map(Number);
  if (parts.length !== 4 || parts.some((p) => !Number.isInteger(p) || p < 0 || p > 255)) throw new Error(`not an IPv4 address: ${ip}`);
  return ((parts[0]! << 24) | (parts[1]! << 16) | (parts[2]! << 8) | parts[3]!) >>> 0;
}

export function toIp(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

export function parseCidr(cidr: string): Subnet {
  const [ip, len] = cidr.split('/');
  const prefix = Number(len ?? 32);
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > 32) throw new Error(`not a CIDR: ${cidr}`);
  const mask = prefix === 0 ? 0 : (~0 << (32 - prefix)) >>> 0;
  return { base: (toNumber(ip!) & mask) >>> 0, prefix };
}

export function contains(s: Subnet, ip: string): boolean {
  const mask = s.prefix === 0 ? 0 : (~0 << (32 - s.prefix)) >>> 0;
  return ((toNumber(ip) & mask) >>> 0) === s.base;
}

/** The gateway: the subnet's first host address (the host keeps it). */
export function gatewayOf(s: Subnet): string {
  return toIp(s.base + 1);
}

/** The lowest free address for a sandbox (after the gateway, before the broadcast); one of
 * `lastResort` only when every other is used. */
export function nextFree(s: Subnet, used: Set<string>, lastResort: ReadonlySet<string> = new Set()): string | undefined {
  const size = 2 ** (32 - s.prefix);
  let fallback: string | undefined;
  for (let i = 2; i < size - 1; i++) {
    const ip = toIp(s.base + i);
    if (used.has(ip)) continue;
    if (!lastResort.has(ip)) return ip;
    fallback ??= ip;
  }
  return fallback;
}

/** A locally administered MAC derived from the address: a fresh address is a fresh MAC. */
export function macOf(ip: string): string {
  const n = toNumber(ip);
  return ['02', 'f0', ...[n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].map((b) => b.toString(16).padStart(2, '0'))].join(':');
}

/** The prefix of the host-side link names, and of the firewall's table, of a server on `cidr`:
 * 3 hex digits of its hash, what IFNAMSIZ leaves beside a link's own 10. Two subnets share one 1
 * time in 4,096, and their servers would replace each other's table: the server locks its prefix
 * as it locks its subnet. */
export function linkPrefixOf(cidr: string): string {
  const s = parseCidr(cidr);
  return `fp${createHash('sha256').update(`${toIp(s.base)}/${s.prefix}`).digest('hex').slice(0, 3)}`;
}

/** A /24 inside 10.128.0.0/9 picked by hashing `seed` (a data directory): the subnet of a
 * server that shares its host with others (tests, benchmarks), the same on every restart. */
export function subnetFor(seed: string): string {
  let h = 2166136261;
  for (let i = 0; i < seed.length; i++) h = Math.imul(h ^ seed.charCodeAt(i), 16777619) >>> 0;
  return `10.${128 + (h & 127)}.${(h >>> 7) & 255}.0/24`;
}
