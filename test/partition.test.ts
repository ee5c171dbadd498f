import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import S3rver from 's3rver';
import { execa } from 'execa';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ChildServer } from './helpers/child-server.js';
import { CutProxy } from './helpers/cut-proxy.js';
import { TestPostgres } from './helpers/postgres.js';
import { sleep, until } from './helpers/wait.js';

// Two nodes sharing a real PostgreSQL and an S3-API server; node A reaches the database through
// a proxy this test cuts, as a network partition would, for longer than a node may be silent.
// What must hold: A freezes its sandboxes before B may take them over; once the cut heals A
// runs none of what B took and its writes with its old lease are refused; the instance runs
// exactly once, as the host's cgroups show.
let postgres: TestPostgres;
let s3: S3rver;
let proxy: CutProxy;
let a: ChildServer;
let b: ChildServer;
let env: Record<string, string>;
let envA: Record<string, string>;
const dirs: string[] = [];
const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
const tmp = async (prefix: string) => {
  const d = await mkdtemp(join(tmpdir(), prefix));
  dirs.push(d);
  return d;
};

const V2 = existsSync('/sys/fs/cgroup/cgroup.controllers');
/** The host pids of the instance's sandbox on `node`, from its cgroup. */
const pidsOn = (node: string, id: string): number[] => {
  const file = V2 ? `/sys/fs/cgroup/forkpoint/${node}/${id}/cgroup.procs` : `/sys/fs/cgroup/pids/forkpoint/${node}/${id}/cgroup.procs`;
  return existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean).map(Number) : [];
};
/** The counter file as the sandbox on `node` sees it, read from the host through one of its
 * processes' root. */
const countOnHost = (node: string, id: string): string => {
  for (const pid of pidsOn(node, id)) {
    try {
      return readFileSync(`/proc/${pid}/root/tmp/count`, 'utf8');
    } catch {
      // a process outside the sandbox's root (or gone): the next one
    }
  }
  throw new Error(`no process of ${id} on ${node} sees /tmp/count`);
};
const frozenOn = (node: string, id: string): boolean => {
  if (V2) return /^frozen 1$/m.test(readFileSync(`/sys/fs/cgroup/forkpoint/${node}/${id}/cgroup.events`, 'utf8'));
  const f = `/sys/fs/cgroup/freezer/forkpoint/${node}/${id}/freezer.state`;
  return existsSync(f) && readFileSync(f, 'utf8').trim() === 'FROZEN';
};

beforeAll(async () => {
  postgres = await TestPostgres.start();
  const s3dir = await tmp('forkpoint-s3-');
  s3 = new S3rver({ address: '127.0.0.1', port: 0, directory: s3dir, silent: true });
  const { port } = (await s3.run()) as { port: number };
  const url = await postgres.database('partition');
  const proxyDir = await tmp('forkpoint-pgproxy-');
  const pgSocketDir = new URL(url.replace('postgresql:', 'http:')).searchParams.get('host')!;
  proxy = await CutProxy.start(join(proxyDir, '.s.PGSQL.5432'), join(pgSocketDir, '.s.PGSQL.5432'));
  env = {
    FORKPOINT_DATABASE_URL: url,
    FORKPOINT_S3_ENDPOINT: `http://127.0.0.1:${port}`,
    FORKPOINT_S3_BUCKET: 'partition',
    FORKPOINT_S3_ACCESS_KEY_ID: 'S3RVER',
    FORKPOINT_S3_SECRET_ACCESS_KEY: 'S3RVER',
    FORKPOINT_NODE_HEARTBEAT_S: '0.5',
    FORKPOINT_NODE_DEAD_AFTER_S: '3',
  };
  envA = { ...env, FORKPOINT_DATABASE_URL: url.replace(`host=${encodeURIComponent(pgSocketDir)}`, `host=${encodeURIComponent(proxyDir)}`), FORKPOINT_NODE_ID: 'node-a' };
  a = await ChildServer.start(await tmp('forkpoint-node-a-'), undefined, envA);
  b = await ChildServer.start(await tmp('forkpoint-node-b-'), a.token, { ...env, FORKPOINT_NODE_ID: 'node-b' });
}, 120_000);

