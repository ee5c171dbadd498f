import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox as OpenComputer } from '@opencomputer/sdk';
import { Sandbox as E2B } from 'e2b';
import pg from 'pg';
import { execa } from 'execa';
import S3rver from 's3rver';
import { request } from 'undici';
import { WebSocket } from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pulledLayerId } from '../src/engine/registry-pull.js';
import { ObjectStore } from '../src/store/object-store.js';
import { ChildServer } from './helpers/child-server.js';
import { layerOf, push, startRegistry, writeOciLayout } from './helpers/registry.js';
import { TestPostgres } from './helpers/postgres.js';
import { openSse } from './helpers/sse.js';
import { sleep, until } from './helpers/wait.js';

// Two forkpoint nodes on this machine (separate processes, data directories, ports and
// sandbox networks) sharing a real PostgreSQL and a real S3-API server (s3rver), both started
// here on loopback or a socket in a temporary directory.
const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
let postgres: TestPostgres;
let s3: S3rver;
let bucket: ObjectStore;
const dirs: string[] = [];
let env: Record<string, string>;
let a: ChildServer;
let b: ChildServer;
let dirA: string;
let dirB: string;

const tmp = async (prefix: string) => {
  const d = await mkdtemp(join(tmpdir(), prefix));
  dirs.push(d);
  return d;
};

