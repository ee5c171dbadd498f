import type { Db } from './db.js';
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

interface Row {
  instance_id: string;
  id: string;
  process_id: number;
  kind: ExecutionKind;
  argv: string;
  cwd: string;
  started_at: string;
  ended_at: string | null;
  exit_code: number | null;
  signal: number | null;
  timed_out: number;
}

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

  insert(e: ExecutionRecord): void {
    this.db
      .prepare(
        `INSERT INTO executions (instance_id, id, process_id, kind, argv, cwd, started_at, ended_at, exit_code, signal, timed_out)
         VALUES (@instanceId, @id, @processId, @kind, @argv, @cwd, @startedAt, @endedAt, @exitCode, @signal, @timedOut)`,
      )
      .run({ ...e, argv: JSON.stringify(e.argv), timedOut: e.timedOut ? 1 : 0 });
  }

  get(instanceId: string, id: string): ExecutionRecord | undefined {
    const row = this.db.prepare('SELECT * FROM executions WHERE instance_id = ? AND id = ?').get(instanceId, id) as Row | undefined;
    return row && fromRow(row);
  }

  /** Newest first; the cursor is the last id of the previous page. */
  page(instanceId: string, limit: number, cursor?: string): Page<ExecutionRecord> {
    const after = cursor ? this.get(instanceId, cursor) : undefined;
    const rows = (
      after
        ? this.db
            .prepare('SELECT * FROM executions WHERE instance_id = ? AND (started_at < ? OR (started_at = ? AND id < ?)) ORDER BY started_at DESC, id DESC LIMIT ?')
            .all(instanceId, after.startedAt, after.startedAt, after.id, limit + 1)
        : this.db.prepare('SELECT * FROM executions WHERE instance_id = ? ORDER BY started_at DESC, id DESC LIMIT ?').all(instanceId, limit + 1)
    ) as Row[];
    const items = rows.slice(0, limit).map(fromRow);
    return { items, nextCursor: rows.length > limit ? items[items.length - 1]!.id : null };
  }

  finish(instanceId: string, id: string, end: { exitCode: number | null; signal: number | null; timedOut: boolean; endedAt: string }): void {
    this.db
      .prepare('UPDATE executions SET ended_at = @endedAt, exit_code = @exitCode, signal = @signal, timed_out = @timedOut WHERE instance_id = @instanceId AND id = @id')
      .run({ ...end, timedOut: end.timedOut ? 1 : 0, instanceId, id });
  }

  /** A fork has the processes of its checkpoint: it gets the records of those, as running. */
  copy(fromInstance: string, toInstance: string, processIds: number[]): void {
    const stmt = this.db.prepare(
      `INSERT OR IGNORE INTO executions (instance_id, id, process_id, kind, argv, cwd, started_at, ended_at, exit_code, signal, timed_out)
       SELECT ?, id, process_id, kind, argv, cwd, started_at, NULL, NULL, NULL, 0 FROM executions WHERE instance_id = ? AND process_id = ?`,
    );
    this.db.transaction(() => {
      for (const pid of processIds) stmt.run(toInstance, fromInstance, pid);
    })();
  }

  /** Keeps the newest `keep` records of the instance and those still running. */
  prune(instanceId: string, keep: number): void {
    this.db
      .prepare(
        `DELETE FROM executions WHERE instance_id = ? AND ended_at IS NOT NULL AND id NOT IN
           (SELECT id FROM executions WHERE instance_id = ? ORDER BY started_at DESC, id DESC LIMIT ?)`,
      )
      .run(instanceId, instanceId, keep);
  }

  remove(instanceId: string, id: string): void {
    this.db.prepare('DELETE FROM executions WHERE instance_id = ? AND id = ?').run(instanceId, id);
  }

  removeAllOf(instanceId: string): void {
    this.db.prepare('DELETE FROM executions WHERE instance_id = ?').run(instanceId);
  }
}