afterAll(async () => {
  const step = async (what: () => Promise<unknown>) => {
    await what().catch((err: unknown) => process.stderr.write(`partition test clean-up: ${String(err)}\n`));
  };
  proxy?.heal();
  // A settles its lease once it reaches the database again (thaws, or lets go of what B took).
  if (a) await step(() => until('A settled', async () => (await a.api('GET', '/readyz')).body?.checks?.fenced === undefined, 20_000));
  if (b) {
    await step(async () => {
      const list = (await b.api('GET', '/instances?limit=100')).body as { items?: { id: string }[] };
      for (const i of list.items ?? []) await b.api('DELETE', `/instances/${i.id}`);
    });
  }
  for (const n of [a, b]) if (n) await step(() => n.stop());
  await step(async () => proxy?.close());
  await step(async () => s3?.close());
  await step(async () => postgres?.stop());
  for (const d of dirs) await rm(d, { recursive: true, force: true });
}, 120_000);

/** The instance's status as the shared database has it (B's view of an instance of A's would
 * be forwarded to A, cut off). */
const rowInDb = async (id: string): Promise<{ status: string; node: string } | undefined> => {
  const db = new pg.Client({ connectionString: env.FORKPOINT_DATABASE_URL });
  await db.connect();
  try {
    return (await db.query('SELECT status, node FROM instances WHERE id = $1', [id])).rows[0];
  } finally {
    await db.end();
  }
};
const statusInDb = async (id: string) => (await rowInDb(id))?.status;

const exec = async (node: ChildServer, id: string, command: string) => {
  const r = await node.api('POST', `/instances/${id}/exec`, { command });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body as { exit_code: number; stdout: string };
};
const counter = async (node: ChildServer, id: string) => Number((await exec(node, id, 'cat /tmp/count')).stdout.trim());

