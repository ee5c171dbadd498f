import type { Db } from './db.js';

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

interface Row {
  owner: string;
  name: string;
  instance_id: string | null;
  checkpoint_id: string | null;
  source: string;
  start_command: string | null;
  status: TemplateStatus;
  error: string | null;
  created_at: string;
}

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

  get(owner: string, name: string): TemplateRecord | undefined {
    const row = this.db.prepare('SELECT * FROM templates WHERE owner = ? AND name = ?').get(owner, name) as Row | undefined;
    return row && fromRow(row);
  }

  list(owner: string): TemplateRecord[] {
    return (this.db.prepare('SELECT * FROM templates WHERE owner = ? ORDER BY name').all(owner) as Row[]).map(fromRow);
  }

  all(): TemplateRecord[] {
    return (this.db.prepare('SELECT * FROM templates').all() as Row[]).map(fromRow);
  }

  insert(t: TemplateRecord): void {
    this.db
      .prepare(
        `INSERT INTO templates (owner, name, instance_id, checkpoint_id, source, start_command, status, error, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      )
      .run(t.owner, t.name, t.instanceId, t.checkpointId, t.source, t.startCommand, t.status, t.error, t.createdAt);
  }

  update(owner: string, name: string, patch: Partial<Pick<TemplateRecord, 'instanceId' | 'checkpointId' | 'status' | 'error'>>): TemplateRecord {
    const cur = this.get(owner, name);
    if (!cur) throw new Error(`template ${owner}/${name} vanished from the store`);
    const next = { ...cur, ...patch };
    this.db
      .prepare('UPDATE templates SET instance_id = ?, checkpoint_id = ?, status = ?, error = ? WHERE owner = ? AND name = ?')
      .run(next.instanceId, next.checkpointId, next.status, next.error, owner, name);
    return next;
  }

  delete(owner: string, name: string): void {
    this.db.prepare('DELETE FROM templates WHERE owner = ? AND name = ?').run(owner, name);
  }
}
