import type { Db } from './db.js';

export type InstanceStatus = 'starting' | 'running' | 'hibernated' | 'stopped' | 'error';

export interface Limits {
  memoryMb: number;
  pids: number;
  cpuPercent: number;
  /** Everything the instance writes, its checkpoints' changes included; null or absent: none. */
  diskMb?: number | null;
}

export interface InstanceRecord {
  id: string;
  owner: string;
  name: string;
  image: string;
  status: InstanceStatus;
  /** Frozen layers under the instance's upper, newest first. */
  layers: string[];
  /** The oldest layer is a squashed full root: no image goes under it. */
  baseLayer: boolean;
  agentLayer: string;
  env: Record<string, string>;
  limits: Limits;
  metadata: Record<string, string>;
  pid: number | null;
  pidStart: string | null;
  sourceInstanceId: string | null;
  sourceCheckpointId: string | null;
  maxCheckpoints: number | null;
  headCheckpointId: string | null;
  /** The memory image a hibernated instance wakes from. */
  hibernationId: string | null;
  /** Seconds without activity after which it hibernates by itself; null: never. */
  idleTimeoutS: number | null;
  /** Its address on the sandboxes' network (kept through rollbacks and wakes); null: none. */
  address: string | null;
  /** Where it may open connections to. */
  egress: EgressPolicy;
  /** The built image or template it was made from (null: \`image\` itself). */
  imageRef: string | null;
  /** Where its commands start unless told (an image's WORKDIR); null: /. */
  workdir: string | null;
  /** When it ends by itself, and how (null: never). */
  expiresAt: string | null;
  onExpiry: 'delete' | 'hibernate' | null;
  error: string | null;
  createdAt: string;
  updatedAt: string;
}

interface Row {
  id: string;
  owner: string;
  name: string;
  image: string;
  status: InstanceStatus;
  layers: string;
  base_layer: number;
  agent_layer: string;
  env: string;
  limits: string;
  metadata: string;
  pid: number | null;
  pid_start: string | null;
  source_instance_id: string | null;
  source_checkpoint_id: string | null;
  max_checkpoints: number | null;
  head_checkpoint_id: string | null;
  hibernation_id: string | null;
  idle_timeout_s: number | null;
  address: string | null;
  egress: string | null;
  image_ref: string | null;
  workdir: string | null;
  expires_at: string | null;
  on_expiry: 'delete' | 'hibernate' | null;
  error: string | null;
  created_at: string;
  updated_at: string;
}

const fromRow = (r: Row): InstanceRecord => ({
  id: r.id,
  owner: r.owner,
  name: r.name,
  image: r.image,
  status: r.status,
  layers: JSON.parse(r.layers) as string[],
  baseLayer: r.base_layer === 1,
  agentLayer: r.agent_layer,
  env: JSON.parse(r.env) as Record<string, string>,
  limits: JSON.parse(r.limits) as Limits,
  metadata: JSON.parse(r.metadata) as Record<string, string>,
  pid: r.pid,
  pidStart: r.pid_start,
  sourceInstanceId: r.source_instance_id,
  sourceCheckpointId: r.source_checkpoint_id,
  maxCheckpoints: r.max_checkpoints,
  headCheckpointId: r.head_checkpoint_id,
  hibernationId: r.hibernation_id,
  idleTimeoutS: r.idle_timeout_s,
  address: r.address,
  egress: r.egress ? (JSON.parse(r.egress) as EgressPolicy) : { egress: 'allow', allow: [], deny: [] },
  imageRef: r.image_ref,
  workdir: r.workdir,
  expiresAt: r.expires_at,
  onExpiry: r.on_expiry,
  error: r.error,
  createdAt: r.created_at,
  updatedAt: r.updated_at,
});

/** Where an instance may open connections to (the engine's EgressPolicy, as stored). */
export interface EgressPolicy {
  egress: 'allow' | 'deny';
  allow: string[];
  deny: string[];
}

export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

export class InstanceStore {
  constructor(private readonly db: Db) {}

  insert(rec: InstanceRecord): void {
    this.db
      .prepare(
        `INSERT INTO instances (id, owner, name, image, status, layers, base_layer, agent_layer, env, limits, metadata,
           pid, pid_start, source_instance_id, source_checkpoint_id, max_checkpoints, head_checkpoint_id, hibernation_id, idle_timeout_s,
           address, egress, image_ref, workdir, expires_at, on_expiry, error, created_at, updated_at)
         VALUES (@id, @owner, @name, @image, @status, @layers, @baseLayer, @agentLayer, @env, @limits, @metadata,
           @pid, @pidStart, @sourceInstanceId, @sourceCheckpointId, @maxCheckpoints, @headCheckpointId, @hibernationId, @idleTimeoutS,
           @address, @egress, @imageRef, @workdir, @expiresAt, @onExpiry, @error, @createdAt, @updatedAt)`,
      )
      .run({
        ...rec,
        egress: JSON.stringify(rec.egress),
        layers: JSON.stringify(rec.layers),
        baseLayer: rec.baseLayer ? 1 : 0,
        env: JSON.stringify(rec.env),
        limits: JSON.stringify(rec.limits),
        metadata: JSON.stringify(rec.metadata),
      });
  }

