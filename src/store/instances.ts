import type { Compilable, ExpressionBuilder, Selectable } from 'kysely';
import { atomically, type Db } from './db.js';
import { StaleWriteError, type WriteFence } from './fence.js';
import type { Tables } from './schema.js';
import type { InstancesTable } from './schema.js';
import type { VolumeMount } from '../seam/runtime.js';
import { PreparedQuery } from './prepared.js';

/** A secret an instance may use: its commands see `placeholder` in `env`; its requests to
 * `hosts` carry the value in its place (the egress proxy). */

/** What an instance's lifetime ends in. */
export type ExpiryAction = 'delete' | 'hibernate' | 'stop';
export interface InstanceSecret {
  name: string;
  env: string;
  hosts: string[];
  placeholder: string;
  /** The secret store (its id) the secret is of; absent: the owner's own secrets. */
  store?: string;
}

/** A volume as an instance mounts it, with the volume's name (null for a placeholder). */
export interface InstanceVolume extends VolumeMount {
  name: string | null;
}

/** `lost`: its node stopped answering; `recover` brings it back on another from its newest
 * durable checkpoint. */
export type InstanceStatus = 'starting' | 'running' | 'hibernated' | 'stopped' | 'error' | 'lost';

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
  /** When it ends by itself, and how (null: never): deleted, hibernated (memory kept) or
   * stopped (files kept). */
  expiresAt: string | null;
  onExpiry: ExpiryAction | null;
  error: string | null;
  createdAt: string;
  updatedAt: string;
  /** The node its disk and processes are on (null: from before nodes; the start adopts it). */
  node: string | null;
  /** The first host uid of its range: its ids 0..65535 are the host's uidBase.., in a user
   * namespace of its own; null: none (the host's ids, `user_namespace: false`). */
  uidBase: number | null;
  /** The checkpoint a restore under way (a rollback, a fork) brings it back from; null: none. */
  restoringFrom: string | null;
  /** The persistent volumes it mounts, fixed when it is made (a fork's are its source's, or
   * empty placeholders in their places). */
  volumes: InstanceVolume[];
  /** The secrets it may use, and where (a fork's are its source's). */
  secrets: InstanceSecret[];
  /** Its egress CA, sealed (core/egress-secrets.ts); null: none (no secrets). */
  egressCa: string | null;
  /** It took a standby made ahead (core/warm-standbys.ts) instead of being restored or booted. */
  warmFork: boolean;
  /** Who its commands run as unless told: its image's USER (`name`, `uid`, with `:group`); null: root. */
  defaultUser: string | null;
  /** Its image's VOLUME paths: each a mount point of its own in its sandbox, on its own disk. */
  imageVolumes: string[];
  /** How many writes the row has had (a transition's compare-and-set is on it). */
  version: number;
}

type Row = Selectable<InstancesTable>;

/** What a plain update may write: anything but identity, status and node. */
export type InstancePatch = Partial<Omit<InstanceRecord, 'id' | 'owner' | 'createdAt' | 'updatedAt' | 'status' | 'node' | 'version'>>;

/** The columns of a patch, as stored. */
function columnsOf(patch: InstancePatch): Partial<Row> {
  const full = toRow(patch as InstanceRecord) as Partial<Row>;
  const keys = new Set(Object.keys(patch).map(columnOf));
  return Object.fromEntries(Object.entries(full).filter(([k]) => keys.has(k))) as Partial<Row>;
}

const columnOf = (field: string) => field.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

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
  node: r.node,
  uidBase: r.uid_base,
  restoringFrom: r.restoring_from,
  volumes: JSON.parse(r.volumes) as InstanceVolume[],
  secrets: JSON.parse(r.secrets) as InstanceSecret[],
  egressCa: r.egress_ca,
  warmFork: r.warm_fork === 1,
  defaultUser: r.default_user,
  imageVolumes: JSON.parse(r.image_volumes) as string[],
  version: Number(r.version),
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

const toRow = (rec: InstanceRecord): Omit<Row, 'version'> => ({
  id: rec.id,
  owner: rec.owner,
  name: rec.name,
  image: rec.image,
  status: rec.status,
  layers: JSON.stringify(rec.layers),
  base_layer: rec.baseLayer ? 1 : 0,
  agent_layer: rec.agentLayer,
  env: JSON.stringify(rec.env),
  limits: JSON.stringify(rec.limits),
  metadata: JSON.stringify(rec.metadata),
  pid: rec.pid,
  pid_start: rec.pidStart,
  source_instance_id: rec.sourceInstanceId,
  source_checkpoint_id: rec.sourceCheckpointId,
  max_checkpoints: rec.maxCheckpoints,
  head_checkpoint_id: rec.headCheckpointId,
  hibernation_id: rec.hibernationId,
  idle_timeout_s: rec.idleTimeoutS,
  address: rec.address,
  egress: JSON.stringify(rec.egress),
  image_ref: rec.imageRef,
  workdir: rec.workdir,
  expires_at: rec.expiresAt,
  on_expiry: rec.onExpiry,
  error: rec.error,
  created_at: rec.createdAt,
  updated_at: rec.updatedAt,
  node: rec.node,
  uid_base: rec.uidBase,
  restoring_from: rec.restoringFrom,
  volumes: JSON.stringify(rec.volumes),
  secrets: JSON.stringify(rec.secrets),
  egress_ca: rec.egressCa,
  warm_fork: rec.warmFork ? 1 : 0,
  default_user: rec.defaultUser,
  image_volumes: JSON.stringify(rec.imageVolumes),
});

