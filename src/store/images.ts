import type { Db } from './db.js';

import { EMPTY_IMAGE_CONFIG as EMPTY_CONFIG, type ImageConfig } from '../engine/images.js';

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
}

interface ImageRow {
  owner: string;
  name: string;
  base: string;
  layers: string;
  config: string;
  build_key: string;
  created_at: string;
}

const fromRow = (r: ImageRow): BuiltImageRecord => ({
  owner: r.owner,
  name: r.name,
  base: r.base,
  layers: JSON.parse(r.layers) as string[],
  config: { ...EMPTY_CONFIG, ...(JSON.parse(r.config) as Partial<ImageConfig>) },
  buildKey: r.build_key,
  createdAt: r.created_at,
});

/** The layer holder of a built image. */
export const imageHolder = (owner: string, name: string) => `image:${owner}/${name}`;
/** The layer holder of a cached build step. */
export const cacheHolder = (owner: string, key: string) => `cache:${owner}/${key}`;

export class ImageStore {
  constructor(private readonly db: Db) {}

  get(owner: string, name: string): BuiltImageRecord | undefined {
    const row = this.db.prepare('SELECT * FROM images WHERE owner = ? AND name = ?').get(owner, name) as ImageRow | undefined;
    return row && fromRow(row);
  }

  list(owner: string): BuiltImageRecord[] {
    return (this.db.prepare('SELECT * FROM images WHERE owner = ? ORDER BY name').all(owner) as ImageRow[]).map(fromRow);
  }

  /** Records (or replaces) the image; the caller holds the transaction that moves its refs. */
  put(rec: BuiltImageRecord): void {
    this.db
      .prepare(
        `INSERT INTO images (owner, name, base, layers, config, build_key, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (owner, name) DO UPDATE SET base = excluded.base, layers = excluded.layers, config = excluded.config,
           build_key = excluded.build_key, created_at = excluded.created_at`,
      )
      .run(rec.owner, rec.name, rec.base, JSON.stringify(rec.layers), JSON.stringify(rec.config), rec.buildKey, rec.createdAt);
  }

  delete(owner: string, name: string): void {
    this.db.prepare('DELETE FROM images WHERE owner = ? AND name = ?').run(owner, name);
  }

  /** A cached step: the layers and configuration after it. */
  cached(owner: string, key: string): { layers: string[]; config: ImageConfig } | undefined {
    const row = this.db.prepare('SELECT layers, config FROM build_cache WHERE owner = ? AND key = ?').get(owner, key) as
      | { layers: string; config: string }
      | undefined;
    if (!row) return undefined;
    this.db.prepare('UPDATE build_cache SET used_at = ? WHERE owner = ? AND key = ?').run(new Date().toISOString(), owner, key);
    return { layers: JSON.parse(row.layers) as string[], config: JSON.parse(row.config) as ImageConfig };
  }

  cache(owner: string, key: string, layers: string[], config: ImageConfig): void {
    this.db
      .prepare('INSERT OR REPLACE INTO build_cache (owner, key, layers, config, used_at) VALUES (?, ?, ?, ?, ?)')
      .run(owner, key, JSON.stringify(layers), JSON.stringify(config), new Date().toISOString());
  }

  /** Cached steps no build used since `before` (of one owner, or of all), oldest first. */
  staleCache(before: string, owner?: string): { owner: string; key: string }[] {
    return (owner === undefined
      ? this.db.prepare('SELECT owner, key FROM build_cache WHERE used_at < ? ORDER BY used_at').all(before)
      : this.db.prepare('SELECT owner, key FROM build_cache WHERE used_at < ? AND owner = ? ORDER BY used_at').all(before, owner)) as { owner: string; key: string }[];
  }

  dropCache(owner: string, key: string): void {
    this.db.prepare('DELETE FROM build_cache WHERE owner = ? AND key = ?').run(owner, key);
  }
}
