import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { migrate, openDb, schemaVersion } from '../src/store/db.js';
import { migrations } from '../src/store/migrations.js';
import { TokenStore } from '../src/store/tokens.js';

const dirs: string[] = [];
const tmpDb = async () => {
  const dir = await mkdtemp(join(tmpdir(), 'fp-store-'));
  dirs.push(dir);
  return join(dir, 'forkpoint.db');
};
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

describe('store migrations', () => {
  it('brings a new database to the newest version', async () => {
    const db = openDb(await tmpDb());
    expect(schemaVersion(db)).toBe(migrations[migrations.length - 1]!.version);
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type='table'").pluck().all();
    expect(tables).toEqual(expect.arrayContaining(['tokens', 'instances', 'checkpoints', 'layers', 'layer_refs']));
  });

  it('runs each migration once, and upgrades an older database in order', async () => {
    const file = await tmpDb();
    const old = new Database(file);
    old.exec('CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)');
    old.exec(migrations[0]!.sql);
    old.prepare('INSERT INTO schema_migrations VALUES (1, ?, ?)').run(migrations[0]!.name, new Date().toISOString());
    old.prepare("INSERT INTO tokens (id, owner, name, secret_hash, created_at) VALUES ('tok_x', 'o', 'n', x'00', 'now')").run();
    old.close();
    const db = openDb(file);
    expect(schemaVersion(db)).toBe(migrations.length);
    expect(db.prepare('SELECT owner FROM tokens').pluck().get()).toBe('o'); // data kept
    expect(migrate(db)).toEqual([]); // nothing left to run
  });

  it('a failing migration leaves the database at the previous version', async () => {
    const db = new Database(await tmpDb());
    migrate(db);
    const before = schemaVersion(db);
    const broken = [...migrations, { version: before + 1, name: 'broken', sql: 'CREATE TABLE x (a); SELECT nope FROM nowhere;' }];
    expect(() => migrate(db, broken)).toThrow();
    expect(db.prepare("SELECT name FROM sqlite_master WHERE name='x'").get()).toBeUndefined();
    expect(schemaVersion(db)).toBe(before);
  });
});

describe('tokens', () => {
  it('stores only a hash, verifies, and revokes', async () => {
    const db = openDb(await tmpDb());
    const tokens = new TokenStore(db);
    const { token, record } = tokens.create('alice', 'laptop');
    const row = db.prepare('SELECT * FROM tokens').get() as Record<string, unknown>;
    expect(JSON.stringify(row)).not.toContain(token.split('.')[1]);
    expect(tokens.verify(token)?.owner).toBe('alice');
    expect(tokens.verify(token + 'x')).toBeUndefined();
    expect(tokens.verify('garbage')).toBeUndefined();
    expect(tokens.revoke(record.id)).toBe(true);
    expect(tokens.verify(token)).toBeUndefined();
  });
});

describe('execution records', () => {
  const rec = (id: string, startedAt: string, ended: boolean) => ({
    instanceId: 'inst_a', id, processId: Number.parseInt(id.slice(5), 16), kind: 'exec' as const, argv: ['echo', id], cwd: '/', startedAt,
    endedAt: ended ? startedAt : null, exitCode: ended ? 0 : null, signal: null, timedOut: false,
  });

  it('pages newest first, prunes ended ones past the newest N (never running ones), and copies to a fork as running', async () => {
    const { ExecutionStore } = await import('../src/store/executions.js');
    const store = new ExecutionStore(openDb(await tmpDb()));
    store.insert(rec('exec_00000001', '2026-01-01T00:00:01Z', false));
    for (let i = 2; i <= 6; i++) store.insert(rec(`exec_0000000${i}`, `2026-01-01T00:00:0${i}Z`, true));
    const p1 = store.page('inst_a', 2);
    expect(p1.items.map((e) => e.id)).toEqual(['exec_00000006', 'exec_00000005']);
    expect(store.page('inst_a', 10, p1.nextCursor!).items.map((e) => e.id)).toEqual(['exec_00000004', 'exec_00000003', 'exec_00000002', 'exec_00000001']);
    store.prune('inst_a', 2);
    expect(store.page('inst_a', 10).items.map((e) => e.id)).toEqual(['exec_00000006', 'exec_00000005', 'exec_00000001']);
    store.copy('inst_a', 'inst_b', [5, 1, 99]);
    const copied = store.page('inst_b', 10).items;
    expect(copied.map((e) => [e.id, e.endedAt, e.exitCode])).toEqual([['exec_00000005', null, null], ['exec_00000001', null, null]]);
    expect(copied[0]!.argv).toEqual(['echo', 'exec_00000005']);
  });
});
