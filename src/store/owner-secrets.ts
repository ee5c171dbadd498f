import type { Db } from './db.js';

/** An owner's secret; its value sealed (core/secrets-key.ts). */
export interface OwnerSecretRecord {
  owner: string;
  name: string;
  sealedValue: string;
  createdAt: string;
  updatedAt: string;
}

export class OwnerSecretStore {
  constructor(private readonly db: Db) {}

  async put(r: OwnerSecretRecord): Promise<void> {
    await this.db
      .insertInto('owner_secrets')
      .values({ owner: r.owner, name: r.name, sealed_value: r.sealedValue, created_at: r.createdAt, updated_at: r.updatedAt })
      .onConflict((oc) => oc.columns(['owner', 'name']).doUpdateSet({ sealed_value: r.sealedValue, updated_at: r.updatedAt }))
      .execute();
  }

  async get(owner: string, name: string): Promise<OwnerSecretRecord | undefined> {
    const r = await this.db.selectFrom('owner_secrets').selectAll().where('owner', '=', owner).where('name', '=', name).executeTakeFirst();
    return r && { owner: r.owner, name: r.name, sealedValue: r.sealed_value, createdAt: r.created_at, updatedAt: r.updated_at };
  }

  async list(owner: string): Promise<OwnerSecretRecord[]> {
    const rows = await this.db.selectFrom('owner_secrets').selectAll().where('owner', '=', owner).orderBy('name').execute();
    return rows.map((r) => ({ owner: r.owner, name: r.name, sealedValue: r.sealed_value, createdAt: r.created_at, updatedAt: r.updated_at }));
  }

  /** Whether there was one to delete. */
  async delete(owner: string, name: string): Promise<boolean> {
    const r = await this.db.deleteFrom('owner_secrets').where('owner', '=', owner).where('name', '=', name).executeTakeFirst();
    return Number(r.numDeletedRows) > 0;
  }
}
