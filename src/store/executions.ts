import type { Selectable } from 'kysely';
import { atomically, type Db } from './db.js';
import type { Tables } from './schema.js';
import type { Page } from './instances.js';

export type ExecutionKind = 'exec' | 'pty';

/** A command started in an instance to be streamed, attached to or waited for. While it runs its
 * state is the agent's; the record keeps what the agent does not. */
export interface ExecutionRecord {
  instanceId: string;
  id: string;
  /** The agent's id of the process (the same in forks of the instance). */
  processId: number;
  kind: ExecutionKind;
  argv: string[];
  cwd: string;
  startedAt: string;
  /** Set once the end was seen (a rollback may bring the process back: the agent's word wins). */
  endedAt: string | null;
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
}

type Row = Selectable<Tables['executions']>;

const fromRow = (r: Row): ExecutionRecord => ({
  instanceId: r.instance_id,
  id: r.id,
  processId: r.process_id,
  kind: r.kind,
  argv: JSON.parse(r.argv) as string[],
  cwd: r.cwd,
  startedAt: r.started_at,
  endedAt: r.ended_at,
  exitCode: r.exit_code,
  signal: r.signal,
  timedOut: r.timed_out === 1,
});

export class ExecutionStore {
  constructor(private readonly db: Db) {}

  async insert(e: ExecutionRecord): Promise<void> {
    await this.db
      .insertInto('executions')
      .values({
        instance_id: e.instanceId,
        id: e.id,
        process_id: e.processId,
        kind: e.kind,
        argv: JSON.stringify(e.argv),
        cwd: e.cwd,
        started_at: e.startedAt,
        ended_at: e.endedAt,
        exit_code: e.exitCode,
        signal: e.signal,
        timed_out: e.timedOut ? 1 : 0,
      })
      .execute();
  }

  async get(instanceId: string, id: string): Promise<ExecutionRecord | undefined> {
    const row = await this.db.selectFrom('executions').selectAll().where('instance_id', '=', instanceId).where('id', '=', id).executeTakeFirst();
    return row && fromRow(row);
  }

  /** Newest first; the cursor is the last id of the previous page. */
  async page(instanceId: string, limit: number, cursor?: string): Promise<Page<ExecutionRecord>> {
    const after = cursor ? await this.get(instanceId, cursor) : undefined;
    let q = this.db.selectFrom('executions').selectAll().where('instance_id', '=', instanceId);
    if (after) {
      q = q.where((eb) =>
        eb.or([eb('started_at', '<', after.startedAt), eb.and([eb('started_at', '=', after.startedAt), eb('id', '<', after.id)])]),
      );
    }
    const rows = await q.orderBy('started_at', 'desc').orderBy('id', 'desc').limit(limit + 1).execute();
    const items = rows.slice(0, limit).map(fromRow);
    return { items, nextCursor: rows.length > limit ? items[items.length - 1]!.id : null };
  }

  async finish(instanceId: string, id: string, end: { exitCode: number | null; signal: number | null; timedOut: boolean; endedAt: string }): Promise<void> {
    await this.db
      .updateTable('executions')
      .set({ ended_at: end.endedAt, exit_code: end.exitCode, signal: end.signal, timed_out: end.timedOut ? 1 : 0 })
      .where('instance_id', '=', instanceId)
      .where('id', '=', id)
      .execute();
  }

  /** A fork has the processes of its checkpoint: it gets the records of those, as running. */
  async copy(fromInstance: string, toInstance: string, processIds: number[]): Promise<void> {
    if (processIds.length === 0) return;
    await atomically(this.db, async (trx) => {
      const rows = await trx.selectFrom('executions').selectAll().where('instance_id', '=', fromInstance).where('process_id', 'in', processIds).execute();
      if (rows.length === 0) return;
      await trx
        .insertInto('executions')
        .values(rows.map((r) => ({ ...r, instance_id: toInstance, ended_at: null, exit_code: null, signal: null, timed_out: 0 })))
        .onConflict((oc) => oc.columns(['instance_id', 'id']).doNothing())
        .execute();
    });
  }

  /** Keeps the newest `keep` records of the instance and those still running. */
  async prune(instanceId: string, keep: number): Promise<void> {
    await atomically(this.db, async (trx) => {
      const newest = await trx.selectFrom('executions').select('id').where('instance_id', '=', instanceId).orderBy('started_at', 'desc').orderBy('id', 'desc').limit(keep).execute();
      let q = trx.deleteFrom('executions').where('instance_id', '=', instanceId).where('ended_at', 'is not', null);
      if (newest.length > 0) q = q.where('id', 'not in', newest.map((r) => r.id));
      await q.execute();
    });
  }

  async remove(instanceId: string, id: string): Promise<void> {
    await this.db.deleteFrom('executions').where('instance_id', '=', instanceId).where('id', '=', id).execute();
  }

  async removeAllOf(instanceId: string): Promise<void> {
    await this.db.deleteFrom('executions').where('instance_id', '=', instanceId).execute();
  }
}
