import { sql } from 'kysely';
import { atomically, type Db } from './db.js';

/** Reference counts of frozen layers. A holder is `instance:<id>` or `checkpoint:<id>`; a layer
 * with no holder is garbage and its directory may be deleted. */
export class LayerStore {
  constructor(private readonly db: Db) {}

  /** Records a layer before its directory exists: `pendingFor` names the instance whose upper
   * is about to be frozen into it, so that a crash in between can be told apart at start. */
  async add(id: string, pendingFor?: string): Promise<void> {
    await this.db
      .insertInto('layers')
      .values({ id, created_at: new Date().toISOString(), synced: 0, pending_instance_id: pendingFor ?? null })
      .onConflict((oc) => oc.column('id').doNothing())
      .execute();
  }

  /** Forgets a layer that was never frozen (its checkpoint failed). */
  async remove(id: string): Promise<void> {
    await this.db.deleteFrom('layers').where('id', '=', id).execute();
  }

  async settle(id: string): Promise<void> {
    await this.db.updateTable('layers').set({ pending_instance_id: null }).where('id', '=', id).execute();
  }

  async pending(): Promise<{ id: string; instanceId: string }[]> {
    const rows = await this.db.selectFrom('layers').select(['id', 'pending_instance_id']).where('pending_instance_id', 'is not', null).execute();
    return rows.map((r) => ({ id: r.id, instanceId: r.pending_instance_id! }));
  }

  async markSynced(id: string): Promise<void> {
    await this.db.updateTable('layers').set({ synced: 1 }).where('id', '=', id).execute();
  }

  /** Replaces the layers a holder stands on. */
  async setRefs(holder: string, layers: readonly string[]): Promise<void> {
    await atomically(this.db, async (trx) => {
      await trx.deleteFrom('layer_refs').where('holder', '=', holder).execute();
      if (layers.length === 0) return;
      await trx
        .insertInto('layer_refs')
        .values([...new Set(layers)].map((layer_id) => ({ layer_id, holder })))
        .onConflict((oc) => oc.columns(['layer_id', 'holder']).doNothing())
        .execute();
    });
  }

  async dropHolder(holder: string): Promise<void> {
    await this.db.deleteFrom('layer_refs').where('holder', '=', holder).execute();
  }

  /** Drops every holder whose name starts with `prefix` (a node's abandoned pulls). */
  async dropHoldersStartingWith(prefix: string): Promise<void> {
    const escaped = prefix.replace(/[\\%_]/g, (c) => `\\${c}`);
    await this.db.deleteFrom('layer_refs').where(sql<boolean>`holder like ${`${escaped}%`} escape '\\'`).execute();
  }

  async holders(layerId: string): Promise<string[]> {
    const rows = await this.db.selectFrom('layer_refs').select('holder').where('layer_id', '=', layerId).execute();
    return rows.map((r) => r.holder);
  }

  /** Layers some holder stands on. */
  async referenced(): Promise<string[]> {
    const rows = await this.db.selectFrom('layer_refs').select('layer_id').distinct().execute();
    return rows.map((r) => r.layer_id);
  }

  /** Layers nothing stands on; removed from the table, to be deleted from disk by the caller. */
  async takeUnreferenced(): Promise<string[]> {
    return atomically(this.db, async (trx) => {
      const rows = await trx
        .selectFrom('layers')
        .select('id')
        .where('pending_instance_id', 'is', null)
        .where('id', 'not in', trx.selectFrom('layer_refs').select('layer_id'))
        .execute();
      const ids = rows.map((r) => r.id);
      if (ids.length > 0) await trx.deleteFrom('layers').where('id', 'in', ids).execute();
      return ids;
    });
  }

  async all(): Promise<string[]> {
    return (await this.db.selectFrom('layers').select('id').execute()).map((r) => r.id);
  }
}