describe('a node cut off from the database (a partition longer than dead-after)', () => {
  it('freezes its sandboxes before the other node takes them; after the cut it runs none of them, and the instance runs once', async () => {
    const made = await a.api('POST', '/instances', { name: 'partitioned' });
    expect([made.status, made.body.node]).toEqual([201, 'node-a']);
    const id = made.body.id as string;
    await exec(a, id, '(i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done) >/dev/null 2>&1 &');
    await until('the counter counting', async () => (await counter(a, id)) > 3);
    const before = await counter(a, id);
    const ckpt = await a.api('POST', `/instances/${id}/checkpoints?wait=durable`, { memory: true });
    expect([ckpt.status, ckpt.body.status, ckpt.body.durable], JSON.stringify(ckpt.body)).toEqual([200, 'ready', true]);
    expect(pidsOn('node-a', id).length).toBeGreaterThan(0);

    proxy.cut();
    // A freezes what it runs once it cannot renew its lease, well before B may judge it dead.
    await until('A\'s sandbox frozen', async () => frozenOn('node-a', id), 10_000);
    expect(await statusInDb(id)).toBe('running'); // not yet lost: B may not take it yet
    const still = countOnHost('node-a', id);
    await sleep(400);
    expect(countOnHost('node-a', id)).toBe(still); // frozen: the counter does not move

    await until('the instance lost (B judged A silent)', async () => (await statusInDb(id)) === 'lost', 20_000);
    expect(frozenOn('node-a', id)).toBe(true); // frozen before B could take it
    const back = await b.api('POST', `/instances/${id}/recover`);
    expect([back.status, back.body.node, back.body.status], JSON.stringify(back.body)).toEqual([200, 'node-b', 'running']);
    expect(pidsOn('node-b', id).length).toBeGreaterThan(0);
    const onB = await counter(b, id);
    expect(onB).toBeGreaterThanOrEqual(before); // the checkpoint's counter, running on

    proxy.heal();
    // A is back: it finds the instance is B's now, and stops what it held frozen.
    await until('A running nothing of it', async () => pidsOn('node-a', id).length === 0, 20_000);
    await until('A ready again', async () => (await a.api('GET', '/readyz')).status === 200, 20_000);
    const seen = await a.api('GET', `/instances/${id}`);
    expect([seen.status, seen.body.node, seen.body.status]).toEqual([200, 'node-b', 'running']);
    // Exactly once, from the host's process table: B's sandbox only, still counting.
    for (let i = 0; i < 6; i++) {
      expect(pidsOn('node-a', id)).toEqual([]);
      expect(pidsOn('node-b', id).length).toBeGreaterThan(0);
      await sleep(250);
    }
    expect(await counter(a, id)).toBeGreaterThan(onB); // through A, answered by B's sandbox
  }, 120_000);

  it('a call forwarded to a node that drops off the network ends once that node is judged lost, not at its timeout', async () => {
    const made = await a.api('POST', '/instances', { name: 'stopped-node' });
    expect(made.status).toBe(201);
    const id = made.body.id as string;
    // Asked of B, run by A; then A stops answering without a reset (SIGSTOP: as a machine gone
    // from the network), its sandbox running on.
    const call = b.api('POST', `/instances/${id}/exec`, { command: 'sleep 600', timeout_ms: 900_000 });
    await sleep(1000);
    a.proc.kill('SIGSTOP');
    try {
      const r = await call;
      expect([r.status, r.body.error?.details?.reason], JSON.stringify(r.body)).toEqual([503, 'NODE_LOST']);
      await until('the instance lost', async () => (await statusInDb(id)) === 'lost', 10_000);
    } finally {
      a.proc.kill('SIGCONT');
    }
    // A answers again: its lease had ended, it takes a new one and takes back what no one took.
    await until('A ready again', async () => (await a.api('GET', '/readyz')).status === 200, 20_000);
    await until('the instance A\'s again', async () => (await statusInDb(id)) === 'running', 20_000);
    expect((await exec(a, id, 'echo back')).stdout).toBe('back\n');
  }, 60_000);

  it('forkpoint drain: the node takes no new work and hands its instances over, processes and all', async () => {
    const made = await a.api('POST', '/instances', { name: 'handed' });
    expect(made.body.node).toBe('node-a');
    const id = made.body.id as string;
    await exec(a, id, '(i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done) >/dev/null 2>&1 &');
    await until('the counter counting', async () => (await counter(a, id)) > 3);
    // And one that is stopped: it is handed over stopped, its files with it.
    const parked = (await a.api('POST', '/instances', { name: 'parked' })).body.id as string;
    await exec(a, parked, 'echo kept > /root/parked');
    expect((await a.api('POST', `/instances/${parked}/stop`)).status).toBe(200);
    // And one that mounts a volume of A's disk: no other node could mount it, so it stays.
    expect((await a.api('POST', '/volumes', { name: 'a-disk', size_mb: 64 })).body.node).toBe('node-a');
    const pinned = await a.api('POST', '/instances', { name: 'pinned', volumes: [{ name: 'a-disk', path: '/d' }] });
    expect(pinned.body.node).toBe('node-a');
    const onA = ((await a.api('GET', '/instances?limit=100')).body.items as { id: string; node: string }[]).filter((i) => i.node === 'node-a' && i.id !== pinned.body.id).map((i) => i.id);
    const before = await counter(a, id);
    const drained = await execa(process.execPath, [CLI, 'drain', '--url', a.url, '--token', a.token], { reject: false, timeout: 120_000 });
    expect(drained.exitCode, drained.stderr).toBe(0);
    const report = JSON.parse(drained.stdout) as { handed_over: string[]; kept: string[] };
    expect([report.handed_over.sort(), report.kept]).toEqual([onA.sort(), [pinned.body.id]]);
    const ready = await a.api('GET', '/readyz');
    expect([ready.status, ready.body.checks.draining]).toEqual([503, true]);
    // B takes it over by itself, from the checkpoint the drain took: its processes go on.
    await until('the instance running on B', async () => {
      const row = await rowInDb(id);
      return row?.status === 'running' && row.node === 'node-b';
    }, 30_000);
    expect(await counter(b, id)).toBeGreaterThanOrEqual(before);
    expect(pidsOn('node-a', id)).toEqual([]);
    expect(pidsOn('node-b', id).length).toBeGreaterThan(0);
    const next = await counter(b, id);
    await until('the counter going on', async () => (await counter(b, id)) > next);
    await until('the stopped one on B, stopped', async () => {
      const row = await rowInDb(parked);
      return row?.status === 'stopped' && row.node === 'node-b';
    }, 30_000);
    expect((await b.api('POST', `/instances/${parked}/start`)).status).toBe(200);
    expect((await exec(b, parked, 'cat /root/parked')).stdout).toBe('kept\n');
    // Nothing new lands on the draining node, even when asked of it.
    const placed = await a.api('POST', '/instances', { name: 'after-drain' });
    expect([placed.status, placed.body.node]).toEqual([201, 'node-b']);
    expect((await exec(a, pinned.body.id, 'echo still here > /d/f && cat /d/f')).stdout).toBe('still here\n');
    expect((await a.api('DELETE', `/instances/${pinned.body.id}`)).status).toBe(204);
    expect((await a.api('DELETE', '/volumes/a-disk')).status).toBe(204);
  }, 120_000);

  it('a node alone on its database does not freeze while it cannot reach it, and serves its own sandboxes meanwhile; a token revoked before is refused within the grace', async () => {
    const url = await postgres.database('solo');
    const pgSocketDir = new URL(url.replace('postgresql:', 'http:')).searchParams.get('host')!;
    const soloProxyDir = await tmp('forkpoint-pgproxy-');
    const soloProxy = await CutProxy.start(join(soloProxyDir, '.s.PGSQL.5432'), join(pgSocketDir, '.s.PGSQL.5432'));
    let c: ChildServer | undefined;
    try {
      c = await ChildServer.start(await tmp('forkpoint-node-c-'), undefined, {
        ...env,
        FORKPOINT_S3_BUCKET: 'solo',
        FORKPOINT_DATABASE_URL: url.replace(`host=${encodeURIComponent(pgSocketDir)}`, `host=${encodeURIComponent(soloProxyDir)}`),
        FORKPOINT_NODE_ID: 'node-c',
        FORKPOINT_TOKEN_GRACE_S: '2',
      });
      const id = (await c.api('POST', '/instances', { name: 'alone' })).body.id as string;
      await exec(c, id, '(i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done) >/dev/null 2>&1 &');
      await until('the counter counting', async () => (await counter(c!, id)) > 3);
      // A second token, used once, then revoked; past the grace (2 s) the database goes away.
      const cli = (args: string[]) => execa(process.execPath, [CLI, ...args], { env: { ...process.env, FORKPOINT_DATABASE_URL: url }, timeout: 30_000 });
      const made = await cli(['token', 'create', '--name', 'revoked-later']);
      const revoked = made.stdout.trim();
      const asRevoked = (path: string) => request(c!.url + path, { headers: { authorization: `Bearer ${revoked}` } }).then(async (r) => ({ status: r.statusCode, body: await r.body.text() }));
      expect((await asRevoked('/instances')).status).toBe(200);
      await cli(['token', 'revoke', /token (\S+) /.exec(made.stderr)![1]!]);
      await sleep(2100);
      expect((await c.api('GET', '/instances')).status).toBe(200); // the node's own token, just vouched for
      soloProxy.refuse();
      // The database away: an exec on this node's own sandbox answers, with the token it vouched
      // for a moment ago; the revoked one, last vouched for past the grace, does not.
      expect((await exec(c, id, 'echo served')).stdout).toBe('served\n');
      expect((await asRevoked(`/instances/${id}`)).status).toBeGreaterThanOrEqual(401);
      await sleep(2500); // past half the dead-after time (1.5 s), when a node with peers freezes
      expect(frozenOn('node-c', id)).toBe(false);
      const seen = countOnHost('node-c', id);
      await sleep(300);
      expect(countOnHost('node-c', id)).not.toBe(seen); // still counting
      soloProxy.heal();
      await until('C answering again', async () => (await c!.api('GET', `/instances/${id}`)).status === 200, 20_000);
    } finally {
      soloProxy.heal();
      if (c) {
        await until('C answering', async () => (await c!.api('GET', '/instances')).status === 200, 20_000).catch(() => {});
        for (const i of ((await c.api('GET', '/instances')).body?.items ?? []) as { id: string }[]) await c.api('DELETE', `/instances/${i.id}`);
        await c.stop();
      }
      await soloProxy.close();
    }
  }, 60_000);
});
