import { statfs } from 'node:fs/promises';
import { availableParallelism, totalmem } from 'node:os';
import type { Limits } from '../store/instances.js';
import { InvalidRequestError, QuotaExceededError } from './errors.js';

/** What one owner's instances may hold together, whatever their state (a stopped or hibernated
 * instance keeps its share: it may start again at any moment). 0: no bound. */
export interface OwnerQuota {
  instances: number;
  memoryMb: number;
  cpuPercent: number;
  /** Counts instances' disk limits; with a bound, an instance must have one. */
  diskMb: number;
  /** Addresses of the sandboxes' subnet. */
  addresses: number;
}

/** What an owner's instances hold now. */
export interface OwnerUsage {
  instances: number;
  memoryMb: number;
  cpuPercent: number;
  diskMb: number;
  addresses: number;
}

/** What the host has: no single instance may ask for more. */
export interface HostCapacity {
  memoryMb: number;
  cpuPercent: number;
  diskMb: number;
}

export type QuotaReason = 'INSTANCES_PER_OWNER' | 'MEMORY_PER_OWNER' | 'CPU_PER_OWNER' | 'DISK_PER_OWNER' | 'ADDRESSES_PER_OWNER';

/** An owner at one of its bounds: the pools are shared by every tenant. */
export class OwnerQuotaError extends QuotaExceededError {
  constructor(reason: QuotaReason, what: string, limit: number, used: number, asked: number) {
    super(`this owner's instances would hold ${used + asked} ${what}, more than the ${limit} one owner may (${envOf[reason]}): delete instances first, or ask for less`, { reason, limit, used, asked });
  }
}

const envOf: Record<QuotaReason, string> = {
  INSTANCES_PER_OWNER: 'FORKPOINT_OWNER_MAX_INSTANCES',
  MEMORY_PER_OWNER: 'FORKPOINT_OWNER_MAX_MEMORY_MB',
  CPU_PER_OWNER: 'FORKPOINT_OWNER_MAX_CPU_PERCENT',
  DISK_PER_OWNER: 'FORKPOINT_OWNER_MAX_DISK_MB',
  ADDRESSES_PER_OWNER: 'FORKPOINT_OWNER_MAX_ADDRESSES',
};

/** The addresses a subnet has for instances: all but its network, gateway and broadcast. */
export function addressesIn(cidr: string): number {
  return 2 ** (32 - Number(cidr.split('/')[1])) - 3;
}

/** The bounds in force: the configured ones, or the defaults (config.ts) from the host's size. */
export function ownerQuotaOf(
  c: { ownerMaxInstances: number; ownerMaxMemoryMb?: number | undefined; ownerMaxCpuPercent?: number | undefined; ownerMaxDiskMb: number; ownerMaxAddresses?: number | undefined; networkCidr: string },
  host: HostCapacity,
): OwnerQuota {
  return {
    instances: c.ownerMaxInstances,
    memoryMb: c.ownerMaxMemoryMb ?? 8 * host.memoryMb,
    cpuPercent: c.ownerMaxCpuPercent ?? 128 * host.cpuPercent,
    diskMb: c.ownerMaxDiskMb,
    addresses: c.ownerMaxAddresses ?? Math.max(1, Math.floor(addressesIn(c.networkCidr) / 2)),
  };
}

/** The host's memory, CPUs (100 per CPU) and the data directory's filesystem size. */
export async function hostCapacity(dataDir: string): Promise<HostCapacity> {
  const fs = await statfs(dataDir).catch(() => undefined);
  return {
    memoryMb: Math.floor(totalmem() / 1048576),
    cpuPercent: availableParallelism() * 100,
    diskMb: fs ? Math.floor((fs.blocks * fs.bsize) / 1048576) : Number.MAX_SAFE_INTEGER,
  };
}

/** Refuses limits no host of this size can give one instance (400, reason LIMIT_BEYOND_HOST). */
export function checkAgainstHost(limits: Limits, host: HostCapacity): void {
  const over: [string, number, number][] = [
    ['memory_mb', limits.memoryMb, host.memoryMb],
    ['cpu_percent', limits.cpuPercent, host.cpuPercent],
    ['disk_mb', limits.diskMb ?? 0, host.diskMb],
  ];
  for (const [field, asked, has] of over) {
    if (asked > has) throw new InvalidRequestError(`limits.${field} ${asked} is more than this host has (${has})`, { reason: 'LIMIT_BEYOND_HOST', field, asked, host: has });
  }
}

/** Refuses `count` more instances with `limits` (and an address each, if `address`) that
 * would take the owner past a bound (429 QUOTA_EXCEEDED with the bound's reason). */
export function checkOwnerQuota(quota: OwnerQuota, used: OwnerUsage, limits: Limits, count: number, address: boolean): void {
  if (quota.diskMb > 0 && !limits.diskMb) {
    throw new InvalidRequestError('owners have a disk quota on this server (FORKPOINT_OWNER_MAX_DISK_MB): an instance needs limits.disk_mb, or the server FORKPOINT_DEFAULT_DISK_MB', { reason: 'DISK_LIMIT_REQUIRED' });
  }
  const checks: [QuotaReason, string, number, number, number][] = [
    ['INSTANCES_PER_OWNER', 'instances', quota.instances, used.instances, count],
    ['MEMORY_PER_OWNER', 'MiB of memory', quota.memoryMb, used.memoryMb, count * limits.memoryMb],
    ['CPU_PER_OWNER', '% of CPU', quota.cpuPercent, used.cpuPercent, count * limits.cpuPercent],
    ['DISK_PER_OWNER', 'MiB of disk', quota.diskMb, used.diskMb, count * (limits.diskMb ?? 0)],
    ['ADDRESSES_PER_OWNER', 'addresses', quota.addresses, used.addresses, address ? count : 0],
  ];
  for (const [reason, what, limit, had, asked] of checks) {
    if (limit > 0 && asked > 0 && had + asked > limit) throw new OwnerQuotaError(reason, what, limit, had, asked);
  }
}
