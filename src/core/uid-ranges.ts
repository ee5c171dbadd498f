import { readFile } from 'node:fs/promises';
import { QuotaExceededError, UnavailableError } from './errors.js';

/** How many ids a sandbox's user namespace maps: its 0..65535. */
export const RANGE_SIZE = 65536;

/** No range is free: every one of the pool is held by an instance (of any node). */
export class UidRangesExhaustedError extends UnavailableError {
  constructor(count: number) {
    super(`all ${count} uid ranges of the pool are in use: delete instances, or raise FORKPOINT_UID_RANGES`, { reason: 'UID_RANGES_EXHAUSTED' });
  }
}

/** The owner holds as many ranges as one owner may: the pool is shared by every tenant. */
export class UidRangeQuotaError extends QuotaExceededError {
  constructor(limit: number) {
    super(`this owner's instances hold ${limit} uid ranges, as many as one owner may (FORKPOINT_UID_RANGES_PER_OWNER): delete instances first`, { reason: 'UID_RANGES_PER_OWNER', limit });
  }
}

/**
 * The host uid ranges sandboxes' user namespaces map to: `count` ranges of 65536 ids from
 * `start`. Which are held is the store's (instances.uid_base, unique across nodes); this picks a
 * free one and never falls back to the host's own ids.
 */
export class UidRangePool {
  constructor(
    readonly start: number,
    readonly count: number,
    /** How many one owner's instances may hold at once. */
    readonly perOwner: number,
  ) {}

  get end(): number {
    return this.start + this.count * RANGE_SIZE;
  }

  /** Refuses one more range to an owner whose instances hold `heldByOwner` already. */
  requireRoomFor(heldByOwner: number): void {
    if (heldByOwner >= this.perOwner) throw new UidRangeQuotaError(this.perOwner);
  }

  /** The lowest base no instance holds, for an instance of `owner`. */
  allocate(held: { uidBase: number; owner: string }[], owner: string): number {
    this.requireRoomFor(held.filter((h) => h.owner === owner).length);
    const used = new Set(held.map((h) => h.uidBase));
    for (let k = 0; k < this.count; k++) {
      const base = this.start + k * RANGE_SIZE;
      if (!used.has(base)) return base;
    }
    throw new UidRangesExhaustedError(this.count);
  }

  /** Host accounts and subordinate ranges (/etc/passwd, /etc/group, /etc/subuid, /etc/subgid)
   * whose ids fall in the pool: a sandbox's root must never be one of them. */
  async overlapsWithHost(files = { passwd: '/etc/passwd', group: '/etc/group', subuid: '/etc/subuid', subgid: '/etc/subgid' }): Promise<string[]> {
    const found: string[] = [];
    const inPool = (lo: number, hi: number) => lo < this.end && hi > this.start;
    for (const file of [files.passwd, files.group]) {
      for (const line of (await readFile(file, 'utf8').catch(() => '')).split('\n')) {
        const [name, , id] = line.split(':');
        const n = Number(id);
        if (name && id && Number.isInteger(n) && inPool(n, n + 1)) found.push(`${file}: ${name} (${n})`);
      }
    }
    for (const file of [files.subuid, files.subgid]) {
      for (const line of (await readFile(file, 'utf8').catch(() => '')).split('\n')) {
        const [name, first, count] = line.split(':');
        const lo = Number(first), n = Number(count);
        if (name && Number.isInteger(lo) && Number.isInteger(n) && inPool(lo, lo + n)) found.push(`${file}: ${name} (${lo}..${lo + n - 1})`);
      }
    }
    return found;
  }
}
