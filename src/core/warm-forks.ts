import type { Logger } from 'pino';
import { RESERVED_OWNER_PREFIX } from '../store/tokens.js';
import { ConflictError } from './errors.js';

/** A standby made with other limits than the fork asks for: the fork restores instead. */
export class StandbyUnfitError extends ConflictError {
  constructor(id: string) {
    super(`standby ${id} was made with other limits`, { reason: 'STANDBY_UNFIT' });
  }
}

const STANDBY_PREFIX = `${RESERVED_OWNER_PREFIX}standby/`;

/** The owner a standby's record is kept under until a fork of `owner`'s takes it: no token speaks
 * for it, so no list, quota or lookup of `owner`'s sees it. */
export const standbyOwnerOf = (owner: string): string => `${STANDBY_PREFIX}${owner}`;

export const isStandby = (rec: { owner: string }): boolean => rec.owner.startsWith(STANDBY_PREFIX);

/** Standbys one owner's checkpoints may hold at once: a tenant's forks cannot take the pool. */
export const STANDBYS_PER_OWNER = 2;

/** How long after a fork its standby is made. */
const MAKE_DELAY_MS = 150;

export interface Standby {
  /** Its instance record's id: the fork's, once taken. */
  id: string;
  checkpointId: string;
  owner: string;
  memoryBytes: number;
  /** The processes the restore brought back (their ids), listed before it was frozen: the
   * fork's executions are its source's of these. */
  processes: number[];
}

/** What makes and removes standbys (the checkpoint service, over the engine). */
export interface StandbyMaker {
  /** A new record of `owner`'s next fork of the checkpoint (under standbyOwnerOf), restored and
   * held frozen; its id. */
  make(checkpointId: string, sourceId: string, owner: string, template: boolean): Promise<{ id: string; processes: number[] }>;
  discard(id: string): Promise<void>;
  memoryOf(id: string): Promise<number>;
}

export interface WarmLimits {
  count: number;
  memoryBytes: number;
}

/**
 * Warm forks: for a checkpoint that was forked from, a sandbox restored ahead from it and held
 * frozen, that the next fork of it takes (renamed to nothing: the standby's record is the fork's,
 * handed to its owner) and thaws, instead of restoring. One is made after each fork, in the
 * background; the pool is bounded in count and memory (the checkpoints forked from longest ago
 * give theirs up first) and per owner. Standbys are the server's own: a restart or a stop removes
 * them, a checkpoint's deletion removes its own.
 */
export class WarmForks {
  private readonly ready = new Map<string, Standby>();
  /** Standbys being made, by `owner checkpoint`. */
  private readonly making = new Map<string, Promise<void>>();
  private readonly lastForked = new Map<string, number>();
  /** Checkpoints deleted while one of theirs was being made. */
  private readonly dropped = new Set<string>();
  private closed = false;
  private readonly discarding = new Set<Promise<void>>();

  constructor(
    private readonly limits: WarmLimits,
    private readonly maker: StandbyMaker,
    private readonly log: Logger,
  ) {}

  get enabled(): boolean {
    return this.limits.count > 0 && !this.closed;
  }

  /** One of `owner`'s standbys of the checkpoint, taken out of the pool (the caller discards it
   * or gives it back), if there is one. */
  take(checkpointId: string, owner: string): Standby | undefined {
    this.lastForked.set(checkpointId, Date.now());
    for (const s of this.ready.values()) {
      if (s.checkpointId !== checkpointId || s.owner !== owner) continue;
      this.ready.delete(s.id);
      return s;
    }
    return undefined;
  }

  /** A standby taken and not used (its owner's quota refused the fork): back in the pool. */
  giveBack(s: Standby): void {
    if (this.closed || this.dropped.has(s.checkpointId)) void this.discard(s);
    else this.ready.set(s.id, s);
  }