/** The condition every write of this node's carries once it holds a lease: the row is its
 * own, and its lease is still the current one. */
function leaseHolds(eb: ExpressionBuilder<Tables, 'instances'>, lease: { node: string; epoch: number }) {
  return eb.and([
    eb('instances.node', '=', lease.node),
    eb.exists(eb.selectFrom('nodes').select('nodes.id').where('nodes.id', '=', lease.node).where('nodes.epoch', '=', lease.epoch)),
  ]);
}

type Columns = Partial<Row>;

/** The columns a patch writes, in their one order (toRow's), those it leaves out dropped. */
function written(changed: Columns): { names: (keyof Row)[]; values: unknown[] } {
  const names = (Object.keys(changed) as (keyof Row)[]).filter((k) => changed[k] !== undefined);
  return { names, values: names.map((k) => changed[k]) };
}

/** Writes by the columns they set, prepared once each (prepared.ts): an update's query took
 * 129 µs against 48 compiled, 675 against 315 after a 5 ms idle moment, and every status
 * change is one. The shapes are the code's own patches; past the bound, a write is built as it
 * comes. */
const MAX_SHAPES = 256;
const shapes = new Map<string, PreparedQuery<unknown[], Row>>();
function shaped(key: string, build: (db: Db, args: unknown[]) => Compilable<Row>): PreparedQuery<unknown[], Row> {
  let q = shapes.get(key);
  if (!q) {
    q = new PreparedQuery<unknown[], Row>((db, ...args) => build(db, args));
    if (shapes.size < MAX_SHAPES) shapes.set(key, q);
  }
  return q;
}

const setOf = (names: (keyof Row)[], values: unknown[]) => Object.fromEntries(names.map((n, i) => [n, values[i]])) as Columns;

// The lookups every API call, create and fork makes (prepared.ts).
const byId = new PreparedQuery((db, id: string) => db.selectFrom('instances').selectAll().where('id', '=', id));
const holdingsOf = new PreparedQuery((db, owner: string) => db.selectFrom('instances').select(['limits', 'address']).where('owner', '=', owner));
const rangesHeldBy = new PreparedQuery((db, owner: string) => db.selectFrom('instances').select((eb) => eb.fn.countAll().as('n')).where('owner', '=', owner).where('uid_base', 'is not', null));

export class InstanceStore {
  constructor(
    private readonly db: Db,
    private readonly fence: WriteFence,
  ) {}

  async insert(rec: InstanceRecord): Promise<void> {
    await this.db.insertInto('instances').values(toRow(rec)).execute();
  }

  async get(id: string): Promise<InstanceRecord | undefined> {
    const row = await byId.first(this.db, id);
    return row && fromRow(row);
  }

  async all(): Promise<InstanceRecord[]> {
    return (await this.db.selectFrom('instances').selectAll().execute()).map(fromRow);
  }

  /** The instances whose disk and processes are on the node. */
  async forNode(node: string): Promise<InstanceRecord[]> {
    return (await this.db.selectFrom('instances').selectAll().where('node', '=', node).execute()).map(fromRow);
  }

  /** Instances from before nodes belong to the one server there was: the first node to start. */
  async adoptUnplaced(node: string): Promise<void> {
    await this.db.updateTable('instances').set((eb) => ({ node, version: eb('version', '+', 1) })).where('node', 'is', null).execute();
  }

  /** The instances of nodes that stopped answering become `lost`; answers their ids. */
  async markLost(nodes: string[]): Promise<string[]> {
    if (nodes.length === 0) return [];
    return atomically(this.db, async (trx) => {
      const rows = await trx.selectFrom('instances').select('id').where('node', 'in', nodes).where('status', '!=', 'lost').execute();
      if (rows.length === 0) return [];
      const now = new Date().toISOString();
      // pid and pid_start stay: a node that comes back re-adopts what still runs.
      await trx.updateTable('instances').set((eb) => ({ status: 'lost' as const, updated_at: now, version: eb('version', '+', 1) })).where('node', 'in', nodes).where('status', '!=', 'lost').execute();
      return rows.map((r) => r.id);
    });
  }

