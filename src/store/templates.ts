import type { Selectable } from 'kysely';
import type { Db } from './db.js';
import type { Tables } from './schema.js';

export type TemplateStatus = 'building' | 'ready' | 'failed';

/** A template: a memory checkpoint of a hidden instance, new instances are restored from it. */
export interface TemplateRecord {
  owner: string;
  name: string;
  /** The hidden instance whose checkpoint it is (owned by templateOwner(owner)). */
  instanceId: string | null;
  checkpointId: string | null;
  /** What it was made from: `image:<name>` or `checkpoint:<id>`. */
  source: string;
  startCommand: string | null;
  status: TemplateStatus;
  error: string | null;
  createdAt: string;
}

type Row = Selectable<Tables['templates']>;

const fromRow = (r: Row): TemplateRecord => ({
  owner: r.owner,
  name: r.name,
  instanceId: r.instance_id,
  checkpointId: r.checkpoint_id,
  source: r.source,
  startCommand: r.start_command,
  status: r.status,
  error: r.error,
  createdAt: r.created_at,
});

/** Templates' hidden instances belong to an owner no token has: no one lists, execs or deletes
 * them through the API. */
export const templateOwner = (owner: string) => `~template:${owner}`;

export class TemplateStore {
  constructor(private readonly db: Db) {}

  async get(owner: string, name: string): Promise<TemplateRecord | undefined> {
    const row = await this.db.selectFrom('templates').selectAll().where('owner', '=', owner).where('name', '=', name).executeTakeFirst();
    return row && fromRow(row);
  }

  async list(owner: string): Promise<TemplateRecord[]> {
    return (await this.db.selectFrom('templates').selectAll().where('owner', '=', owner).orderBy('name').execute()).map(fromRow);
  }

  async all(): Promise<TemplateRecord[]> {
    return (await this.db.selectFrom('templates').selectAll().execute()).map(fromRow);
  }

  async insert(t: TemplateRecord): Promise<void> {
    await this.db
      .insertInto('templates')
      .values({
        owner: t.owner,
        name: t.name,
        instance_id: t.instanceId,
        checkpoint_id: t.checkpointId,
        source: t.source,
        start_command: t.startCommand,
        status: t.status,
        error: t.error,
        created_at: t.createdAt,
      })
      .execute();
  }

  async update(owner: string, name: string, patch: Partial<Pick<TemplateRecord, 'instanceId' | 'checkpointId' | 'status' | 'error'>>): Promise<TemplateRecord> {
    const cur = await this.get(owner, name);
    if (!cur) throw new Error(`template ${owner}/${name} vanished from the store`);
    const next = { ...cur, ...patch };
    await this.db
      .updateTable('templates')
      .set({ instance_id: next.instanceId, checkpoint_id: next.checkpointId, status: next.status, error: next.error })
      .where('owner', '=', owner)
      .where('name', '=', name)
      .execute();
    return next;
  }

  async delete(owner: string, name: string): Promise<void> {
    await this.db.deleteFrom('templates').where('owner', '=', owner).where('name', '=', name).execute();
  }
}
