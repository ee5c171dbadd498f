import { atomically, type Db } from './db.js';

/** What a durable checkpoint's manifest says: where each of its parts is in the object store. */
export interface DurableManifest {
  checkpointId: string;
  image: string;
  agentLayer: string;
  baseLayer: boolean;
  hostname: string;
  /** Newest first, as the checkpoint's layers. */
  layers: { id: string; blob: string; bytes: number }[];
  memory: { blob: string; bytes: number } | null;
}

export interface DurableRecord {
  checkpointId: string;
  manifest: DurableManifest;
  uploadedBytes: number;
  durableAt: string;
}

/** Which checkpoints are in the object store, and the blobs they reference (reference-counted:
 * a blob nothing references is garbage). */
export class DurableStore {
  constructor(private readonly db: Db) {}

  async get(checkpointId: string): Promise<DurableRecord | undefined> {
    const r = await this.db.selectFrom('durable_checkpoints').selectAll().where('checkpoint_id', '=', checkpointId).executeTakeFirst();
    return r && { checkpointId: r.checkpoint_id, manifest: JSON.parse(r.manifest) as DurableManifest, uploadedBytes: r.uploaded_bytes, durableAt: r.durable_at };
  }

  async hasBlob(sha: string): Promise<boolean> {
    return (await this.db.selectFrom('durable_blobs').select('sha').where('sha', '=', sha).executeTakeFirst()) !== undefined;
  }

  async addBlob(sha: string, bytes: number): Promise<void> {
    await this.db
      .insertInto('durable_blobs')
      .values({ sha, bytes, created_at: new Date().toISOString() })
      .onConflict((oc) => oc.column('sha').doNothing())
      .execute();
  }

  async layerBlob(layerId: string): Promise<string | undefined> {
    return (await this.db.selectFrom('layer_blobs').select('sha').where('layer_id', '=', layerId).executeTakeFirst())?.sha;
  }

  async setLayerBlob(layerId: string, sha: string): Promise<void> {
    await this.db
      .insertInto('layer_blobs')
      .values({ layer_id: layerId, sha })
      .onConflict((oc) => oc.column('layer_id').doUpdateSet({ sha }))
      .execute();
  }

  /** Records the checkpoint as durable with the blobs it references. */
  async put(rec: DurableRecord): Promise<void> {
    const row = { manifest: JSON.stringify(rec.manifest), uploaded_bytes: rec.uploadedBytes, durable_at: rec.durableAt };
    const blobs = new Set([...rec.manifest.layers.map((l) => l.blob), ...(rec.manifest.memory ? [rec.manifest.memory.blob] : [])]);
    await atomically(this.db, async (trx) => {
      await trx
        .insertInto('durable_checkpoints')
        .values({ checkpoint_id: rec.checkpointId, ...row })
        .onConflict((oc) => oc.column('checkpoint_id').doUpdateSet(row))
        .execute();
      if (blobs.size === 0) return;
      await trx
        .insertInto('durable_refs')
        .values([...blobs].map((sha) => ({ checkpoint_id: rec.checkpointId, sha })))
        .onConflict((oc) => oc.columns(['checkpoint_id', 'sha']).doNothing())
        .execute();
    });
  }

  /** Forgets a checkpoint; its blobs stay until `garbage` finds them unreferenced. */
  async drop(checkpointId: string): Promise<void> {
    await atomically(this.db, async (trx) => {
      await trx.deleteFrom('durable_refs').where('checkpoint_id', '=', checkpointId).execute();
      await trx.deleteFrom('durable_checkpoints').where('checkpoint_id', '=', checkpointId).execute();
    });
  }

  /** Blobs nothing references. */
  async garbage(): Promise<string[]> {
    const rows = await this.db
      .selectFrom('durable_blobs')
      .select('sha')
      .where('sha', 'not in', this.db.selectFrom('durable_refs').select('sha'))
      .execute();
    return rows.map((r) => r.sha);
  }

  async removeBlob(sha: string): Promise<void> {
    await atomically(this.db, async (trx) => {
      await trx.deleteFrom('durable_blobs').where('sha', '=', sha).execute();
      await trx.deleteFrom('layer_blobs').where('sha', '=', sha).execute();
    });
  }

  /** Ready checkpoints not yet in the object store (after a restart, or a failed upload). */
  async pending(): Promise<string[]> {
    const rows = await this.db
      .selectFrom('checkpoints')
      .select('id')
      .where('status', '=', 'ready')
      .where('id', 'not in', this.db.selectFrom('durable_checkpoints').select('checkpoint_id'))
      .orderBy('created_at')
      .execute();
    return rows.map((r) => r.id);
  }

  /** Durable checkpoints whose checkpoint is gone (deleted while an upload ran). */
  async orphans(): Promise<string[]> {
    const rows = await this.db
      .selectFrom('durable_checkpoints')
      .select('checkpoint_id')
      .where('checkpoint_id', 'not in', this.db.selectFrom('checkpoints').select('id'))
      .execute();
    return rows.map((r) => r.checkpoint_id);
  }
}
