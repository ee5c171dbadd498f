import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect, migrate, schemaVersion, type Connection } from '../src/store/db.js';
import { openStore, type Store } from '../src/store/index.js';
import type { InstanceRecord, InstanceStatus } from '../src/store/instances.js';
import { allowed, Lifecycle, TRANSITIONS, TransitionConflictError, type Transition } from '../src/core/lifecycle.js';
import { migrations } from '../src/store/migrations.js';
import { PreparedQuery } from '../src/store/prepared.js';
import { TestPostgres } from './helpers/postgres.js';

// The same tests on both stores: the embedded SQLite file and a real PostgreSQL (a throwaway
// cluster this file starts). Each test gets a database of its own.
const dirs: string[] = [];
let postgres: TestPostgres;
let databases = 0;
beforeAll(async () => {
  postgres = await TestPostgres.start();
}, 90_000);
afterAll(async () => {
  await postgres?.stop();
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

const locations = {
  sqlite: async () => {
    const dir = await mkdtemp(join(tmpdir(), 'fp-store-'));
    dirs.push(dir);
    return join(dir, 'forkpoint.db');
  },
  postgres: () => postgres.database(`t${++databases}`),
};

const tableNames = async (c: Connection) => (await c.db.introspection.getTables()).map((t) => t.name);

const instance = (id: string, createdAt: string, extra: Partial<InstanceRecord> = {}): InstanceRecord => ({
  id, owner: 'alice', name: id.replace('_', '-'), image: 'default', status: 'running', layers: [], baseLayer: false, agentLayer: 'agent',
  env: { A: '1' }, limits: { memoryMb: 256, pids: 64, cpuPercent: 100, diskMb: null }, metadata: { k: 'v' }, pid: null, pidStart: null,
  sourceInstanceId: null, sourceCheckpointId: null, maxCheckpoints: null, headCheckpointId: null, hibernationId: null, idleTimeoutS: null,
  address: null, egress: { egress: 'allow', allow: [], deny: [] }, imageRef: null, workdir: null, expiresAt: null, onExpiry: null, error: null,
  createdAt, updatedAt: createdAt, node: null, uidBase: null, restoringFrom: null, volumes: [], secrets: [], egressCa: null, warmFork: false, defaultUser: null, imageVolumes: [], version: 0, ...extra,
});

describe.each(['sqlite', 'postgres'] as const)('store on %s', (dialect) => {
  const open = async (): Promise<Store> => openStore(await locations[dialect]());

  it('brings a new database to the newest version', async () => {
    const c = connect(await locations[dialect]());
    try {
      expect(await migrate(c)).toEqual(migrations.map((m) => m.version));
      expect(await schemaVersion(c.db)).toBe(migrations[migrations.length - 1]!.version);
      expect(await tableNames(c)).toEqual(expect.arrayContaining(['tokens', 'instances', 'checkpoints', 'layers', 'layer_refs', 'durable_blobs']));
    } finally {
      await c.close();
    }
  });

  it('upgrades an older database in order, keeping its data, and runs each migration once', async () => {
    const c = connect(await locations[dialect]());
    try {
      await migrate(c, migrations.slice(0, 1));
      await sql`INSERT INTO tokens (id, owner, name, secret_hash, created_at) VALUES ('tok_x', 'o', 'n', ${Buffer.from([0])}, 'now')`.execute(c.db);
      expect(await migrate(c)).toEqual(migrations.slice(1).map((m) => m.version));
      expect((await c.db.selectFrom('tokens').select('owner').executeTakeFirst())?.owner).toBe('o');
      expect(await migrate(c)).toEqual([]);
    } finally {
      await c.close();
    }
  });

  it('a failing migration leaves the database at the previous version', async () => {
    const c = connect(await locations[dialect]());
    try {
      await migrate(c);
      const before = await schemaVersion(c.db);
      const broken = [...migrations, { version: before + 1, name: 'broken', sql: 'CREATE TABLE x (a TEXT);\nSELECT nope FROM nowhere;' }];
      await expect(migrate(c, broken)).rejects.toThrow();
      expect(await tableNames(c)).not.toContain('x');
      expect(await schemaVersion(c.db)).toBe(before);
    } finally {
      await c.close();
    }
  });

  it('nodes that start together migrate once between them', async () => {
    const location = await locations[dialect]();
    // SQLite is one node's file; PostgreSQL is where several start at once.
    const nodes = dialect === 'postgres' ? 4 : 1;
    const conns = Array.from({ length: nodes }, () => connect(location));
    try {
      const ran = await Promise.all(conns.map((c) => migrate(c)));
      expect(ran.flat().sort((a, b) => a - b)).toEqual(migrations.map((m) => m.version));
    } finally {
      await Promise.all(conns.map((c) => c.close()));
    }
  });

  it('tokens: stores only a hash, verifies, and revokes', async () => {
    const store = await open();
    try {
      const { token, record } = await store.tokens.create('alice', 'laptop');
      expect(JSON.stringify(await store.tokens.list())).not.toContain(token.split('.')[1]);
      expect((await store.tokens.verify(token))?.owner).toBe('alice');
      expect(await store.tokens.verify(token + 'x')).toBeUndefined();
      expect(await store.tokens.verify('garbage')).toBeUndefined();
      expect(await store.tokens.countActive()).toBe(1);
      expect(await store.tokens.revoke(record.id)).toBe(true);
      expect(await store.tokens.revoke(record.id)).toBe(false);
      expect(await store.tokens.verify(token)).toBeUndefined();
    } finally {
      await store.close();
    }
  });

  it('prepared queries: built once, each run with its own arguments, from the database and inside a transaction', async () => {
    const store = await open();
    const c = connect(await locations[dialect]());
    try {
      await migrate(c);
      await c.db.insertInto('tokens').values([
        { id: 'tok_a', owner: 'alice', name: 'one', secret_hash: Buffer.alloc(32), created_at: '1', last_used_at: null, revoked_at: null },
        { id: 'tok_b', owner: 'bob', name: 'one', secret_hash: Buffer.alloc(32), created_at: '2', last_used_at: null, revoked_at: '3' },
      ]).execute();
      const named = new PreparedQuery((db, owner: string, name: string) => db.selectFrom('tokens').select(['id', 'revoked_at']).where('owner', '=', owner).where('name', '=', name).where('created_at', '<', '9'));
      expect(await named.rows(c.db, 'alice', 'one')).toEqual([{ id: 'tok_a', revoked_at: null }]);
      expect(await named.first(c.db, 'bob', 'one')).toEqual({ id: 'tok_b', revoked_at: '3' });
      expect(await named.first(c.db, 'alice', 'two')).toBeUndefined();
      await c.db.transaction().execute(async (tx) => {
        await tx.insertInto('tokens').values({ id: 'tok_c', owner: 'alice', name: 'two', secret_hash: Buffer.alloc(32), created_at: '4', last_used_at: null, revoked_at: null }).execute();
        expect(await named.first(tx, 'alice', 'two')).toEqual({ id: 'tok_c', revoked_at: null });
      });
      // An argument the query does not send would be the value of its first run for ever.
      const wrong = new PreparedQuery((db, owner: string) => db.selectFrom('tokens').select('id').where('owner', '=', owner === 'alice' ? 'alice' : 'bob'));
      await expect(wrong.rows(c.db, 'alice')).rejects.toThrow(/argument 0 is not one of its parameters/);
      // The stores' own: a token, an instance and an owner's holdings, read through them.
      const { token } = await store.tokens.create('carol', 'laptop');
      await store.instances.insert(instance('inst_1', '2026-01-01T00:00:01Z', { owner: 'carol', address: '10.0.0.1', uidBase: 65536 }));
      await store.instances.insert(instance('inst_2', '2026-01-01T00:00:02Z', { owner: 'dave' }));
      expect((await store.tokens.verify(token))?.owner).toBe('carol');
      expect((await store.instances.get('inst_2'))?.owner).toBe('dave');
      expect(await store.instances.usageOf('carol')).toEqual({ instances: 1, memoryMb: 256, cpuPercent: 100, diskMb: 0, addresses: 1 });
      expect(await store.transaction((tx) => tx.instances.uidRangesHeldBy('carol'))).toBe(1);
      expect(await store.instances.uidRangesHeldBy('dave')).toBe(0);
    } finally {
      await c.close();
      await store.close();
    }
  });

  it('tokens: the running sandboxes with each live token of their owner (what an E2B-signed URL is tried against), newest first, bounded', async () => {
    const store = await open();
    try {
      const a1 = await store.tokens.create('alice', 'one');
      const a2 = await store.tokens.create('alice', 'two');
      const b = await store.tokens.create('bob', 'one');
      await store.tokens.revoke(a2.record.id);
      await store.instances.insert(instance('inst_1', '2026-01-01T00:00:01Z'));
      await store.instances.insert(instance('inst_2', '2026-01-01T00:00:02Z', { owner: 'bob' }));
      await store.instances.insert(instance('inst_3', '2026-01-01T00:00:03Z', { status: 'hibernated' }));
      expect(await store.tokens.runningSandboxGrants(10)).toEqual([
        { sandboxId: 'inst_2', owner: 'bob', tokenId: b.record.id },
        { sandboxId: 'inst_1', owner: 'alice', tokenId: a1.record.id },
      ]);
      expect(await store.tokens.runningSandboxGrants(1)).toHaveLength(1);
      expect(await store.tokens.runningSandboxGrants(10, 'inst_1')).toEqual([{ sandboxId: 'inst_1', owner: 'alice', tokenId: a1.record.id }]);
      expect(await store.tokens.runningSandboxGrants(10, 'inst_3')).toEqual([]);
    } finally {
      await store.close();
    }
  });

  it('secret stores: one name per owner; an insert or a rename onto a taken name answers false, never an error, racing ones included', async () => {
    const store = await open();
    try {
      const rec = (id: string, owner: string, name: string) => ({ id, owner, name, egressAllowlist: ['a.example'], createdAt: 'now', updatedAt: 'now' });
      const firsts = await Promise.all(['ss_1', 'ss_2', 'ss_3'].map((id) => store.secretStores.insert(rec(id, 'alice', 'prod'))));
      expect(firsts.filter(Boolean)).toHaveLength(1);
      expect(await store.secretStores.insert(rec('ss_4', 'bob', 'prod'))).toBe(true); // another owner's
      expect(await store.secretStores.insert(rec('ss_5', 'alice', 'dev'))).toBe(true);
      expect(await store.secretStores.update(rec('ss_5', 'alice', 'prod'))).toBe(false);
      expect(await store.secretStores.update(rec('ss_5', 'alice', 'staging'))).toBe(true);
      expect((await store.secretStores.list('alice')).map((r) => r.name)).toEqual(['prod', 'staging']);
    } finally {
      await store.close();
    }
  });

  it('instances: a record reads back as written, pages newest first, and updates', async () => {
    const store = await open();
    try {
      for (let i = 1; i <= 5; i++) await store.instances.insert(instance(`inst_${i}`, `2026-01-01T00:00:0${i}Z`, { address: `10.0.0.${i}` }));
      await store.instances.insert(instance('inst_9', '2026-01-01T00:00:09Z', { owner: 'bob' }));
      expect(await store.instances.get('inst_1')).toEqual(instance('inst_1', '2026-01-01T00:00:01Z', { address: '10.0.0.1' }));
      const p1 = await store.instances.page('alice', 2);
      expect(p1.items.map((r) => r.id)).toEqual(['inst_5', 'inst_4']);
      const p2 = await store.instances.page('alice', 10, p1.nextCursor!);
      expect([p2.items.map((r) => r.id), p2.nextCursor]).toEqual([['inst_3', 'inst_2', 'inst_1'], null]);
      expect((await store.instances.addresses()).sort()).toEqual(['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4', '10.0.0.5']);
      const next = await store.instances.update('inst_2', { layers: ['l2', 'l1'], baseLayer: true, expiresAt: '2026-01-01T00:01:00Z' });
      expect(await store.instances.get('inst_2')).toEqual(next);
      expect([next.status, next.version, next.layers]).toEqual(['running', 1, ['l2', 'l1']]);
      expect((await store.instances.expired('2026-01-01T00:02:00Z')).map((r) => r.id)).toEqual(['inst_2']);
      expect(await store.instances.countOnImage(null, 'default')).toBe(6);
      await store.instances.delete('inst_2');
      expect(await store.instances.get('inst_2')).toBeUndefined();
    } finally {
      await store.close();
    }
  });

  it('the lifecycle: every allowed transition moves, every other is a named 409, and nothing else writes a status', async () => {
    const store = await open();
    try {
      const lifecycle = new Lifecycle(store, 'node-a');
      const statuses: InstanceStatus[] = ['starting', 'running', 'hibernated', 'stopped', 'error', 'lost'];
      let n = 0;
      for (const transition of Object.keys(TRANSITIONS) as Transition[]) {
        for (const from of statuses) {
          const id = `inst_t${++n}`;
          await store.instances.insert(instance(id, '2026-01-01T00:00:00Z', { status: from, node: 'node-a' }));
          const moved = await lifecycle.move(id, transition, { error: 'why' }).catch((e: unknown) => e);
          const now = (await store.instances.get(id))!;
          if (allowed(transition, from)) {
            expect([transition, from, (moved as InstanceRecord).status, now.status, now.version], `${transition} from ${from}`).toEqual([transition, from, TRANSITIONS[transition].to, TRANSITIONS[transition].to, 1]);
          } else {
            expect(moved, `${transition} from ${from}`).toBeInstanceOf(TransitionConflictError);
            expect((moved as TransitionConflictError).details).toMatchObject({ reason: 'TRANSITION_NOT_ALLOWED', transition, status: from });
            expect([now.status, now.version, now.error]).toEqual([from, 0, null]); // untouched
          }
        }
      }
      expect(n).toBe(Object.keys(TRANSITIONS).length * statuses.length);
    } finally {
      await store.close();
    }
  });

  it('the lifecycle: two transitions racing on one instance, exactly one wins; a write read before another node took the instance is refused when it lands', async () => {
    const store = await open();
    try {
      const a = new Lifecycle(store, 'node-a');
      await store.instances.insert(instance('inst_race', '2026-01-01T00:00:00Z', { status: 'running', node: 'node-a' }));
      const raced = await Promise.allSettled([a.move('inst_race', 'hibernate'), a.move('inst_race', 'hibernate'), a.move('inst_race', 'hibernate')]);
      expect(raced.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
      for (const r of raced.filter((x): x is PromiseRejectedResult => x.status === 'rejected')) expect(r.reason).toBeInstanceOf(TransitionConflictError);
      expect((await store.instances.get('inst_race'))!.status).toBe('hibernated');

      // Node A reads its instance; node B, judging A dead, takes it; A's write lands after.
      await store.instances.insert(instance('inst_stale', '2026-01-01T00:00:00Z', { status: 'running', node: 'node-a' }));
      const readByA = (await store.instances.get('inst_stale'))!;
      expect(await store.instances.markLost(['node-a'])).toContain('inst_stale');
      expect(await store.instances.claimLost('inst_stale', 'node-b')).toBe(true);
      expect(await store.instances.compareAndSet('inst_stale', readByA.version, 'node-a', { status: 'stopped', pid: null })).toBeUndefined();
      const late = await a.move('inst_stale', 'stop').catch((e: unknown) => e);
      expect((late as TransitionConflictError).details).toMatchObject({ reason: 'TRANSITION_NOT_THIS_NODE' });
      // A plain write of A's (metadata, say) lands, and leaves B's node and status as they are.
      await store.instances.update('inst_stale', { metadata: { late: 'yes' } });
      const now = (await store.instances.get('inst_stale'))!;
      expect([now.node, now.status, now.metadata]).toEqual(['node-b', 'starting', { late: 'yes' }]);
      // B's own transitions go on.
      expect((await new Lifecycle(store, 'node-b').move('inst_stale', 'boot')).status).toBe('running');
    } finally {
      await store.close();
    }
  });

  it('the lifecycle: a move given the row as its caller knew it writes on it when it is current, and reads afresh when it is not', async () => {
    const store = await open();
    try {
      const a = new Lifecycle(store, 'node-a');
      await store.instances.insert(instance('inst_known', '2026-01-01T00:00:00Z', { status: 'starting', node: 'node-a' }));
      const known = (await store.instances.get('inst_known'))!;
      // Current: written on it.
      const booted = await a.move('inst_known', 'boot', { pid: 7 }, store, known);
      expect([booted.status, booted.pid, booted.version]).toEqual(['running', 7, known.version + 1]);
      // Stale (it said `starting`; the instance runs and was written since): the boot it would
      // allow is refused as the current status says, not written on the old version.
      await store.instances.update('inst_known', { metadata: { since: 'yes' } });
      const late = await a.move('inst_known', 'boot', {}, store, known).catch((e: unknown) => e);
      expect((late as TransitionConflictError).details).toMatchObject({ reason: 'TRANSITION_NOT_ALLOWED', status: 'running' });
      // Stale but the move allowed: it lands once, on the current row.
      const stopped = await a.move('inst_known', 'stop', { pid: null }, store, booted);
      expect([stopped.status, stopped.metadata, stopped.version]).toEqual(['stopped', { since: 'yes' }, booted.version + 2]);
    } finally {
      await store.close();
    }
  });

  it('instances: writes of different columns, each prepared once, land on their own row with their own values; a column given as undefined is left as it is', async () => {
    const store = await open();
    try {
      await store.instances.insert(instance('inst_w1', '2026-01-01T00:00:01Z', { node: 'node-a' }));
      await store.instances.insert(instance('inst_w2', '2026-01-01T00:00:02Z'));
      const a = await store.instances.update('inst_w1', { name: 'first' });
      const b = await store.instances.update('inst_w2', { metadata: { x: '1' }, pid: 42 });
      const c = await store.instances.update('inst_w2', { name: 'second', pid: undefined });
      const d = await store.instances.update('inst_w1', { name: 'again' });
      expect([a.name, a.version, b.metadata, b.pid, b.version]).toEqual(['first', 1, { x: '1' }, 42, 1]);
      expect([c.name, c.pid, c.metadata, c.version, d.name, d.version]).toEqual(['second', 42, { x: '1' }, 2, 'again', 2]);
      // Status changes: on a node and on none, each its own shape; a stale version writes nothing.
      const e = await store.instances.compareAndSet('inst_w1', 2, 'node-a', { status: 'stopped', pid: null });
      const f = await store.instances.compareAndSet('inst_w2', 2, null, { status: 'stopped', pid: null });
      expect([e?.status, e?.version, f?.status, f?.pid, f?.version]).toEqual(['stopped', 3, 'stopped', null, 3]);
      expect(await store.instances.compareAndSet('inst_w1', 2, 'node-a', { status: 'running', pid: 1 })).toBeUndefined();
      expect(await store.instances.compareAndSet('inst_w2', 3, 'node-a', { status: 'running', pid: 1 })).toBeUndefined();
      expect((await store.instances.get('inst_w2'))?.status).toBe('stopped');
    } finally {
      await store.close();
    }
  });

  it('uid ranges: each held by one instance, never two, free again once it is gone', async () => {
    const store = await open();
    try {
      await store.instances.insert(instance('inst_a', '2026-01-01T00:00:01Z', { uidBase: 1073741824 }));
      await store.instances.insert(instance('inst_b', '2026-01-01T00:00:02Z', { uidBase: 1073807360 }));
      await store.instances.insert(instance('inst_c', '2026-01-01T00:00:03Z'));
      expect((await store.instances.get('inst_a'))?.uidBase).toBe(1073741824);
      expect((await store.instances.uidRanges()).sort((x, y) => x.uidBase - y.uidBase)).toEqual([
        { uidBase: 1073741824, owner: 'alice' },
        { uidBase: 1073807360, owner: 'alice' },
      ]);
      expect([await store.instances.uidRangesHeldBy('alice'), await store.instances.uidRangesHeldBy('bob')]).toEqual([2, 0]);
      // Two nodes picking the same free range at once: the store refuses the second.
      await expect(store.instances.insert(instance('inst_d', '2026-01-01T00:00:04Z', { uidBase: 1073741824 }))).rejects.toThrow();
      await store.instances.delete('inst_a');
      await store.instances.insert(instance('inst_d', '2026-01-01T00:00:04Z', { uidBase: 1073741824 }));
    } finally {
      await store.close();
    }
  });

  it('layers: held while anything stands on them, taken once nothing does', async () => {
    const store = await open();
    try {
      for (const l of ['l1', 'l2', 'l3']) await store.layers.add(l);
      await store.layers.add('l4', 'inst_a'); // pending: never garbage until settled
      await store.layers.setRefs('instance:a', ['l2', 'l1', 'l1']);
      await store.layers.setRefs('checkpoint:c', ['l3']);
      expect((await store.layers.takeUnreferenced()).sort()).toEqual([]);
      await store.layers.dropHolder('checkpoint:c');
      expect(await store.layers.takeUnreferenced()).toEqual(['l3']);
      await store.layers.settle('l4');
      expect(await store.layers.takeUnreferenced()).toEqual(['l4']);
      expect((await store.layers.all()).sort()).toEqual(['l1', 'l2']);
      expect((await store.layers.referenced()).sort()).toEqual(['l1', 'l2']);
      // Holders by prefix (a node's abandoned pulls): LIKE's '_' and '%' are the prefix's own.
      await store.layers.setRefs('pull:n_1:a', ['l1']);
      await store.layers.setRefs('pull:n%1:b', ['l1']);
      await store.layers.setRefs('pull:nx1:c', ['l2']);
      await store.layers.dropHoldersStartingWith('pull:n_1:');
      expect((await store.layers.holders('l1')).sort()).toEqual(['instance:a', 'pull:n%1:b']);
      await store.layers.dropHoldersStartingWith('pull:n%1:');
      expect(await store.layers.holders('l1')).toEqual(['instance:a']);
      expect((await store.layers.holders('l2')).sort()).toEqual(['instance:a', 'pull:nx1:c']);
    } finally {
      await store.close();
    }
  });

  it('a transaction is all or nothing', async () => {
    const store = await open();
    try {
      await store.layers.add('l1');
      await expect(
        store.transaction(async (tx) => {
          await tx.layers.setRefs('instance:a', ['l1']);
          await tx.instances.insert(instance('inst_1', '2026-01-01T00:00:01Z'));
          throw new Error('half-way');
        }),
      ).rejects.toThrow('half-way');
      expect(await store.layers.holders('l1')).toEqual([]);
      expect(await store.instances.get('inst_1')).toBeUndefined();
    } finally {
      await store.close();
    }
  });

  it('durable blobs: shared ones counted once, garbage once nothing references them', async () => {
    const store = await open();
    try {
      const manifest = (id: string, blobs: string[]) => ({
        checkpointId: id, image: 'default', agentLayer: 'a', baseLayer: false, hostname: 'h',
        layers: blobs.map((b, i) => ({ id: `l${i}`, blob: b, bytes: 1 })), memory: null,
      });
      for (const b of ['b1', 'b2', 'b3']) await store.durable.addBlob(b, 10);
      await store.durable.addBlob('b1', 10);
      await store.durable.put({ checkpointId: 'c1', manifest: manifest('c1', ['b1', 'b2']), uploadedBytes: 20, durableAt: 'now' });
      await store.durable.put({ checkpointId: 'c2', manifest: manifest('c2', ['b1', 'b3']), uploadedBytes: 10, durableAt: 'now' });
      expect(await store.durable.garbage()).toEqual([]);
      await store.durable.drop('c1');
      expect(await store.durable.garbage()).toEqual(['b2']);
      await store.durable.removeBlob('b2');
      await store.durable.drop('c2');
      expect((await store.durable.garbage()).sort()).toEqual(['b1', 'b3']);
      expect((await store.durable.get('c2'))).toBeUndefined();
    } finally {
      await store.close();
    }
  });

  it('executions: pages newest first, prunes ended ones past the newest N (never running ones), and copies to a fork as running', async () => {
    const store = await open();
    const rec = (id: string, startedAt: string, ended: boolean) => ({
      instanceId: 'inst_a', id, processId: Number.parseInt(id.slice(5), 16), kind: 'exec' as const, argv: ['echo', id], cwd: '/', startedAt,
      endedAt: ended ? startedAt : null, exitCode: ended ? 0 : null, signal: null, timedOut: false,
    });
    try {
      const ex = store.executions;
      await ex.insert(rec('exec_00000001', '2026-01-01T00:00:01Z', false));
      for (let i = 2; i <= 6; i++) await ex.insert(rec(`exec_0000000${i}`, `2026-01-01T00:00:0${i}Z`, true));
      const p1 = await ex.page('inst_a', 2);
      expect(p1.items.map((e) => e.id)).toEqual(['exec_00000006', 'exec_00000005']);
      expect((await ex.page('inst_a', 10, p1.nextCursor!)).items.map((e) => e.id)).toEqual(['exec_00000004', 'exec_00000003', 'exec_00000002', 'exec_00000001']);
      await ex.prune('inst_a', 2);
      expect((await ex.page('inst_a', 10)).items.map((e) => e.id)).toEqual(['exec_00000006', 'exec_00000005', 'exec_00000001']);
      await ex.copy('inst_a', 'inst_b', [5, 1, 99]);
      const copied = (await ex.page('inst_b', 10)).items;
      expect(copied.map((e) => [e.id, e.endedAt, e.exitCode])).toEqual([['exec_00000005', null, null], ['exec_00000001', null, null]]);
      expect(copied[0]!.argv).toEqual(['echo', 'exec_00000005']);
    } finally {
      await store.close();
    }
  });
});

describe('store on postgres, the database going away', () => {
  it('a connection that breaks while a transaction holds it between two queries fails that transaction, and does not end the process', async () => {
    const heard: Error[] = [];
    const store = await openStore(await postgres.database(`t${++databases}`), (err) => heard.push(err));
    try {
      let stopped!: () => void;
      const gone = new Promise<void>((r) => (stopped = r));
      const tx = store.transaction(async (t) => {
        await t.instances.addresses();
        // PostgreSQL goes away while this transaction's connection sits checked out and idle:
        // its client hears it as an 'error' event, which nothing but forkpoint's listener catches.
        await postgres.pause();
        stopped();
        await new Promise((r) => setTimeout(r, 200));
        await t.instances.addresses();
      });
      await gone;
      await expect(tx).rejects.toThrow();
      expect(heard.length).toBeGreaterThan(0);
    } finally {
      await postgres.resume();
      await store.close().catch(() => {});
    }
  });
});
