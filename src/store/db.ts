import Database from 'better-sqlite3';
import { Kysely, PostgresDialect, SqliteDialect, sql, type SqliteDatabase, type Transaction } from 'kysely';
import pg from 'pg';
import { migrations as allMigrations, type Migration } from './migrations.js';
import type { Tables } from './schema.js';

export type Db = Kysely<Tables>;
export type SqlDialect = 'sqlite' | 'postgres';

/** An open metadata database: the embedded SQLite file or a shared PostgreSQL. */
export interface Connection {
  db: Db;
  dialect: SqlDialect;
  close(): Promise<void>;
}

export const isPostgresUrl = (location: string) => /^postgres(ql)?:\/\//.test(location);

/** Deadlines of every talk with PostgreSQL: a database that stops answering fails the call
 * instead of holding it for ever. */
const PG_CONNECT_TIMEOUT_MS = 10_000;
const PG_STATEMENT_TIMEOUT_MS = 30_000;

/** Opens the database at `location` (a file path, or a postgres:// URL) and brings its schema to
 * the newest version. `onIdleError` hears of a pooled PostgreSQL connection that broke while
 * unused (the pool replaces it). */
export async function openDb(location: string, onIdleError: (err: Error) => void = () => {}): Promise<Connection> {
  const conn = connect(location, onIdleError);
  try {
    await migrate(conn);
  } catch (err) {
    await conn.close();
    throw err;
  }
  return conn;
}

/** Connects to the database at `location`, leaving its schema as it is. */
export function connect(location: string, onIdleError: (err: Error) => void = () => {}): Connection {
  return isPostgresUrl(location) ? openPostgres(location, onIdleError) : openSqlite(location);
}

function openSqlite(file: string): Connection {
  const database = new Database(file);
  database.pragma('journal_mode = WAL');
  database.pragma('synchronous = NORMAL');
  database.pragma('foreign_keys = ON');
  database.pragma('busy_timeout = 5000');
  const db = new Kysely<Tables>({ dialect: new SqliteDialect({ database: keepingStatements(database) }) });
  return { db, dialect: 'sqlite', close: () => db.destroy() };
}

/** Statements kept per SQL text, the least recently used going first past this many. */
const KEPT_STATEMENTS = 256;

/**
 * The database as kysely sees it, its statements prepared once: kysely prepares every query
 * anew, and SQLite's parse was most of the time of the two or three lookups each API call makes
 * (a token, an instance). A statement still being iterated is not handed out again.
 */
export function keepingStatements(database: Database.Database): SqliteDatabase {
  const kept = new Map<string, Database.Statement>();
  return {
    close: () => database.close(),
    prepare(text: string) {
      const known = kept.get(text);
      if (known && !known.busy) {
        kept.delete(text);
        kept.set(text, known);
        return known;
      }
      const statement = database.prepare(text);
      kept.set(text, statement);
      if (kept.size > KEPT_STATEMENTS) kept.delete(kept.keys().next().value!);
      return statement;
    },
  };
}

// BIGINT columns (byte counts) come back as numbers, as SQLite's do; they stay far below 2^53.
const pgTypes = {
  getTypeParser: (oid: number, format?: 'text' | 'binary') =>
    oid === pg.types.builtins.INT8 ? (v: string) => Number(v) : pg.types.getTypeParser(oid, format),
} as pg.CustomTypesConfig;

/** The database did not answer (down, restarting, out of reach): nothing was done, and the call
 * can be made again. */
export class StoreUnavailableError extends Error {
  override readonly name = 'StoreUnavailableError';
  readonly code = 'STORE_UNAVAILABLE';
  constructor(cause: Error) {
    super(`the database is not answering: ${cause.message}`, { cause });
  }
}

function openPostgres(url: string, onIdleError: (err: Error) => void): Connection {
  const pool = new pg.Pool({
    connectionString: url,
    max: 10,
    connectionTimeoutMillis: PG_CONNECT_TIMEOUT_MS,
    statement_timeout: PG_STATEMENT_TIMEOUT_MS,
    query_timeout: PG_STATEMENT_TIMEOUT_MS + 5_000,
    application_name: 'forkpoint',
    types: pgTypes,
  });
  pool.on('error', onIdleError);
  // The pool hears an idle connection fail; one checked out and between two queries (a
  // transaction's) fails as an 'error' event on its client, which nothing would hear, and which
  // would end the process: every client gets a listener, once. Its next query fails, and says so.
  const heard = new WeakSet<pg.PoolClient>();
  const listened = (client: pg.PoolClient): pg.PoolClient => {
    if (!heard.has(client)) {
      heard.add(client);
      client.on('error', onIdleError);
    }
    return client;
  };
  // A connection the pool cannot make is the database away, told apart from a query's failure.
  const guarded = {
    options: pool.options,
    connect: () => pool.connect().then(listened, (err: Error) => Promise.reject(new StoreUnavailableError(err))),
    end: () => pool.end(),
  };
  const db = new Kysely<Tables>({ dialect: new PostgresDialect({ pool: guarded }) });
  return { db, dialect: 'postgres', close: () => db.destroy() };
}

/** Runs `fn` in a transaction, or in the one `db` already is. */
export function atomically<T>(db: Db, fn: (trx: Transaction<Tables>) => Promise<T>): Promise<T> {
  return db.isTransaction ? fn(db as Transaction<Tables>) : db.transaction().execute(fn);
}

// Nodes that start together: one migrates, the others wait for it and find the work done.
const MIGRATION_LOCK = 0x666b7074; // 'fkpt'

/** Brings the schema to the newest version, one migration per transaction, recorded in
 * `schema_migrations`. Returns the versions it ran. */
export async function migrate(conn: Connection, migrations: readonly Migration[] = allMigrations): Promise<number[]> {
  const lock = async (trx: Transaction<Tables>) => {
    if (conn.dialect === 'postgres') await sql`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK})`.execute(trx);
  };
  await conn.db.transaction().execute(async (trx) => {
    await lock(trx);
    await sql`CREATE TABLE IF NOT EXISTS schema_migrations (
      version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)`.execute(trx);
  });
  const ran: number[] = [];
  for (const m of migrations) {
    const applied = await conn.db.transaction().execute(async (trx) => {
      await lock(trx);
      const done = await trx.selectFrom('schema_migrations').select('version').where('version', '=', m.version).executeTakeFirst();
      if (done) return false;
      for (const statement of statementsOf(m.sql, conn.dialect)) await sql.raw(statement).execute(trx);
      await trx.insertInto('schema_migrations').values({ version: m.version, name: m.name, applied_at: new Date().toISOString() }).execute();
      return true;
    });
    if (applied) ran.push(m.version);
  }
  return ran;
}

/** A migration's statements, in the dialect's words. The migrations are written in the common
 * part of both; only column types differ (PostgreSQL's INTEGER is 32 bits, byte counts are not). */
export function statementsOf(text: string, dialect: SqlDialect): string[] {
  const translated =
    dialect === 'postgres'
      ? text.replace(/\bINTEGER\b/g, 'BIGINT').replace(/\bBLOB\b/g, 'BYTEA').replace(/\bREAL\b/g, 'DOUBLE PRECISION')
      : text;
  return translated
    .split(/;[ \t]*(?:\r?\n|$)/)
    .map((s) => s.trim())
    .filter((s) => s.replace(/--[^\n]*/g, '').trim() !== '');
}

export async function schemaVersion(db: Db): Promise<number> {
  const row = await db.selectFrom('schema_migrations').select((eb) => eb.fn.max('version').as('v')).executeTakeFirst();
  return Number(row?.v ?? 0);
}
