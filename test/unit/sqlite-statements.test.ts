import Database from 'better-sqlite3';
import { Kysely, SqliteDialect, sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { keepingStatements } from '../../src/store/db.js';

// Each API call looks up its token and its instance: kysely prepares every query anew, and the
// embedded store keeps its statements instead.
describe('the embedded store prepares a query once', () => {
  it('the same query again reuses its statement; past the bound the least recently used goes', async () => {
    const database = new Database(':memory:');
    const real = database.prepare.bind(database);
    let prepared = 0;
    database.prepare = ((text: string) => {
      prepared++;
      return real(text);
    }) as typeof database.prepare;
    const db = new Kysely<{ t: { id: string; v: number } }>({ dialect: new SqliteDialect({ database: keepingStatements(database) }) });
    try {
      await db.schema.createTable('t').addColumn('id', 'text').addColumn('v', 'integer').execute();
      await db.insertInto('t').values([{ id: 'a', v: 1 }, { id: 'b', v: 2 }]).execute();
      const lookup = (id: string) => db.selectFrom('t').select('v').where('id', '=', id).executeTakeFirst();
      prepared = 0;
      for (let i = 0; i < 5; i++) expect(await lookup('a')).toEqual({ v: 1 });
      expect(await lookup('b')).toEqual({ v: 2 });
      expect(await lookup('c')).toBeUndefined();
      expect(prepared).toBe(1);
      // 300 other queries push it out: it is prepared again, once.
      for (let i = 0; i < 300; i++) await db.selectFrom('t').select(sql.lit(i).as('n')).executeTakeFirst();
      prepared = 0;
      expect(await lookup('a')).toEqual({ v: 1 });
      expect(await lookup('b')).toEqual({ v: 2 });
      expect(prepared).toBe(1);
    } finally {
      await db.destroy();
    }
  });
});
