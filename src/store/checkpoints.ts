import type { Selectable } from 'kysely';
import { atomically, type Db } from './db.js';
import type { CheckpointsTable } from './schema.js';
import type { Page } from './instances.js';
import { PreparedQuery } from './prepared.js';

const byId = new PreparedQuery((db, id: string) => db.selectFrom('checkpoints').selectAll().where('id', '=', id));

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
  /** Its memory image is of a tree in a user namespace: forks and restores of it get one. */
  userNamespace: boolean;
}

type Row = Selectable<CheckpointsTable>;

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
  userNamespace: r.user_namespace === 1,
});

export class CheckpointStore {
  constructor(private readonly db: Db) {}

  async insert(c: CheckpointRecord): Promise<void> {
    await this.db
      .insertInto('checkpoints')
      .values({
        id: c.id,
        instance_id: c.instanceId,
        owner: c.owner,
        label: c.label,
        status: c.status,
        memory: c.memory ? 1 : 0,
        parent_id: c.parentId,
        layers: JSON.stringify(c.layers),
        base_layer: c.baseLayer ? 1 : 0,
        image: c.image,
        agent_layer: c.agentLayer,
        hostname: c.hostname,
        delta_bytes: c.deltaBytes,
        memory_bytes: c.memoryBytes,
        pause_ms: c.pauseMs,
        error: c.error,
        created_at: c.createdAt,
        ready_at: c.readyAt,
        user_namespace: c.userNamespace ? 1 : 0,
      })
      .execute();
  }

  async get(id: string): Promise<CheckpointRecord | undefined> {
    const row = await byId.first(this.db, id);
    return row && fromRow(row);
  }

  /** Oldest first. */
  async forInstance(instanceId: string): Promise<CheckpointRecord[]> {
    const rows = await this.db.selectFrom('checkpoints').selectAll().where('instance_id', '=', instanceId).orderBy('created_at').orderBy('id').execute();
    return rows.map(fromRow);
  }

  async withStatus(status: CheckpointStatus): Promise<CheckpointRecord[]> {
    return (await this.db.selectFrom('checkpoints').selectAll().where('status', '=', status).execute()).map(fromRow);
  }

  async page(instanceId: string, limit: number, cursor?: string): Promise<Page<CheckpointRecord>> {
    const all = (await this.forInstance(instanceId)).reverse();
    const start = cursor ? all.findIndex((c) => c.id === cursor) + 1 : 0;
    const items = all.slice(start, start + limit);
    return { items, nextCursor: start + limit < all.length ? items[items.length - 1]!.id : null };
  }

  /** Writes the patch's fields, and only those: never the status (see `settle`). */
  async update(id: string, patch: Partial<Pick<CheckpointRecord, 'layers' | 'baseLayer' | 'pauseMs'>>): Promise<void> {
    const set = {
      ...(patch.layers !== undefined ? { layers: JSON.stringify(patch.layers) } : {}),
      ...(patch.baseLayer !== undefined ? { base_layer: patch.baseLayer ? 1 : 0 } : {}),
      ...(patch.pauseMs !== undefined ? { pause_ms: patch.pauseMs } : {}),
    };
    if (Object.keys(set).length === 0) return;
    await this.db.updateTable('checkpoints').set(set).where('id', '=', id).execute();
  }

  /**
   * A checkpoint's one status change: `processing` to `ready` or `failed`, as a compare-and-set.
   * False when it was no longer processing (settled already, or deleted): an outcome that comes
   * second never overwrites the first (a ready checkpoint is never marked failed afterwards).
   */
  async settle(id: string, outcome: { status: 'ready'; deltaBytes: number; memoryBytes: number; readyAt: string } | { status: 'failed'; error: string }): Promise<boolean> {
    const set =
      outcome.status === 'ready'
        ? { status: outcome.status, delta_bytes: outcome.deltaBytes, memory_bytes: outcome.memoryBytes, ready_at: outcome.readyAt }
        : { status: outcome.status, error: outcome.error };
    const r = await this.db.updateTable('checkpoints').set(set).where('id', '=', id).where('status', '=', 'processing').executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** Deletes a checkpoint; its children and the instances whose head it was point at its
   * own parent instead (the nearest ancestor that still exists, or none). */
  /** Whether any checkpoint stands on the image (its chain's base). */
  async anyOnImage(image: string): Promise<boolean> {
    return (await this.db.selectFrom('checkpoints').select('id').where('image', '=', image).limit(1).executeTakeFirst()) !== undefined;
  }

  async delete(id: string): Promise<void> {
    await atomically(this.db, async (trx) => {
      const parent = (await trx.selectFrom('checkpoints').select('parent_id').where('id', '=', id).executeTakeFirst())?.parent_id ?? null;
      await trx.updateTable('checkpoints').set({ parent_id: parent }).where('parent_id', '=', id).execute();
      await trx.updateTable('instances').set({ head_checkpoint_id: parent }).where('head_checkpoint_id', '=', id).execute();
      await trx.deleteFrom('checkpoints').where('id', '=', id).execute();
    });
  }

  /** Instances forked from this checkpoint that still exist. */
  async dependentInstances(id: string): Promise<string[]> {
    const rows = await this.db.selectFrom('instances').select('id').where('source_checkpoint_id', '=', id).execute();
    return rows.map((r) => r.id);
  }
}
