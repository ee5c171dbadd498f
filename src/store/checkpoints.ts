import type { Db } from './db.js';
import type { Page } from './instances.js';

export type CheckpointStatus = 'processing' | 'ready' | 'failed';

export interface CheckpointRecord {
  id: string;
  instanceId: string;
  owner: string;
  label: string | null;
  status: CheckpointStatus;
  memory: boolean;
  parentId: string | null;
  /** The instance's whole layer stack at the checkpoint, newest first (the frozen upper first). */
  layers: string[];
  /** The oldest layer is a squashed full root: no image goes under it. */
  baseLayer: boolean;
  image: string;
  agentLayer: string;
  hostname: string;
  deltaBytes: number | null;
  memoryBytes: number | null;
  /** How long the instance was frozen for it, dump to restored. */
  pauseMs: number | null;
  error: string | null;
  createdAt: string;
  readyAt: string | null;
}

interface Row {
  id: string;
  instance_id: string;
  owner: string;
  label: string | null;
  status: CheckpointStatus;
  memory: number;
  parent_id: string | null;
  layers: string;
  base_layer: number;
  image: string;
  agent_layer: string;
  hostname: string;
  delta_bytes: number | null;
  memory_bytes: number | null;
  pause_ms: number | null;
  error: string | null;
  created_at: string;
  ready_at: string | null;
}

const fromRow = (r: Row): CheckpointRecord => ({
  id: r.id,
  instanceId: r.instance_id,
  owner: r.owner,
  label: r.label,
  status: r.status,
  memory: r.memory === 1,
  parentId: r.parent_id,
  layers: JSON.parse(r.layers) as string[],
  baseLayer: r.base_layer === 1,
  image: r.image,
  agentLayer: r.agent_layer,
  hostname: r.hostname,
  deltaBytes: r.delta_bytes,
  memoryBytes: r.memory_bytes,
  pauseMs: r.pause_ms,
  error: r.error,
  createdAt: r.created_at,
  readyAt: r.ready_at,
});

export class CheckpointStore {
  constructor(private readonly db: Db) {}

  insert(c: CheckpointRecord): void {
    this.db
      .prepare(
        `INSERT INTO checkpoints (id, instance_id, owner, label, status, memory, parent_id, layers, base_layer, image,
           agent_layer, hostname, delta_bytes, memory_bytes, pause_ms, error, created_at, ready_at)
         VALUES (@id, @instanceId, @owner, @label, @status, @memory, @parentId, @layers, @baseLayer, @image,
           @agentLayer, @hostname, @deltaBytes, @memoryBytes, @pauseMs, @error, @createdAt, @readyAt)`,
      )
      .run({ ...c, memory: c.memory ? 1 : 0, baseLayer: c.baseLayer ? 1 : 0, layers: JSON.stringify(c.layers) });
  }

  get(id: string): CheckpointRecord | undefined {
    const row = this.db.prepare('SELECT * FROM checkpoints WHERE id = ?').get(id) as Row | undefined;
    return row && fromRow(row);
  }

  forInstance(instanceId: string): CheckpointRecord[] {
    return (
      this.db
        .prepare('SELECT * FROM checkpoints WHERE instance_id = ? ORDER BY created_at, rowid')
        .all(instanceId) as Row[]
    ).map(fromRow);
  }

  withStatus(status: CheckpointStatus): CheckpointRecord[] {
    return (this.db.prepare('SELECT * FROM checkpoints WHERE status = ?').all(status) as Row[]).map(fromRow);
  }

  page(instanceId: string, limit: number, cursor?: string): Page<CheckpointRecord> {
    const all = this.forInstance(instanceId).reverse();
    const start = cursor ? all.findIndex((c) => c.id === cursor) + 1 : 0;
    const items = all.slice(start, start + limit);
    return { items, nextCursor: start + limit < all.length ? items[items.length - 1]!.id : null };
  }

  update(id: string, patch: Partial<Pick<CheckpointRecord, 'status' | 'layers' | 'baseLayer' | 'deltaBytes' | 'memoryBytes' | 'pauseMs' | 'error' | 'readyAt' | 'instanceId'>>): void {
    const cur = this.get(id);
    if (!cur) return;
    const next = { ...cur, ...patch };
    this.db
      .prepare(
        `UPDATE checkpoints SET status=@status, layers=@layers, base_layer=@baseLayer, delta_bytes=@deltaBytes,
           memory_bytes=@memoryBytes, pause_ms=@pauseMs, error=@error, ready_at=@readyAt WHERE id=@id`,
      )
      .run({ ...next, baseLayer: next.baseLayer ? 1 : 0, layers: JSON.stringify(next.layers) });
  }

  /** Deletes a checkpoint; its children and the instances whose head it was point at its
   * own parent instead (the nearest ancestor that still exists, or none). */
  delete(id: string): void {
    const parent = this.get(id)?.parentId ?? null;
    this.db.transaction(() => {
      this.db.prepare('UPDATE checkpoints SET parent_id = ? WHERE parent_id = ?').run(parent, id);
      this.db.prepare('UPDATE instances SET head_checkpoint_id = ? WHERE head_checkpoint_id = ?').run(parent, id);
      this.db.prepare('DELETE FROM checkpoints WHERE id = ?').run(id);
    })();
  }

  /** Instances forked from this checkpoint that still exist. */
  dependentInstances(id: string): string[] {
    return this.db.prepare('SELECT id FROM instances WHERE source_checkpoint_id = ?').pluck().all(id) as string[];
  }
}
