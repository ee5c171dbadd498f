import type { Db } from './db.js';

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

  get(checkpointId: string): DurableRecord | undefined {
    const r = this.db.prepare('SELECT * FROM durable_checkpoints WHERE checkpoint_id = ?').get(checkpointId) as
      | { checkpoint_id: string; manifest: string; uploaded_bytes: number; durable_at: string }
      | undefined;
    return r && { checkpointId: r.checkpoint_id, manifest: JSON.parse(r.manifest) as DurableManifest, uploadedBytes: r.uploaded_bytes, durableAt: r.durable_at };
  }

  hasBlob(sha: string): boolean {
    return this.db.prepare('SELECT 1 FROM durable_blobs WHERE sha = ?').get(sha) !== undefined;
  }

  addBlob(sha: string, bytes: number): void {
    this.db.prepare('INSERT OR IGNORE INTO durable_blobs (sha, bytes, created_at) VALUES (?, ?, ?)').run(sha, bytes, new Date().toISOString());
  }

  layerBlob(layerId: string): string | undefined {
    return this.db.prepare('SELECT sha FROM layer_blobs WHERE layer_id = ?').pluck().get(layerId) as string | undefined;
  }

  setLayerBlob(layerId: string, sha: string): void {
    this.db.prepare('INSERT OR REPLACE INTO layer_blobs (layer_id, sha) VALUES (?, ?)').run(layerId, sha);
  }

  /** Records the checkpoint as durable with the blobs it references. */
  put(rec: DurableRecord): void {
    this.db.transaction(() => {
      this.db
        .prepare('INSERT OR REPLACE INTO durable_checkpoints (checkpoint_id, manifest, uploaded_bytes, durable_at) VALUES (?, ?, ?, ?)')
        .run(rec.checkpointId, JSON.stringify(rec.manifest), rec.uploadedBytes, rec.durableAt);
      const ins = this.db.prepare('INSERT OR IGNORE INTO durable_refs (checkpoint_id, sha) VALUES (?, ?)');
      for (const l of rec.manifest.layers) ins.run(rec.checkpointId, l.blob);
      if (rec.manifest.memory) ins.run(rec.checkpointId, rec.manifest.memory.blob);
    })();
  }

  /** Forgets a checkpoint; its blobs stay until `garbage` finds them unreferenced. */
  drop(checkpointId: string): void {
    this.db.transaction(() => {
      this.db.prepare('DELETE FROM durable_refs WHERE checkpoint_id = ?').run(checkpointId);
      this.db.prepare('DELETE FROM durable_checkpoints WHERE checkpoint_id = ?').run(checkpointId);
    })();
  }

  /** Blobs nothing references. */
  garbage(): string[] {
    return this.db.prepare('SELECT sha FROM durable_blobs WHERE sha NOT IN (SELECT sha FROM durable_refs)').pluck().all() as string[];
  }

  removeBlob(sha: string): void {
    this.db.transaction(() => {
      this.db.prepare('DELETE FROM durable_blobs WHERE sha = ?').run(sha);
      this.db.prepare('DELETE FROM layer_blobs WHERE sha = ?').run(sha);
    })();
  }

  /** Ready checkpoints not yet in the object store (after a restart, or a failed upload). */
  pending(): string[] {
    return this.db
      .prepare("SELECT id FROM checkpoints WHERE status = 'ready' AND id NOT IN (SELECT checkpoint_id FROM durable_checkpoints) ORDER BY created_at")
      .pluck()
      .all() as string[];
  }

  /** Durable checkpoints whose checkpoint is gone (deleted while an upload ran). */
  orphans(): string[] {
    return this.db.prepare('SELECT checkpoint_id FROM durable_checkpoints WHERE checkpoint_id NOT IN (SELECT id FROM checkpoints)').pluck().all() as string[];
  }
}
