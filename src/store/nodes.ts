import type { Db } from './db.js';

export interface NodeRecord {
  id: string;
  /** Where the other nodes reach it. */
  url: string;
  startedAt: string;
  heartbeatAt: string;
}

/** The servers sharing the store, each saying now and then that it lives. */
export class NodeStore {
  constructor(private readonly db: Db) {}

  async register(id: string, url: string, now: string): Promise<void> {
    const row = { url, started_at: now, heartbeat_at: now };
    await this.db.insertInto('nodes').values({ id, ...row }).onConflict((oc) => oc.column('id').doUpdateSet(row)).execute();
  }

  async heartbeat(id: string, now: string): Promise<void> {
    await this.db.updateTable('nodes').set({ heartbeat_at: now }).where('id', '=', id).execute();
  }

  async get(id: string): Promise<NodeRecord | undefined> {
    const r = await this.db.selectFrom('nodes').selectAll().where('id', '=', id).executeTakeFirst();
    return r && { id: r.id, url: r.url, startedAt: r.started_at, heartbeatAt: r.heartbeat_at };
  }

  async all(): Promise<NodeRecord[]> {
    const rows = await this.db.selectFrom('nodes').selectAll().orderBy('id').execute();
    return rows.map((r) => ({ id: r.id, url: r.url, startedAt: r.started_at, heartbeatAt: r.heartbeat_at }));
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
