import type { Logger } from 'pino';
import { RESERVED_OWNER_PREFIX } from '../store/tokens.js';
import { ConflictError } from './errors.js';

/** A standby made otherwise than the fork or create asks for (other limits, another build of
 * its image): the call restores or boots instead. */
export class StandbyUnfitError extends ConflictError {
  constructor(
    id: string,
    what = 'other limits',
    /** Whether another call may still take it (not when its image was rebuilt since). */
    readonly reusable = true,
  ) {
    super(`standby ${id} was made with ${what}`, { reason: 'STANDBY_UNFIT' });
  }
}

const STANDBY_PREFIX = `${RESERVED_OWNER_PREFIX}standby/`;

/** The owner a standby's record is kept under until a call of `owner`'s takes it: no token
 * speaks for it, so no list, quota or lookup of `owner`'s sees it. */
export const standbyOwnerOf = (owner: string): string => `${STANDBY_PREFIX}${owner}`;

export const isStandby = (rec: { owner: string }): boolean => rec.owner.startsWith(STANDBY_PREFIX);

/** Standbys one owner may hold at once: a tenant's calls cannot take the pool. */
export const STANDBYS_PER_OWNER = 2;

/** How long after a call its standby is made. */
const MAKE_DELAY_MS = 150;

/** How a standby is made: restored from a checkpoint as an owner's fork of it (or, `template`,
 * as an instance of the template it is of) would be, or booted from an image as a create with
 * nothing asked would be. */
export type StandbyRecipe =
  | { kind: 'fork'; checkpointId: string; sourceId: string; template: boolean }
  | { kind: 'create'; image: string }
  /** A rollback's: the checkpoint restored beside the running instance, in its place once a
   * rollback to it takes it (the engine's holdRollback). */
  | { kind: 'rollback'; checkpointId: string; instanceId: string };

export type StandbyKind = StandbyRecipe['kind'];

/** The key a standby is found by: its checkpoint, its image, or its instance and checkpoint. */
export const standbyKeyOf = (r: StandbyRecipe): string =>
  r.kind === 'fork' ? r.checkpointId : r.kind === 'create' ? `image:${r.image}` : `rollback:${r.instanceId}:${r.checkpointId}`;

/** The checkpoint a rollback's standby key names. */
export const rollbackCheckpointOf = (key: string): string => key.slice(key.lastIndexOf(':') + 1);

/** Whether a standby of this key stands on the checkpoint (or image) of key `of`. */
const standsOn = (key: string, of: string): boolean => key === of || (key.startsWith('rollback:') && key.endsWith(`:${of}`));

export interface Standby {
  kind: StandbyRecipe['kind'];
  /** Its instance record's id: the fork's or the create's, once taken; a rollback's: its
   * instance's (it has no record of its own). */
  id: string;
  /** Its checkpoint's id, or `image:<name>` (standbyKeyOf). */
  key: string;
  owner: string;
  memoryBytes: number;
  /** The processes the restore brought back (their ids), listed before it was frozen: a fork's
   * executions are its source's of these. */
  processes: number[];
  /** For a create's: the image's identity when it was booted (ResolvedImage.key). */
  imageKey: string | null;
}

/** What makes and removes standbys (the services, over the engine). */
export interface StandbyMaker {
  /** A new record of `owner`'s next such call (under standbyOwnerOf), restored or booted and
   * held frozen (a rollback's: no record, and its memory said); undefined when none can be
   * made for it. */
  make(recipe: StandbyRecipe, owner: string): Promise<(Pick<Standby, 'id' | 'processes' | 'imageKey'> & { memoryBytes?: number }) | undefined>;
  discard(s: Pick<Standby, 'kind' | 'id' | 'key'>): Promise<void>;
  memoryOf(id: string): Promise<number>;
}

export interface WarmLimits {
  count: number;
  memoryBytes: number;
}

/**
 * Warm forks and creates: for a checkpoint that was forked from (an image an instance was made
 * from), a sandbox restored (booted) ahead from it and held frozen, that the next such call of
 * the same owner takes (renamed to nothing: the standby's record is the new instance's, handed to
 * its owner) and thaws, instead of restoring (booting). One is made after each call, in the
 * background; the pool is bounded in count and memory (the keys used longest ago give theirs up
 * first) and per owner. Standbys are the server's own: a restart or a stop removes them, a
 * checkpoint's or an image's deletion removes its own.
 */
export class WarmStandbys {
  private readonly ready = new Map<string, Standby>();
  /** Standbys being made, by `owner key`. */
  private readonly making = new Map<string, Promise<void>>();
  /** When each key was last used (forked from, created from). */
  private readonly lastUsed = new Map<string, number>();
  /** Keys deleted while one of theirs was being made. */
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

  /** One of `owner`'s standbys of the key, taken out of the pool (the caller discards it or
   * gives it back), if there is one. */
  take(key: string, owner: string): Standby | undefined {
    this.lastUsed.set(key, Date.now());
    for (const s of this.ready.values()) {
      if (s.key !== key || s.owner !== owner) continue;
      this.ready.delete(s.id);
      return s;
    }
    return undefined;
  }

  /** A standby taken and not used (its owner's quota refused the call, it was unfit): back in
   * the pool. */
  giveBack(s: Standby): void {
    if (this.closed || this.dropped.has(s.key)) void this.discard(s);
    else this.ready.set(s.id, s);
  }

