import type { Db } from './db.js';

export interface NodeRecord {
  id: string;
  /** Where the other nodes reach it. */
  url: string;
  startedAt: string;
  heartbeatAt: string;
  /** Its lease generation (see WriteFence). */
  epoch: number;
  /** Being drained: no new work, its instances handed over. */
  draining: boolean;
}

/** The servers sharing the store, each saying now and then that it lives. */
export class NodeStore {
  constructor(private readonly db: Db) {}

  /** Registers the node (again, no longer draining) with a new lease: answers its epoch. */
  async register(id: string, url: string, now: string): Promise<number> {
    const row = { url, started_at: now, heartbeat_at: now, draining: 0 };
    await this.db
      .insertInto('nodes')
      .values({ id, ...row, epoch: 1 })
      .onConflict((oc) => oc.column('id').doUpdateSet((eb) => ({ ...row, epoch: eb('nodes.epoch', '+', 1) })))
      .execute();
    return (await this.get(id))!.epoch;
  }

  /** Renews the node's lease of `epoch`: false when it is no longer current (another node
   * judged this one silent meanwhile), and nothing is written. */
  async heartbeat(id: string, now: string, epoch: number): Promise<boolean> {
    const r = await this.db.updateTable('nodes').set({ heartbeat_at: now }).where('id', '=', id).where('epoch', '=', epoch).executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** Nodes judged silent for too long: their leases end here (their epochs move on) if their
   * last heartbeat is still before `heartbeatBefore`; answers the ones that ended. */
  async endLeases(ids: string[], heartbeatBefore: string): Promise<string[]> {
    if (ids.length === 0) return [];
    const ended = await this.db
      .updateTable('nodes')
      .set((eb) => ({ epoch: eb('epoch', '+', 1) }))
      .where('id', 'in', ids)
      .where('heartbeat_at', '<', heartbeatBefore)
      .returning('id')
      .execute();
    return ended.map((r) => r.id);
  }

  async setDraining(id: string, draining: boolean): Promise<void> {
    await this.db.updateTable('nodes').set({ draining: draining ? 1 : 0 }).where('id', '=', id).execute();
  }

  /** A node whose lease ended takes a new one (after it has let go of what is no longer its). */
  async renewLease(id: string, now: string): Promise<number> {
    await this.db.updateTable('nodes').set((eb) => ({ heartbeat_at: now, epoch: eb('epoch', '+', 1) })).where('id', '=', id).execute();
    return (await this.get(id))!.epoch;
  }

  async get(id: string): Promise<NodeRecord | undefined> {
    const r = await this.db.selectFrom('nodes').selectAll().where('id', '=', id).executeTakeFirst();
    return r && { id: r.id, url: r.url, startedAt: r.started_at, heartbeatAt: r.heartbeat_at, epoch: Number(r.epoch), draining: Number(r.draining) === 1 };
  }

  async all(): Promise<NodeRecord[]> {
    const rows = await this.db.selectFrom('nodes').selectAll().orderBy('id').execute();
    return rows.map((r) => ({ id: r.id, url: r.url, startedAt: r.started_at, heartbeatAt: r.heartbeat_at, epoch: Number(r.epoch), draining: Number(r.draining) === 1 }));
  }

  /** The secret of that name all nodes share: `proposed` if none is there yet (the first node
   * to ask sets it), else the one that is. */
  async sharedSecret(name: string, proposed: string): Promise<string> {
    await this.db
      .insertInto('secrets')
      .values({ name, value: proposed, created_at: new Date().toISOString() })
      .onConflict((oc) => oc.column('name').doNothing())
      .execute();
    return (await this.db.selectFrom('secrets').select('value').where('name', '=', name).executeTakeFirstOrThrow()).value;
  }

  /** How many instances each node holds that use its memory (running or starting). */
  async load(): Promise<Map<string, number>> {
    const rows = await this.db
      .selectFrom('instances')
      .select(['node', (eb) => eb.fn.countAll().as('n')])
      .where('status', 'in', ['running', 'starting'])
      .where('node', 'is not', null)
      .groupBy('node')
      .execute();
    return new Map(rows.map((r) => [r.node!, Number(r.n)]));
  }
}