  /** The checkpoint was forked from: a standby for its next fork, made in the background, if
   * the owner has none of it and the pool has room (made by giving up the coldest). */
  refill(checkpointId: string, sourceId: string, owner: string, template = false): void {
    if (!this.enabled) return;
    this.lastForked.set(checkpointId, Date.now());
    const key = `${owner} ${checkpointId}`;
    const mine = [...this.ready.values()].filter((s) => s.owner === owner);
    if (this.making.has(key) || mine.some((s) => s.checkpointId === checkpointId)) return;
    const makingMine = [...this.making.keys()].filter((k) => k.startsWith(`${owner} `)).length;
    // At its bound, the owner's own coldest gives way.
    const coldestMine = mine.sort((a, b) => this.forkedAt(a) - this.forkedAt(b));
    while (coldestMine.length && coldestMine.length + makingMine >= STANDBYS_PER_OWNER) this.evict(coldestMine.shift()!);
    if (coldestMine.length + makingMine >= STANDBYS_PER_OWNER) return;
    if (!this.evictFor(1, 0, checkpointId)) return;
    const made = this.make(checkpointId, sourceId, owner, template).finally(() => this.making.delete(key));
    this.making.set(key, made);
  }

  private async make(checkpointId: string, sourceId: string, owner: string, template: boolean): Promise<void> {
    // Not beside the fork's first calls: a restore takes a core's worth of CPU for its while.
    await new Promise((r) => setTimeout(r, MAKE_DELAY_MS));
    if (this.closed || this.dropped.has(checkpointId)) return;
    try {
      const { id, processes } = await this.maker.make(checkpointId, sourceId, owner, template);
      const s: Standby = { id, checkpointId, owner, memoryBytes: await this.maker.memoryOf(id).catch(() => 0), processes };
      if (this.closed || this.dropped.has(checkpointId) || !this.evictFor(0, s.memoryBytes, checkpointId)) {
        await this.discard(s);
        return;
      }
      this.ready.set(id, s);
      this.log.debug({ instance: id, checkpoint: checkpointId, memoryBytes: s.memoryBytes }, 'warm fork ready');
    } catch (err) {
      this.log.warn({ err, checkpoint: checkpointId }, 'could not make a warm fork');
    }
  }

  /** Room for `count` more standbys and `memoryBytes` more memory, by discarding those of the
   * checkpoints forked from longest ago (never `keep`'s); false if there is not enough. */
  private evictFor(count: number, memoryBytes: number, keep: string): boolean {
    const over = () => {
      const held = [...this.ready.values()];
      return this.ready.size + this.making.size + count > this.limits.count || held.reduce((n, s) => n + s.memoryBytes, 0) + memoryBytes > this.limits.memoryBytes;
    };
    const coldest = [...this.ready.values()].filter((s) => s.checkpointId !== keep).sort((a, b) => this.forkedAt(a) - this.forkedAt(b));
    while (over()) {
      const victim = coldest.shift();
      if (!victim) return false;
      this.evict(victim);
    }
    return true;
  }

  private forkedAt(s: Standby): number {
    return this.lastForked.get(s.checkpointId) ?? 0;
  }

  private evict(s: Standby): void {
    this.ready.delete(s.id);
    void this.discard(s);
  }

  /** The checkpoint is being deleted: its standbys go (one being made, once it is). */
  async drop(checkpointId: string): Promise<void> {
    this.lastForked.delete(checkpointId);
    const pending = [...this.making.entries()].filter(([k]) => k.endsWith(` ${checkpointId}`)).map(([, p]) => p);
    if (pending.length) {
      this.dropped.add(checkpointId);
      await Promise.all(pending);
      this.dropped.delete(checkpointId);
    }
    const mine = [...this.ready.values()].filter((s) => s.checkpointId === checkpointId);
    for (const s of mine) this.ready.delete(s.id);
    await Promise.all(mine.map((s) => this.discard(s)));
  }

  /** The server stops: no more standbys, and those there are go. */
  async close(): Promise<void> {
    this.closed = true;
    await this.clear();
  }

  /** Every standby goes (the pool fills again with the next forks, unless closed). */
  async clear(): Promise<void> {
    await this.settled();
    const all = [...this.ready.values()];
    this.ready.clear();
    await Promise.all(all.map((s) => this.discard(s)));
    await Promise.all(this.discarding);
  }

  /** Standbys ready now (for the instance view's neighbours: tests and metrics). */
  held(): Standby[] {
    return [...this.ready.values()];
  }

  /** Resolves once no standby is being made. */
  async settled(): Promise<void> {
    while (this.making.size) await Promise.all(this.making.values());
  }

  /** Removes the standby's sandbox and record; a clear waits for every removal under way. */
  private discard(s: Standby): Promise<void> {
    const done = this.maker.discard(s.id)
      .catch((err: unknown) => this.log.warn({ err, instance: s.id }, 'could not remove a warm fork'))
      .finally(() => this.discarding.delete(done));
    this.discarding.add(done);
    return done;
  }
}
