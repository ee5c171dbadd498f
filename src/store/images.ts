import type { Selectable } from 'kysely';
import type { Db } from './db.js';
import type { Tables } from './schema.js';

import { EMPTY_IMAGE_CONFIG as EMPTY_CONFIG, type ImageConfig } from '../seam/runtime.js';

export { EMPTY_CONFIG, type ImageConfig };

/** A built image: layers (newest first) on a rootfs directory. */
export interface BuiltImageRecord {
  owner: string;
  name: string;
  base: string;
  layers: string[];
  config: ImageConfig;
  buildKey: string;
  createdAt: string;
  /** A pulled image's weight as fetched; undefined for a built one. */
  pulledBytes?: number | undefined;
}

type ImageRow = Selectable<Tables['images']>;

const fromRow = (r: ImageRow): BuiltImageRecord => ({
  owner: r.owner,
  name: r.name,
  base: r.base,
  layers: JSON.parse(r.layers) as string[],
  config: { ...EMPTY_CONFIG, ...(JSON.parse(r.config) as Partial<ImageConfig>) },
  buildKey: r.build_key,
  createdAt: r.created_at,
  pulledBytes: r.pulled_bytes === null ? undefined : Number(r.pulled_bytes),
});

/** The layer holder of a built image. */
export const imageHolder = (owner: string, name: string) => `image:${owner}/${name}`;
/** The layer holder of a cached build step. */
export const cacheHolder = (owner: string, key: string) => `cache:${owner}/${key}`;

export class ImageStore {
  constructor(private readonly db: Db) {}

  async get(owner: string, name: string): Promise<BuiltImageRecord | undefined> {
    const row = await this.db.selectFrom('images').selectAll().where('owner', '=', owner).where('name', '=', name).executeTakeFirst();
    return row && fromRow(row);
  }

  async list(owner: string): Promise<BuiltImageRecord[]> {
    return (await this.db.selectFrom('images').selectAll().where('owner', '=', owner).orderBy('name').execute()).map(fromRow);
  }

  /** Records (or replaces) the image; the caller holds the transaction that moves its refs. */
  async put(rec: BuiltImageRecord): Promise<void> {
    const row = { base: rec.base, layers: JSON.stringify(rec.layers), config: JSON.stringify(rec.config), build_key: rec.buildKey, created_at: rec.createdAt, pulled_bytes: rec.pulledBytes ?? null };
    await this.db
      .insertInto('images')
      .values({ owner: rec.owner, name: rec.name, ...row })
      .onConflict((oc) => oc.columns(['owner', 'name']).doUpdateSet(row))
      .execute();
  }

  /** What the owner's pulled images weighed as fetched, in all, but for the image named `except`. */
  async pulledBytes(owner: string, except?: string): Promise<number> {
    let q = this.db.selectFrom('images').select((eb) => eb.fn.sum<number | string | null>('pulled_bytes').as('n')).where('owner', '=', owner);
    if (except !== undefined) q = q.where('name', '!=', except);
    const row = await q.executeTakeFirst();
    return Number(row?.n ?? 0);
  }

  /** Whether any owner's image stands on `base` (a pulled tree, or a built image's FROM). */
  async anyOnBase(base: string): Promise<boolean> {
    return (await this.db.selectFrom('images').select('name').where('base', '=', base).limit(1).executeTakeFirst()) !== undefined;
  }

  /** Whether any owner has an image pulled at a digest starting `buildKeyPrefix` (letters,
   * digits and colons only: nothing LIKE would read as a pattern). */
  async anyPulledAs(buildKeyPrefix: string): Promise<boolean> {
    if (!/^[a-z0-9:]+$/.test(buildKeyPrefix)) return false;
    return (await this.db.selectFrom('images').select('name').where('build_key', 'like', `${buildKeyPrefix}%`).limit(1).executeTakeFirst()) !== undefined;
  }

  async delete(owner: string, name: string): Promise<void> {
    await this.db.deleteFrom('images').where('owner', '=', owner).where('name', '=', name).execute();
  }

  /** A cached step: the layers and configuration after it. */
  async cached(owner: string, key: string): Promise<{ layers: string[]; config: ImageConfig } | undefined> {
    const row = await this.db.selectFrom('build_cache').select(['layers', 'config']).where('owner', '=', owner).where('key', '=', key).executeTakeFirst();
    if (!row) return undefined;
    await this.db.updateTable('build_cache').set({ used_at: new Date().toISOString() }).where('owner', '=', owner).where('key', '=', key).execute();
    return { layers: JSON.parse(row.layers) as string[], config: JSON.parse(row.config) as ImageConfig };
  }

  async cache(owner: string, key: string, layers: string[], config: ImageConfig): Promise<void> {
    const row = { layers: JSON.stringify(layers), config: JSON.stringify(config), used_at: new Date().toISOString() };
    await this.db
      .insertInto('build_cache')
      .values({ owner, key, ...row })
      .onConflict((oc) => oc.columns(['owner', 'key']).doUpdateSet(row))
      .execute();
  }

  /** Cached steps no build used since `before` (of one owner, or of all), oldest first. */
  async staleCache(before: string, owner?: string): Promise<{ owner: string; key: string }[]> {
    let q = this.db.selectFrom('build_cache').select(['owner', 'key']).where('used_at', '<', before);
    if (owner !== undefined) q = q.where('owner', '=', owner);
    return q.orderBy('used_at').execute();
  }

  async dropCache(owner: string, key: string): Promise<void> {
    await this.db.deleteFrom('build_cache').where('owner', '=', owner).where('key', '=', key).execute();
  }
}