  /** The recipe's key was used: a standby for the owner's next such call, made in the
   * background, if the owner has none of it and the pool has room (made by giving up the
   * coldest). */
  refill(recipe: StandbyRecipe, owner: string): void {
    if (!this.enabled) return;
    const sourceKey = standbyKeyOf(recipe);
    this.lastUsed.set(sourceKey, Date.now());
    const key = `${owner} ${sourceKey}`;
    const mine = [...this.ready.values()].filter((s) => s.owner === owner);
    if (this.making.has(key) || mine.some((s) => s.key === sourceKey)) return;
    const makingMine = [...this.making.keys()].filter((k) => k.startsWith(`${owner} `)).length;
    // At its bound, the owner's own coldest gives way.
    const coldestMine = mine.sort((a, b) => this.usedAt(a) - this.usedAt(b));
    while (coldestMine.length && coldestMine.length + makingMine >= STANDBYS_PER_OWNER) this.evict(coldestMine.shift()!);
    if (coldestMine.length + makingMine >= STANDBYS_PER_OWNER) return;
    if (!this.evictFor(1, 0, sourceKey)) return;
    const made = this.make(recipe, sourceKey, owner).finally(() => this.making.delete(key));
    this.making.set(key, made);
  }

  private async make(recipe: StandbyRecipe, key: string, owner: string): Promise<void> {
    // Not beside the call's first ones: a restore takes a core's worth of CPU for its while.
    await new Promise((r) => setTimeout(r, MAKE_DELAY_MS));
    if (this.closed || this.dropped.has(key)) return;
    try {
      const made = await this.maker.make(recipe, owner);
      if (!made) return;
      const s: Standby = { ...made, kind: recipe.kind, key, owner, memoryBytes: made.memoryBytes ?? (await this.maker.memoryOf(made.id).catch(() => 0)) };
      if (this.closed || this.dropped.has(key) || !this.evictFor(0, s.memoryBytes, key)) {
        await this.discard(s);
        return;
      }
      this.ready.set(s.id, s);
      this.log.debug({ instance: s.id, key, memoryBytes: s.memoryBytes }, 'warm standby ready');
    } catch (err) {
      this.log.warn({ err, key }, 'could not make a warm standby');
    }
  }

  /** Room for `count` more standbys and `memoryBytes` more memory, by discarding those of the
   * keys used longest ago (never `keep`'s); false if there is not enough. */
  private evictFor(count: number, memoryBytes: number, keep: string): boolean {
    const over = () => {
      const held = [...this.ready.values()];
      return this.ready.size + this.making.size + count > this.limits.count || held.reduce((n, s) => n + s.memoryBytes, 0) + memoryBytes > this.limits.memoryBytes;
    };
    const coldest = [...this.ready.values()].filter((s) => s.key !== keep).sort((a, b) => this.usedAt(a) - this.usedAt(b));
    while (over()) {
      const victim = coldest.shift();
      if (!victim) return false;
      this.evict(victim);
    }
    return true;
  }

  private usedAt(s: Standby): number {
    return this.lastUsed.get(s.key) ?? 0;
  }

  private evict(s: Standby): void {
    this.ready.delete(s.id);
    void this.discard(s);
  }

  /** The checkpoint (the image, `image:<name>`) is being deleted: its standbys go (one being
   * made, once it is), rollbacks' to it among them. */
  async drop(key: string): Promise<void> {
    await this.dropWhere((k) => standsOn(k, key));
  }

  /** Whether the instance has a rollback standby, held or being made: it rolls back, and its
   * newest checkpoint is the likeliest to be rolled back to next. */
  rollsBack(instanceId: string): boolean {
    const prefix = `rollback:${instanceId}:`;
    return [...this.ready.values()].some((s) => s.key.startsWith(prefix)) || [...this.making.keys()].some((k) => k.slice(k.lastIndexOf(' ') + 1).startsWith(prefix));
  }

  /** The instance's rollback standby goes (it stopped, hibernated, is deleted, or is rolled
   * back to another checkpoint: the engine holds one per instance). */
  async dropRollbackOf(instanceId: string): Promise<void> {
    await this.dropWhere((k) => k.startsWith(`rollback:${instanceId}:`));
  }

  private async dropWhere(matches: (key: string) => boolean): Promise<void> {
    const keys = new Set([...this.lastUsed.keys(), ...[...this.making.keys()].map((k) => k.slice(k.lastIndexOf(' ') + 1)), ...[...this.ready.values()].map((s) => s.key)].filter(matches));
    for (const key of keys) this.lastUsed.delete(key);
    const pending = [...this.making.entries()].filter(([k]) => keys.has(k.slice(k.lastIndexOf(' ') + 1))).map(([, p]) => p);
    if (pending.length) {
      for (const key of keys) this.dropped.add(key);
      await Promise.all(pending);
      for (const key of keys) this.dropped.delete(key);
    }
    const mine = [...this.ready.values()].filter((s) => keys.has(s.key));
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

  /** Every ready standby goes, now, its address and uid range with it (a pool every owner
   * shares ran out: what someone asked for comes first). Whether there was any. */
  async release(): Promise<boolean> {
    const all = [...this.ready.values()];
    this.ready.clear();
    await Promise.all(all.map((s) => this.discard(s)));
    if (all.length) this.log.info({ standbys: all.length }, 'warm standbys given up: a shared pool (addresses, uid ranges) ran out');
    return all.length > 0;
  }

  /** Standbys ready now (for metrics and tests). */
  held(): Standby[] {
    return [...this.ready.values()];
  }

  /** Resolves once no standby is being made. */
  async settled(): Promise<void> {
    while (this.making.size) await Promise.all(this.making.values());
  }

  /** Removes the standby's sandbox and record; a clear waits for every removal under way. */
  private discard(s: Standby): Promise<void> {
    const done = this.maker.discard(s)
      .catch((err: unknown) => this.log.warn({ err, instance: s.id }, 'could not remove a warm fork'))
      .finally(() => this.discarding.delete(done));
    this.discarding.add(done);
    return done;
  }
}