beforeAll(async () => {
  postgres = await TestPostgres.start();
  const s3dir = await tmp('forkpoint-s3-');
  s3 = new S3rver({ address: '127.0.0.1', port: 0, directory: s3dir, silent: true });
  const { port } = (await s3.run()) as { port: number };
  const endpoint = `http://127.0.0.1:${port}`;
  // No bucket yet: the first node makes it.
  bucket = new ObjectStore({ endpoint, bucket: 'cluster', region: 'us-east-1', accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER', prefix: 'forkpoint/' });
  env = {
    FORKPOINT_DATABASE_URL: await postgres.database('cluster'),
    FORKPOINT_S3_ENDPOINT: endpoint,
    FORKPOINT_S3_BUCKET: 'cluster',
    FORKPOINT_S3_ACCESS_KEY_ID: 'S3RVER',
    FORKPOINT_S3_SECRET_ACCESS_KEY: 'S3RVER',
    FORKPOINT_NODE_HEARTBEAT_S: '0.5',
    FORKPOINT_NODE_DEAD_AFTER_S: '3',
  };
  dirA = await tmp('forkpoint-node-a-');
  dirB = await tmp('forkpoint-node-b-');
  a = await ChildServer.start(dirA, undefined, { ...env, FORKPOINT_NODE_ID: 'node-a' });
  b = await ChildServer.start(dirB, a.token, { ...env, FORKPOINT_NODE_ID: 'node-b' });
}, 120_000);

afterAll(async () => {
  // Every step on its own: one that fails leaves the others to run.
  const step = async (what: () => Promise<unknown>) => {
    await what().catch((err: unknown) => process.stderr.write(`cluster test clean-up: ${String(err)}\n`));
  };
  const ended = (n: ChildServer) => n.proc.exitCode !== null || n.proc.signalCode !== null;
  // Whatever is left goes through the API (each call finds the instance's node); a node that
  // was killed is started again so that it removes what it left running.
  // (one that crashed too: both can, when a test fails).
  if (a && b) {
    const token = a.token;
    if (ended(a)) await step(async () => (a = await ChildServer.start(dirA, token, { ...env, FORKPOINT_NODE_ID: 'node-a' })));
    if (ended(b)) await step(async () => (b = await ChildServer.start(dirB, token, { ...env, FORKPOINT_NODE_ID: 'node-b' })));
  }
  const live = [a, b].filter((n) => n && !ended(n));
  if (live[0]) {
    await step(async () => {
      const list = (await live[0]!.api('GET', '/instances?limit=100')).body as { items?: { id: string }[] };
      for (const i of list.items ?? []) await live[0]!.api('DELETE', `/instances/${i.id}`);
      // Volumes too (each call goes to the volume's node): their loop mounts would outlive the test.
      const volumes = (await live[0]!.api('GET', '/volumes')).body as { items?: { name: string }[] };
      for (const v of volumes.items ?? []) await live[0]!.api('DELETE', `/volumes/${v.name}`);
    });
  }
  for (const n of live) await step(() => n.stop());
  // A node that did not stop is killed: nothing of the test outlives it.
  for (const n of [a, b]) if (n && !ended(n)) await step(() => n.stop('SIGKILL'));
  bucket?.close();
  await step(async () => s3?.close());
  await step(async () => postgres?.stop());
  for (const d of dirs) await rm(d, { recursive: true, force: true });
}, 120_000);

/** Host pids whose real uid is `uid`. */
function hostProcessesOf(uid: number): number[] {
  return readdirSync('/proc')
    .filter((n) => /^\d+$/.test(n))
    .filter((n) => {
      try {
        return Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${n}/status`, 'utf8'))?.[1]) === uid;
      } catch {
        return false;
      }
    })
    .map(Number);
}

const exec = async (node: ChildServer, id: string, command: string) => {
  const r = await node.api('POST', `/instances/${id}/exec`, { command });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body as { exit_code: number; stdout: string };
};
const counter = async (node: ChildServer, id: string) => Number((await exec(node, id, 'cat /tmp/count')).stdout.trim());
const durable = async (node: ChildServer, id: string, ckpt: string) => {
  let c: { durable: boolean; uploaded_bytes: number } | undefined;
  await until('the checkpoint durable', async () => {
    c = (await node.api('GET', `/instances/${id}/checkpoints/${ckpt}`)).body;
    return c!.durable;
  }, 60_000);
  return c!;
};
const entries = async (dir: string) => (await readdir(dir).catch(() => [] as string[])).filter((e) => !e.startsWith('.'));

describe('a cluster of two nodes sharing PostgreSQL and an object store', () => {
  let inst: { id: string };
  let ckpt: { id: string };
  let blobsAfterFirst: number;

  it('both nodes register and see each other live', async () => {
    for (const n of [a, b]) {
      const nodes = (await n.api('GET', '/nodes')).body.nodes as { id: string; live: boolean; self: boolean }[];
      expect(nodes.map((x) => [x.id, x.live])).toEqual([['node-a', true], ['node-b', true]]);
      expect(nodes.find((x) => x.self)!.id).toBe(n === a ? 'node-a' : 'node-b');
    }
  });

  it('create on A, checkpoint with memory, durable; fork on B carries files and a running counter, fetched from the object store', async () => {
    const made = await a.api('POST', '/instances', { name: 'origin' });
    expect(made.status).toBe(201);
    inst = made.body;
    expect(made.body.node).toBe('node-a');
    // A creation goes to the node running fewest: asked of A (running one), made on B.
    const placed = await a.api('POST', '/instances', { name: 'placed' });
    expect([placed.status, placed.body.node]).toEqual([201, 'node-b']);
    expect((await a.api('DELETE', `/instances/${placed.body.id}`)).status).toBe(204);
    await exec(a, inst.id, 'mkdir -p /srv/u && echo mine > /srv/u/owned && chown -R 1000:1000 /srv/u && echo carried > /root/file && (i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done) >/dev/null 2>&1 &');
    await until('the counter counting', async () => (await counter(a, inst.id)) > 3);
    const c = await a.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true });
    expect(c.body.status).toBe('ready');
    ckpt = c.body;
    const d = await durable(a, inst.id, ckpt.id);
    expect(d.uploaded_bytes).toBeGreaterThan(0);
    const atCheckpoint = await counter(a, inst.id);
    blobsAfterFirst = (await bucket.list()).filter((k) => k.startsWith('blobs/')).length;

    // Node B has nothing of it: no layer, no memory image.
    expect(await entries(join(dirB, 'layers'))).toEqual([]);
    expect(await entries(join(dirB, 'checkpoints'))).toEqual([]);

    const fork = await b.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ckpt.id, name: 'far-fork' });
    expect(fork.status, JSON.stringify(fork.body)).toBe(201);
    expect(fork.body.node).toBe('node-b');
    expect((await exec(b, fork.body.id, 'cat /root/file')).stdout).toBe('carried\n');
    // In a uid range of its own, not the source's; A's files with their owners.
    expect(fork.body.user_namespace).toBe(true);
    const rangeOf = async (node: ChildServer, id: string) => Number((await exec(node, id, 'cat /proc/self/uid_map')).stdout.trim().split(/\s+/)[1]);
    const [baseA, baseB] = [await rangeOf(a, inst.id), await rangeOf(b, fork.body.id)];
    expect(baseB).not.toBe(baseA);
    expect(baseB).toBeGreaterThan(0);
    expect((await exec(b, fork.body.id, 'stat -c %u:%g:%n /root/file /srv/u /srv/u/owned')).stdout).toBe('0:0:/root/file\n1000:1000:/srv/u\n1000:1000:/srv/u/owned\n');
    expect(hostProcessesOf(baseB).length, 'the fork\'s processes run as host ids of its range').toBeGreaterThan(0);
    const first = await counter(b, fork.body.id);
    expect(first).toBeGreaterThan(3);
    await until('the fork\'s counter to move on', async () => (await counter(b, fork.body.id)) > first, 5_000); // the process runs on
    expect(first).toBeLessThanOrEqual(atCheckpoint + 100);
    expect((await entries(join(dirB, 'layers'))).length).toBeGreaterThan(0);
    // OpenComputer's fork from a checkpoint, asked of B: made there too.
    const oc = await b.api('POST', `/api/sandboxes/from-checkpoint/${ckpt.id}`, {});
    expect(oc.status, JSON.stringify(oc.body)).toBe(201);
    expect((await b.api('GET', `/instances/${oc.body.sandboxID}`)).body.node).toBe('node-b');
    expect((await a.api('DELETE', `/api/sandboxes/${oc.body.sandboxID}`)).status).toBeLessThan(300);
  });

  it('an image pulled on A serves on B too: B gets its layers, pulled by digest as its owner for a create placed there, from the object store with a durable checkpoint for a fork made there', async () => {
    const registry = await startRegistry();
    try {
      const work = await tmp('forkpoint-cluster-image-');
      await mkdir(join(work, 'marker', 'etc'), { recursive: true });
      await writeFile(join(work, 'marker', 'etc', 'pulled'), 'from the registry\n');
      const blobs = [await layerOf('/opt/forkpoint/images/default'), await layerOf(join(work, 'marker'))];
      // What each registry layer is named as a layer of forkpoint's, on every node.
      const layerIds = blobs.map((b) => pulledLayerId(`sha256:${createHash('sha256').update(b).digest('hex')}`));
      await writeOciLayout(join(work, 'layout'), 'v1', blobs, {});
      const ref = `${registry.host}/team/spread:v1`;
      await push(join(work, 'layout'), 'v1', ref);
      const pulled = await a.api('POST', '/images/pull', { reference: ref });
      expect(pulled.status, JSON.stringify(pulled.body)).toBe(201);
      for (const id of layerIds) expect(await entries(join(dirA, 'layers'))).toContain(id);
      expect(await entries(join(dirB, 'layers'))).not.toContain(layerIds[1]);
      // Made wherever placement puts it, then forked from a durable checkpoint on the other node:
      // B makes one of the two, with no pull of its own asked for.
      const made = await a.api('POST', '/instances', { image: ref });
      expect(made.status, JSON.stringify(made.body)).toBe(201);
      const here = made.body.node === 'node-a' ? a : b;
      const there = made.body.node === 'node-a' ? b : a;
      expect((await exec(here, made.body.id, 'cat /etc/pulled')).stdout).toBe('from the registry\n');
      const c = await here.api('POST', `/instances/${made.body.id}/checkpoints?wait=true`, { memory: false });
      expect(c.body.status).toBe('ready');
      await durable(here, made.body.id, c.body.id);
      const fork = await there.api('POST', `/instances/${made.body.id}/fork`, { checkpoint_id: c.body.id });
      expect(fork.status, JSON.stringify(fork.body)).toBe(201);
      expect(fork.body.node).toBe(there === a ? 'node-a' : 'node-b');
      expect((await exec(there, fork.body.id, 'cat /etc/pulled')).stdout).toBe('from the registry\n');
      for (const id of layerIds) expect(await entries(join(dirB, 'layers'))).toContain(id);
      // No tree of the whole image on either node: its layers are all there is of it.
      for (const dir of [dirA, dirB]) expect((await entries(join(dir, 'images'))).filter((n) => n.startsWith('sha256-'))).toEqual([]);
      for (const id of [fork.body.id, made.body.id]) expect((await a.api('DELETE', `/instances/${id}`)).status).toBe(204);
      // Deleted, the image lets go of its layers (each node drops its copies as it next collects).
      expect((await a.api('DELETE', `/images/${encodeURIComponent(ref)}`)).status).toBe(204);
      for (const id of layerIds) expect(await entries(join(dirA, 'layers'))).not.toContain(id);
    } finally {
      await registry.close();
    }
  });

  it('every call works from either node: views, lists, exec, checkpoints, E2B access tokens, event streams and WebSocket terminals', async () => {
    for (const n of [a, b]) {
      const v = await n.api('GET', `/instances/${inst.id}`);
      expect([v.status, v.body.node]).toEqual([200, 'node-a']);
      expect((await exec(n, inst.id, 'cat /root/file')).stdout).toBe('carried\n');
      expect(typeof v.body.network.sent_bytes).toBe('number'); // its node answers a GET
      const list = (await n.api('GET', '/instances')).body.items as { name: string; node: string; network: { sent_bytes: number | null } }[];
      expect(list.map((i) => [i.name, i.node]).sort()).toEqual([['far-fork', 'node-b'], ['origin', 'node-a']]);
      // A list shows the counters it has: another node's instance's live in that node's memory.
      for (const i of list) expect(i.network.sent_bytes === null).toBe(i.node !== (n === a ? 'node-a' : 'node-b'));
      const cps = await n.api('GET', `/instances/${inst.id}/checkpoints`);
      expect(cps.body.items.map((x: { id: string }) => x.id)).toContain(ckpt.id);
      // A preview link names the host the client used, whichever node made it.
      const link = new URL((await n.api('POST', `/instances/${inst.id}/ports/8080/preview`, { ttl_s: 60 })).body.url as string);
      expect(link.port).toBe(new URL(n.url).port);
    }
    // Behind a load balancer: a link asked through the node that does not run the instance names
    // the balancer's host (a preview host of its own under it), and opens the port through B.
    await exec(a, inst.id, 'mkdir -p /srv/www && echo behind the balancer > /srv/www/index.html && (httpd -p 8080 -h /srv/www &)');
    const viaLb = await request(`${b.url}/instances/${inst.id}/ports/8080/preview`, { method: 'POST', headers: { authorization: `Bearer ${b.token}`, host: 'lb.example', 'content-type': 'application/json' }, body: '{"ttl_s": 60}' });
    const lbLink = new URL(((await viaLb.body.json()) as { url: string }).url);
    expect(lbLink.host).toBe(`8080-${inst.id}.lb.example`);
    const opened = await request(`${b.url}${lbLink.pathname}${lbLink.search}`, { headers: { host: lbLink.host } });
    expect([opened.statusCode, await opened.body.text()]).toEqual([200, 'behind the balancer\n']);
    await exec(b, inst.id, 'echo written through B > /root/from-b');
    expect((await exec(a, inst.id, 'cat /root/from-b')).stdout).toBe('written through B\n');

    // E2B's envd calls carry the sandbox's own access token, made on A: B accepts it too.
    const connected = await a.api('POST', `/sandboxes/${inst.id}/connect`, { timeout: 3600 });
    expect(connected.status, JSON.stringify(connected.body)).toBeLessThan(300);
    const envd = await request(`${b.url}/files?path=/root/file`, { headers: { 'e2b-sandbox-id': inst.id, 'x-access-token': connected.body.envdAccessToken } });
    expect([envd.statusCode, await envd.body.text()]).toEqual([200, 'carried\n']);

    // Streams through B: Server-Sent Events as they happen, and a terminal over WebSocket.
    const sse = await openSse(`${b.url}/instances/${inst.id}/exec/stream`, { method: 'POST', headers: { authorization: `Bearer ${b.token}`, 'content-type': 'application/json' }, body: { command: 'echo one; sleep 0.5; echo two' } });
    expect(sse.status).toBe(200);
    const events = [(await sse.next())!, ...(await sse.rest(10_000))];
    expect(events.map((e) => e.event)).toEqual(['start', 'stdout', 'stdout', 'exit']);
    expect(events[2]!.at - events[1]!.at).toBeGreaterThan(300); // streamed, not buffered whole
    const pty = await b.api('POST', `/instances/${inst.id}/pty`, { rows: 20, cols: 70 });
    expect(pty.status).toBe(201);
    const ws = new WebSocket(`${b.url.replace('http', 'ws')}/instances/${inst.id}/pty/${pty.body.id}`, { headers: { authorization: `Bearer ${b.token}` } });
    let text = '';
    ws.on('message', (d: Buffer) => (text += d.toString('utf8')));
    ws.on('error', () => {});
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('unexpected-response', (_q, r) => reject(new Error(`upgrade refused: ${r.statusCode}`)));
    });
    ws.send('stty size; echo on-""node-$(cat /root/file)\n');
    await until('the terminal answers', () => /20 70/.test(text) && /on-node-carried/.test(text));
    ws.close();
    expect((await b.api('DELETE', `/instances/${inst.id}/pty/${pty.body.id}`)).status).toBe(204);
  });

  it('a volume lives on the node that made it: an instance that mounts it is made there whichever node is asked; its calls go there too', async () => {
    expect((await b.api('POST', '/volumes', { name: 'on-b', size_mb: 64 })).body.node).toBe('node-b');
    expect((await a.api('POST', '/volumes', { name: 'on-a', size_mb: 64 })).body.node).toBe('node-a');
    const made = await a.api('POST', '/instances', { volumes: [{ name: 'on-b', path: '/v' }] });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    expect(made.body.node).toBe('node-b');
    await exec(a, made.body.id, 'echo hello > /v/f');
    // Asked of A, answered by B, which has its disk.
    const seen = await a.api('GET', '/volumes/on-b');
    expect(seen.body.instances).toEqual([made.body.id]);
    expect(seen.body.used_bytes).toBeGreaterThan(0);
    const both = await a.api('POST', '/instances', { volumes: [{ name: 'on-b', path: '/b' }, { name: 'on-a', path: '/a' }] });
    expect(both.status).toBe(409);
    expect(both.body.error.details).toMatchObject({ reason: 'VOLUME_ON_OTHER_NODE' });
    expect((await a.api('DELETE', `/instances/${made.body.id}`)).status).toBe(204);
    for (const name of ['on-b', 'on-a']) expect((await a.api('DELETE', `/volumes/${name}`)).status).toBe(204);
    expect((await b.api('GET', '/volumes')).body.items).toEqual([]);
  });

  it('the published SDKs, pointed at node B, work an instance on node A: OpenComputer and E2B', async () => {
    const oc = await OpenComputer.connect(inst.id, { apiUrl: b.url, apiKey: b.token });
    expect((await oc.commands.run('cat /root/file')).stdout).toBe('carried\n');
    await oc.files.write('/root/via-oc', 'written by the OpenComputer SDK through B');
    expect(await oc.files.read('/root/via-oc')).toBe('written by the OpenComputer SDK through B');
    // E2B's commands run under bash, which the default image has not: its files, then.
    const e2b = await E2B.connect(inst.id, { apiUrl: b.url, sandboxUrl: b.url, apiKey: b.token });
    expect(await e2b.files.read('/root/via-oc')).toBe('written by the OpenComputer SDK through B');
    await e2b.files.write('/root/via-e2b', 'and by the E2B SDK');
    expect(await e2b.files.read('/root/via-e2b')).toBe('and by the E2B SDK');
    expect((await exec(a, inst.id, 'cat /root/via-e2b')).stdout).toBe('and by the E2B SDK');
  });

  it('a call its node takes long to answer (a 65 s command, past the minute a forward once waited) is answered through the other node', async () => {
    const far = ((await a.api('GET', '/instances')).body.items as { id: string; name: string }[]).find((i) => i.name === 'far-fork')!;
    const r = await a.api('POST', `/instances/${far.id}/exec`, { command: 'sleep 65; echo done', timeout_ms: 120_000 });
    expect([r.status, r.body.stdout]).toEqual([200, 'done\n']);
  }, 120_000);

  it('the database away for longer than a node may be silent: both nodes live through it, and neither takes the other for dead', async () => {
    const far = ((await a.api('GET', '/instances')).body.items as { id: string; name: string }[]).find((i) => i.name === 'far-fork')!;
    await postgres.pause();
    try {
      // Every sweep (idle, expiry, heartbeat) fails meanwhile, and no heartbeat lands: once the
      // database is back, each node has been silent longer than FORKPOINT_NODE_DEAD_AFTER_S (3).
      await sleep(1000);
      for (const n of [a, b]) {
        const away = await n.api('GET', '/instances');
        expect([away.status, away.body.error?.code], JSON.stringify(away.body)).toEqual([503, 'UNAVAILABLE']);
        // Not ready while its database is away (alive all the same).
        const ready = await n.api('GET', '/readyz');
        expect([ready.status, ready.body.ready, ready.body.checks.database]).toEqual([503, false, false]);
        expect((await n.api('GET', '/healthz')).status).toBe(200);
      }
      await sleep(4000);
      // Neither could renew its lease for half the dead-after time: both froze their sandboxes.
      for (const n of [a, b]) expect((await n.api('GET', '/readyz')).body.checks.fenced).toBe(true);
    } finally {
      await postgres.resume();
    }
    for (const n of [a, b]) {
      expect([n.proc.exitCode, n.proc.signalCode]).toEqual([null, null]);
      await until('the node answering from the database again', async () => (await n.api('GET', '/instances')).status === 200, 20_000);
      // Its next heartbeat renews the lease no one ended (no node could): everything thaws.
      await until('the node ready again', async () => (await n.api('GET', '/readyz')).status === 200, 20_000);
      const ready = await n.api('GET', '/readyz');
      expect([ready.status, ready.body.checks]).toEqual([200, { engine: true, database: true, object_store: true, draining: false }]);
    }
    // Past the time a node waits, once back, before it judges the others' silence.
    for (let i = 0; i < 16; i++) {
      for (const id of [inst.id, far.id]) expect((await b.api('GET', `/instances/${id}`)).body.status).toBe('running');
      await sleep(250);
    }
    expect((await exec(b, inst.id, 'cat /root/file')).stdout).toBe('carried\n');
    expect((await exec(a, far.id, 'cat /root/file')).stdout).toBe('carried\n');
  });

  it('a node that finds its own instance marked lost while it lives on (another node judged it silent) takes it back', async () => {
    const db = new pg.Client({ connectionString: env.FORKPOINT_DATABASE_URL });
    await db.connect();
    try {
      await db.query("UPDATE instances SET status = 'lost' WHERE id = $1", [inst.id]);
    } finally {
      await db.end();
    }
    await until('the instance its node\'s again', async () => (await b.api('GET', `/instances/${inst.id}`)).body.status === 'running', 10_000);
    expect((await exec(b, inst.id, 'cat /root/file')).stdout).toBe('carried\n');
  });

  it('node A stops hard: its instance becomes lost, and recover brings it back on B from its durable checkpoint', async () => {
    await a.stop('SIGKILL');
    // Before A counts as dead: the first forward finds it gone, and from then its instance's
    // view comes from the store here, while what needs its sandbox answers 503 with a reason.
    const firstView = await b.api('GET', `/instances/${inst.id}`);
    expect([200, 503]).toContain(firstView.status);
    const view = await b.api('GET', `/instances/${inst.id}`);
    expect([view.status, view.body.node]).toEqual([200, 'node-a']);
    const busy = await b.api('POST', `/instances/${inst.id}/exec`, { command: 'true' });
    expect([busy.status, busy.body.error?.details?.reason ?? busy.body.error?.code]).toEqual([503, 'NODE_UNREACHABLE']);
    await until('the instance lost', async () => (await b.api('GET', `/instances/${inst.id}`)).body.status === 'lost', 20_000);
    const refused = await b.api('POST', `/instances/${inst.id}/exec`, { command: 'true' });
    expect(refused.status).toBe(409);
    const back = await b.api('POST', `/instances/${inst.id}/recover`);
    expect(back.status, JSON.stringify(back.body)).toBe(200);
    expect([back.body.status, back.body.node, back.body.head_checkpoint_id]).toEqual(['running', 'node-b', ckpt.id]);
    expect((await exec(b, inst.id, 'cat /root/file')).stdout).toBe('carried\n');
    expect((await exec(b, inst.id, 'cat /root/from-b 2>/dev/null || echo gone')).stdout).toBe('gone\n'); // after the checkpoint: gone with A
    const first = await counter(b, inst.id);
    await until('the counter to move on', async () => (await counter(b, inst.id)) > first, 5_000);
    expect((await b.api('POST', `/instances/${inst.id}/recover`)).status).toBe(409); // not lost any more
  });

  it('blobs shared by two checkpoints are uploaded once; deleting both leaves the bucket empty after collection; a node that comes back drops its copies of what was deleted', async () => {
    // The recovered instance stands on the first checkpoint's layers: a files-only checkpoint of
    // it uploads its own new layer and nothing else (the layers' blobs are there already).
    const c2 = (await b.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: false })).body;
    const d2 = await durable(b, inst.id, c2.id);
    const blobs = (await bucket.list()).filter((k) => k.startsWith('blobs/')).length;
    expect(blobs).toBe(blobsAfterFirst + 1);
    expect(d2.uploaded_bytes).toBeLessThan((await durable(b, inst.id, ckpt.id)).uploaded_bytes);
    for (const id of [ckpt.id, c2.id]) expect((await b.api('DELETE', `/instances/${inst.id}/checkpoints/${id}`)).status).toBe(204);
    const forks = (await b.api('GET', '/instances')).body.items as { id: string; name: string }[];
    for (const f of forks) expect((await b.api('DELETE', `/instances/${f.id}`)).status).toBe(204);
    await until('the bucket empty', async () => (await bucket.list()).length === 0, 30_000);
    expect(await entries(join(dirB, 'layers'))).toEqual([]);
    // Node A comes back: the copies it kept of what B deleted go, and so does the sandbox it
    // left running of the instance B recovered.
    expect((await entries(join(dirA, 'layers'))).length).toBeGreaterThan(0);
    a = await ChildServer.start(dirA, b.token, { ...env, FORKPOINT_NODE_ID: 'node-a' });
    expect(await entries(join(dirA, 'layers'))).toEqual([]);
    expect(await entries(join(dirA, 'checkpoints'))).toEqual([]);
    expect(await entries(join(dirA, 'instances'))).toEqual([]);
  });

  it('two nodes started at the same instant against an empty bucket and a database that comes up later both serve', async () => {
    const database = await postgres.database('late');
    const made = await execa(process.execPath, [CLI, 'token', 'create'], { env: { ...process.env, FORKPOINT_DATA_DIR: await tmp('forkpoint-token-'), FORKPOINT_DATABASE_URL: database } });
    const token = made.stdout.trim();
    const late = { ...env, FORKPOINT_DATABASE_URL: database, FORKPOINT_S3_BUCKET: 'fresh-bucket', FORKPOINT_S3_PREFIX: 'late/' };
    const [dirC, dirD] = [await tmp('forkpoint-node-c-'), await tmp('forkpoint-node-d-')];
    await postgres.pause();
    let nodes: ChildServer[] = [];
    try {
      const starting = Promise.all([
        ChildServer.start(dirC, token, { ...late, FORKPOINT_NODE_ID: 'node-c' }),
        ChildServer.start(dirD, token, { ...late, FORKPOINT_NODE_ID: 'node-d' }),
      ]);
      starting.catch(() => {});
      await sleep(3000); // both are waiting for the database meanwhile, not exiting
      await postgres.resume();
      nodes = await starting;
      for (const n of nodes) {
        expect((await n.api('GET', '/readyz')).status).toBe(200);
        expect((await n.api('GET', '/instances')).status).toBe(200);
      }
    } finally {
      await postgres.resume().catch(() => {});
      for (const n of nodes) await n.stop();
    }
  });
});
