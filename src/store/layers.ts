import type { Db } from './db.js';

/** Reference counts of frozen layers. A holder is `instance:<id>` or `checkpoint:<id>`; a layer
 * with no holder is garbage and its directory may be deleted. */
export class LayerStore {
  constructor(private readonly db: Db) {}

  /** Records a layer before its directory exists: `pendingFor` names the instance whose upper
   * is about to be frozen into it, so that a crash in between can be told apart at start. */
  add(id: string, pendingFor?: string): void {
    this.db
      .prepare('INSERT OR IGNORE INTO layers (id, created_at, pending_instance_id) VALUES (?, ?, ?)')
      .run(id, new Date().toISOString(), pendingFor ?? null);
  }

  /** Forgets a layer that was never frozen (its checkpoint failed). */
  remove(id: string): void {
    this.db.prepare('DELETE FROM layers WHERE id = ?').run(id);
  }

  settle(id: string): void {
    this.db.prepare('UPDATE layers SET pending_instance_id = NULL WHERE id = ?').run(id);
  }

  pending(): { id: string; instanceId: string }[] {
    return this.db
      .prepare('SELECT id, pending_instance_id AS instanceId FROM layers WHERE pending_instance_id IS NOT NULL')
      .all() as { id: string; instanceId: string }[];
  }

  markSynced(id: string): void {
    this.db.prepare('UPDATE layers SET synced = 1 WHERE id = ?').run(id);
  }

  /** Replaces the layers a holder stands on. */
  setRefs(holder: string, layers: readonly string[]): void {
    this.db.transaction(() => {
      this.db.prepare('DELETE FROM layer_refs WHERE holder = ?').run(holder);
      const ins = this.db.prepare('INSERT OR IGNORE INTO layer_refs (layer_id, holder) VALUES (?, ?)');
      for (const l of layers) ins.run(l, holder);
    })();
  }

  dropHolder(holder: string): void {
    this.db.prepare('DELETE FROM layer_refs WHERE holder = ?').run(holder);
  }

  holders(layerId: string): string[] {
    return this.db.prepare('SELECT holder FROM layer_refs WHERE layer_id = ?').pluck().all(layerId) as string[];
  }

  /** Layers nothing stands on; removed from the table, to be deleted from disk by the caller. */
  takeUnreferenced(): string[] {
    return this.db.transaction(() => {
      const ids = this.db
        .prepare('SELECT id FROM layers WHERE pending_instance_id IS NULL AND id NOT IN (SELECT layer_id FROM layer_refs)')
        .pluck()
        .all() as string[];
      const del = this.db.prepare('DELETE FROM layers WHERE id = ?');
      for (const id of ids) del.run(id);
      return ids;
    })();
  }

  all(): string[] {
    return this.db.prepare('SELECT id FROM layers').pluck().all() as string[];
  }
}