  /** The instances of `node` the others marked lost (while its heartbeat could not reach the
   * store, a database away for a while). */
  async lostOf(node: string): Promise<InstanceRecord[]> {
    const rows = await this.db.selectFrom('instances').selectAll().where('node', '=', node).where('status', '=', 'lost').execute();
    return rows.map(fromRow);
  }

  /** Instances a draining node handed over: lost, on a node that is draining. */
  async handedOver(): Promise<InstanceRecord[]> {
    const rows = await this.db
      .selectFrom('instances')
      .selectAll()
      .where('status', '=', 'lost')
      .where('node', 'in', (eb) => eb.selectFrom('nodes').select('nodes.id').where('nodes.draining', '=', 1))
      .execute();
    return rows.map(fromRow);
  }

  /** Gives a lost instance back to its own node as `status`; false if another node took it
   * meanwhile (a recover). */
  async reclaimLost(id: string, node: string, status: InstanceStatus): Promise<boolean> {
    const r = await this.db
      .updateTable('instances')
      .set((eb) => ({ status, updated_at: new Date().toISOString(), version: eb('version', '+', 1) }))
      .where('id', '=', id)
      .where('node', '=', node)
      .where('status', '=', 'lost')
      .executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** Takes a lost instance for `node`, as `starting`; false if it is not lost (any more: another
   * node took it first). */
  async claimLost(id: string, node: string): Promise<boolean> {
    const r = await this.db
      .updateTable('instances')
      .set((eb) => ({ node, status: 'starting' as const, updated_at: new Date().toISOString(), version: eb('version', '+', 1) }))
      .where('id', '=', id)
      .where('status', '=', 'lost')
      .executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** How many uid ranges the owner's instances hold. */
  async uidRangesHeldBy(owner: string): Promise<number> {
    const row = await rangesHeldBy.first(this.db, owner);
    return Number(row?.n ?? 0);
  }

  /** Every uid range held by an instance, of any node, and whose instance holds it. */
  async uidRanges(): Promise<{ uidBase: number; owner: string }[]> {
    const rows = await this.db.selectFrom('instances').select(['uid_base', 'owner']).where('uid_base', 'is not', null).execute();
    return rows.map((r) => ({ uidBase: Number(r.uid_base), owner: r.owner }));
  }

  /** The instances that mount a volume (its id is random hex: a safe pattern in LIKE). */
  async usingVolume(volumeId: string): Promise<string[]> {
    const rows = await this.db.selectFrom('instances').select('id').where('volumes', 'like', `%"volumeId":"${volumeId}"%`).execute();
    return rows.map((r) => r.id);
  }

  /** What one owner's instances hold, whatever their state (quotas.ts). */
  async usageOf(owner: string): Promise<{ instances: number; memoryMb: number; cpuPercent: number; diskMb: number; addresses: number }> {
    const rows = await holdingsOf.rows(this.db, owner);
    const used = { instances: rows.length, memoryMb: 0, cpuPercent: 0, diskMb: 0, addresses: 0 };
    for (const r of rows) {
      const l = JSON.parse(r.limits) as Limits;
      used.memoryMb += l.memoryMb;
      used.cpuPercent += l.cpuPercent;
      used.diskMb += l.diskMb ?? 0;
      if (r.address) used.addresses++;
    }
    return used;
  }

  /** Every address in use on the sandboxes' network. */
  async addresses(): Promise<string[]> {
    const rows = await this.db.selectFrom('instances').select('address').where('address', 'is not', null).execute();
    return rows.map((r) => r.address!);
  }

  /** Instances whose lifetime ended before `now` and that are still there to end. */
  async expired(now: string): Promise<InstanceRecord[]> {
    const rows = await this.db
      .selectFrom('instances')
      .selectAll()
      .where('expires_at', 'is not', null)
      .where('expires_at', '<=', now)
      .where('status', 'in', ['running', 'stopped', 'hibernated', 'error'])
      .execute();
    return rows.map(fromRow);
  }

  /** Running instances that hibernate when idle: what the idle monitor watches. */
  async idleCandidates(): Promise<InstanceRecord[]> {
    const rows = await this.db.selectFrom('instances').selectAll().where('status', '=', 'running').where('idle_timeout_s', '>', 0).execute();
    return rows.map(fromRow);
  }

  /** Newest first; the cursor is the last id of the previous page. */
  async page(owner: string, limit: number, cursor?: string): Promise<Page<InstanceRecord>> {
    const after = cursor ? await this.get(cursor) : undefined;
    let q = this.db.selectFrom('instances').selectAll().where('owner', '=', owner);
    if (after) {
      q = q.where((eb) =>
        eb.or([eb('created_at', '<', after.createdAt), eb.and([eb('created_at', '=', after.createdAt), eb('id', '<', after.id)])]),
      );
    }
    const rows = await q.orderBy('created_at', 'desc').orderBy('id', 'desc').limit(limit + 1).execute();
    const items = rows.slice(0, limit).map(fromRow);
    return { items, nextCursor: rows.length > limit ? items[items.length - 1]!.id : null };
  }

  /** Writes the patch's fields, and only those: never the status or the node (the lifecycle's
   * and the cluster's, by compare-and-set). */
  async update(id: string, patch: InstancePatch): Promise<InstanceRecord> {
    const { names, values } = written(columnsOf(patch));
    const lease = this.fence.current;
    const fenced = lease !== undefined;
    // The row as written comes back with the write (RETURNING): no read after it.
    const q = shaped(`update ${names.join(',')}${fenced ? ' fenced' : ''}`, (db, [rowId, at, ...rest]) =>
      db
        .updateTable('instances')
        .set((eb) => ({ ...setOf(names, fenced ? rest.slice(2) : rest), updated_at: at as string, version: eb('version', '+', 1) }))
        .where('id', '=', rowId as string)
        .$if(fenced, (w) => w.where((eb) => leaseHolds(eb, { node: rest[0] as string, epoch: rest[1] as number })))
        .returningAll());
    const row = await q.first(this.db, id, new Date().toISOString(), ...(lease ? [lease.node, lease.epoch] : []), ...values);
    if (row) return fromRow(row);
    if (lease && (await this.get(id))) throw new StaleWriteError(id, lease);
    throw new Error(`instance ${id} vanished from the store`);
  }

  /** Writes `patch` (a status change with what goes with it) if the row is still at `version`
   * and on `node`; undefined if another write came first. */
  async compareAndSet(id: string, version: number, node: string | null, patch: InstancePatch & { status: InstanceStatus }): Promise<InstanceRecord | undefined> {
    const { names, values } = written({ ...columnsOf(patch), status: patch.status });
    const lease = this.fence.current;
    const fenced = lease !== undefined;
    // [id, updated_at, version, new version, node?, lease node, lease epoch?, ...values]
    const q = shaped(`cas ${names.join(',')}${node === null ? ' nodeless' : ''}${fenced ? ' fenced' : ''}`, (db, [rowId, at, was, next, ...rest]) => {
      const onNode = node === null ? undefined : rest.shift();
      const fence = fenced ? { node: rest.shift() as string, epoch: rest.shift() as number } : undefined;
      return db
        .updateTable('instances')
        .set({ ...setOf(names, rest), updated_at: at as string, version: next as number })
        .where('id', '=', rowId as string)
        .where('version', '=', was as number)
        .where((eb) => (onNode === undefined ? eb('node', 'is', null) : eb('node', '=', onNode as string)))
        .$if(fence !== undefined, (w) => w.where((eb) => leaseHolds(eb, fence!)))
        .returningAll();
    });
    const row = await q.first(this.db, id, new Date().toISOString(), version, version + 1, ...(node === null ? [] : [node]), ...(lease ? [lease.node, lease.epoch] : []), ...values);
    if (row) return fromRow(row);
    // Refused by the lease alone (the row is as read): this node's lease ended.
    const now = lease && (await this.get(id));
    if (lease && now && now.version === version && now.node === node) throw new StaleWriteError(id, lease);
    return undefined;
  }

  /** Gives the instance to `to` if `from` still holds it (a warm fork taken: see
   * core/warm-standbys.ts), with `patch`; undefined if another took it first. Its creation is now. */
  async handOver(id: string, from: string, to: string, patch: InstancePatch): Promise<InstanceRecord | undefined> {
    const now = new Date().toISOString();
    const row = await this.db
      .updateTable('instances')
      .set((eb) => ({ ...columnsOf(patch), owner: to, created_at: now, updated_at: now, version: eb('version', '+', 1) }))
      .where('id', '=', id)
      .where('owner', '=', from)
      .$if(this.fence.current !== undefined, (q) => q.where((eb) => leaseHolds(eb, this.fence.current!)))
      .returningAll()
      .executeTakeFirst();
    return row && fromRow(row);
  }

  /** How many of the owner's instances stand on the image (by its own name or a built one's). */
  async countOnImage(owner: string | null, image: string): Promise<number> {
    const row = await this.db
      .selectFrom('instances')
      .select((eb) => eb.fn.countAll().as('n'))
      .where((eb) => (owner === null ? eb.or([eb('image', '=', image), eb('image_ref', '=', image)]) : eb.and([eb('owner', '=', owner), eb('image_ref', '=', image)])))
      .executeTakeFirstOrThrow();
    return Number(row.n);
  }

  async delete(id: string): Promise<void> {
    await this.db.deleteFrom('instances').where('id', '=', id).execute();
  }
}
