import type { Db } from './db.js';

/** A named group of an owner's secrets (OpenComputer's secret store): an instance made with it
 * gets each as an environment variable holding a placeholder, and its egress allowlist. */
export interface SecretStoreRecord {
  id: string;
  owner: string;
  name: string;
  egressAllowlist: string[];
  createdAt: string;
  updatedAt: string;
}

/** One secret of a store; its value sealed (core/secrets-key.ts). */
export interface SecretStoreEntryRecord {
  storeId: string;
  name: string;
  sealedValue: string;
  allowedHosts: string[];
  createdAt: string;
  updatedAt: string;
}

type StoreRow = { id: string; owner: string; name: string; egress_allowlist: string; created_at: string; updated_at: string };
type EntryRow = { store_id: string; name: string; sealed_value: string; allowed_hosts: string; created_at: string; updated_at: string };

const storeOf = (r: StoreRow): SecretStoreRecord => ({ id: r.id, owner: r.owner, name: r.name, egressAllowlist: JSON.parse(r.egress_allowlist) as string[], createdAt: r.created_at, updatedAt: r.updated_at });
const entryOf = (r: EntryRow): SecretStoreEntryRecord => ({ storeId: r.store_id, name: r.name, sealedValue: r.sealed_value, allowedHosts: JSON.parse(r.allowed_hosts) as string[], createdAt: r.created_at, updatedAt: r.updated_at });

export class SecretStoreStore {
  constructor(private readonly db: Db) {}

  /** Whether it was inserted: not if the owner has a store of that name (a create that raced). */
  async insert(r: SecretStoreRecord): Promise<boolean> {
    const res = await this.db
      .insertInto('secret_stores')
      .values({ id: r.id, owner: r.owner, name: r.name, egress_allowlist: JSON.stringify(r.egressAllowlist), created_at: r.createdAt, updated_at: r.updatedAt })
      .onConflict((oc) => oc.columns(['owner', 'name']).doNothing())
      .executeTakeFirst();
    return Number(res.numInsertedOrUpdatedRows ?? 0) > 0;
  }

  /** Whether it was updated: not if another of the owner's stores has its new name. */
  async update(r: SecretStoreRecord): Promise<boolean> {
    const res = await this.db
      .updateTable('secret_stores')
      .set({ name: r.name, egress_allowlist: JSON.stringify(r.egressAllowlist), updated_at: r.updatedAt })
      .where('id', '=', r.id)
      .where(({ not, exists, selectFrom }) => not(exists(selectFrom('secret_stores as other').select('other.id').where('other.owner', '=', r.owner).where('other.name', '=', r.name).where('other.id', '!=', r.id))))
      .executeTakeFirst();
    return Number(res.numUpdatedRows) > 0;
  }

  async get(owner: string, id: string): Promise<SecretStoreRecord | undefined> {
    const r = await this.db.selectFrom('secret_stores').selectAll().where('owner', '=', owner).where('id', '=', id).executeTakeFirst();
    return r && storeOf(r);
  }

  async byName(owner: string, name: string): Promise<SecretStoreRecord | undefined> {
    const r = await this.db.selectFrom('secret_stores').selectAll().where('owner', '=', owner).where('name', '=', name).executeTakeFirst();
    return r && storeOf(r);
  }

  async list(owner: string): Promise<SecretStoreRecord[]> {
    return (await this.db.selectFrom('secret_stores').selectAll().where('owner', '=', owner).orderBy('name').execute()).map(storeOf);
  }

  /** The store and its entries; whether there was one. */
  async delete(owner: string, id: string): Promise<boolean> {
    const r = await this.db.deleteFrom('secret_stores').where('owner', '=', owner).where('id', '=', id).executeTakeFirst();
    await this.db.deleteFrom('secret_store_entries').where('store_id', '=', id).execute();
    return Number(r.numDeletedRows) > 0;
  }

  async putEntry(e: SecretStoreEntryRecord): Promise<void> {
    await this.db
      .insertInto('secret_store_entries')
      .values({ store_id: e.storeId, name: e.name, sealed_value: e.sealedValue, allowed_hosts: JSON.stringify(e.allowedHosts), created_at: e.createdAt, updated_at: e.updatedAt })
      .onConflict((oc) => oc.columns(['store_id', 'name']).doUpdateSet({ sealed_value: e.sealedValue, allowed_hosts: JSON.stringify(e.allowedHosts), updated_at: e.updatedAt }))
      .execute();
  }

  async entry(storeId: string, name: string): Promise<SecretStoreEntryRecord | undefined> {
    const r = await this.db.selectFrom('secret_store_entries').selectAll().where('store_id', '=', storeId).where('name', '=', name).executeTakeFirst();
    return r && entryOf(r);
  }

  async entries(storeId: string): Promise<SecretStoreEntryRecord[]> {
    return (await this.db.selectFrom('secret_store_entries').selectAll().where('store_id', '=', storeId).orderBy('name').execute()).map(entryOf);
  }

  /** Whether there was one to delete. */
  async deleteEntry(storeId: string, name: string): Promise<boolean> {
    const r = await this.db.deleteFrom('secret_store_entries').where('store_id', '=', storeId).where('name', '=', name).executeTakeFirst();
    return Number(r.numDeletedRows) > 0;
  }
}