  get(id: string): InstanceRecord | undefined {
    const row = this.db.prepare('SELECT * FROM instances WHERE id = ?').get(id) as Row | undefined;
    return row && fromRow(row);
  }

  all(): InstanceRecord[] {
    return (this.db.prepare('SELECT * FROM instances').all() as Row[]).map(fromRow);
  }

  /** Every address in use on the sandboxes' network. */
  addresses(): string[] {
    return this.db.prepare('SELECT address FROM instances WHERE address IS NOT NULL').pluck().all() as string[];
  }

  /** Instances whose lifetime ended before `now` and that are still there to end. */
  expired(now: string): InstanceRecord[] {
    return (this.db.prepare("SELECT * FROM instances WHERE expires_at IS NOT NULL AND expires_at <= ? AND status IN ('running', 'stopped', 'hibernated', 'error')").all(now) as Row[]).map(fromRow);
  }

  /** Running instances that hibernate when idle: what the idle monitor watches. */
  idleCandidates(): InstanceRecord[] {
    return (this.db.prepare("SELECT * FROM instances WHERE status = 'running' AND idle_timeout_s > 0").all() as Row[]).map(fromRow);
  }

  /** Newest first; the cursor is the last id of the previous page. */
  page(owner: string, limit: number, cursor?: string): Page<InstanceRecord> {
    const after = cursor ? this.get(cursor) : undefined;
    const rows = (
      after
        ? this.db
            .prepare(
              `SELECT * FROM instances WHERE owner = ? AND (created_at < ? OR (created_at = ? AND id < ?))
               ORDER BY created_at DESC, id DESC LIMIT ?`,
            )
            .all(owner, after.createdAt, after.createdAt, after.id, limit + 1)
        : this.db
            .prepare('SELECT * FROM instances WHERE owner = ? ORDER BY created_at DESC, id DESC LIMIT ?')
            .all(owner, limit + 1)
    ) as Row[];
    const items = rows.slice(0, limit).map(fromRow);
    return { items, nextCursor: rows.length > limit ? items[items.length - 1]!.id : null };
  }

  update(id: string, patch: Partial<Omit<InstanceRecord, 'id' | 'owner' | 'createdAt'>>): InstanceRecord {
    const cur = this.get(id);
    if (!cur) throw new Error(`instance ${id} vanished from the store`);
    const next: InstanceRecord = { ...cur, ...patch, updatedAt: new Date().toISOString() };
    this.db
      .prepare(
        `UPDATE instances SET name=@name, image=@image, status=@status, layers=@layers, base_layer=@baseLayer, agent_layer=@agentLayer,
           env=@env, limits=@limits, metadata=@metadata, pid=@pid, pid_start=@pidStart,
           max_checkpoints=@maxCheckpoints, head_checkpoint_id=@headCheckpointId, hibernation_id=@hibernationId,
           idle_timeout_s=@idleTimeoutS, address=@address, egress=@egress, image_ref=@imageRef, workdir=@workdir, expires_at=@expiresAt, on_expiry=@onExpiry, error=@error, updated_at=@updatedAt WHERE id=@id`,
      )
      .run({
        ...next,
        egress: JSON.stringify(next.egress),
        layers: JSON.stringify(next.layers),
        baseLayer: next.baseLayer ? 1 : 0,
        env: JSON.stringify(next.env),
        limits: JSON.stringify(next.limits),
        metadata: JSON.stringify(next.metadata),
      });
    return next;
  }

  /** How many of the owner's instances stand on the image (by its own name or a built one's). */
  countOnImage(owner: string | null, image: string): number {
    return owner === null
      ? (this.db.prepare('SELECT COUNT(*) FROM instances WHERE image = ? OR image_ref = ?').pluck().get(image, image) as number)
      : (this.db.prepare('SELECT COUNT(*) FROM instances WHERE owner = ? AND image_ref = ?').pluck().get(owner, image) as number);
  }

  delete(id: string): void {
    this.db.prepare('DELETE FROM instances WHERE id = ?').run(id);
  }
}
