import type { Db } from './db.js';
import type { Tables } from './schema.js';

export interface VolumeRecord {
  id: string;
  owner: string;
  name: string;
  sizeMb: number;
  /** The node whose disk holds it: only instances there mount it. */
  node: string;
  createdAt: string;
}

const fromRow = (r: Tables['volumes']): VolumeRecord => ({ id: r.id, owner: r.owner, name: r.name, sizeMb: Number(r.size_mb), node: r.node, createdAt: r.created_at });

export class VolumeStore {
  constructor(private readonly db: Db) {}

  async insert(v: VolumeRecord): Promise<void> {
    await this.db.insertInto('volumes').values({ id: v.id, owner: v.owner, name: v.name, size_mb: v.sizeMb, node: v.node, created_at: v.createdAt }).execute();
  }

  async byName(owner: string, name: string): Promise<VolumeRecord | undefined> {
    const r = await this.db.selectFrom('volumes').selectAll().where('owner', '=', owner).where('name', '=', name).executeTakeFirst();
    return r && fromRow(r);
  }

  async get(id: string): Promise<VolumeRecord | undefined> {
    const r = await this.db.selectFrom('volumes').selectAll().where('id', '=', id).executeTakeFirst();
    return r && fromRow(r);
  }

  async list(owner: string): Promise<VolumeRecord[]> {
    return (await this.db.selectFrom('volumes').selectAll().where('owner', '=', owner).orderBy('name').execute()).map(fromRow);
  }

  async forNode(node: string): Promise<VolumeRecord[]> {
    return (await this.db.selectFrom('volumes').selectAll().where('node', '=', node).execute()).map(fromRow);
  }

  async delete(id: string): Promise<void> {
    await this.db.deleteFrom('volumes').where('id', '=', id).execute();
  }
}
