import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import S3rver from 's3rver';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { testSubnet } from './helpers/subnets.js';
import { TestPostgres } from './helpers/postgres.js';
import { ensureNodeImage, NODE_IMAGE, podman, podmanLimits as limits, removeNodeImages, TAG } from './helpers/node-image.js';
import { until } from './helpers/wait.js';

// The node image (deploy/Containerfile) run the way deploy/kubernetes/base/daemonset.yaml runs
// it, with the container engine Debian ships (podman, with Debian's runc: this host's cgroups
// are the v1/v2 hybrid crun refuses): privileged, the host's PID and network namespaces, the
// data directory a host path with shared propagation, the machine's /dev and cgroups. Two node
// containers share a PostgreSQL and an S3-API server on loopback. The point: a sandbox outlives
// its node's container, restarted or replaced, and the new server answers for it again.
//
// The image: helpers/node-image.ts (built while the other files run, by test/node-image.test.ts).

/** What the DaemonSet asks of the container runtime for the node's container, as podman flags:
 * read from the manifest, so that the test fails when the manifest would lose sandboxes. The
 * node's own host paths (its data and run directories) are the test's, two nodes sharing one
 * machine; every other host path is the machine's. Inside, the paths are the manifest's. */
function daemonSetFlags(hostPaths: Record<string, string>): string[] {
  type Mount = { name: string; mountPath: string; readOnly?: boolean; mountPropagation?: string };
  const spec = parse(readFileSync(new URL('../deploy/kubernetes/base/daemonset.yaml', import.meta.url), 'utf8')).spec.template.spec as {
    hostNetwork?: boolean; hostPID?: boolean;
    containers: { name: string; securityContext?: { privileged?: boolean }; volumeMounts: Mount[] }[];
    volumes: { name: string; hostPath?: { path: string } }[];
  };
  const node = spec.containers.find((c) => c.name === 'forkpoint')!;
  const flags: string[] = [];
  if (node.securityContext?.privileged) flags.push('--privileged');
  if (spec.hostPID) flags.push('--pid', 'host');
  if (spec.hostNetwork) flags.push('--network', 'host');
  const propagation: Record<string, string> = { Bidirectional: 'rshared', HostToContainer: 'rslave' };
  for (const m of node.volumeMounts) {
    const host = spec.volumes.find((v) => v.name === m.name)?.hostPath?.path;
    if (!host) throw new Error(`volume ${m.name} is not a host path`);
    const options = [m.readOnly ? 'ro' : 'rw', propagation[m.mountPropagation ?? ''] ?? 'rprivate'];
    flags.push('-v', `${hostPaths[host] ?? host}:${m.mountPath}:${options.join(',')}`);
  }
  return flags;
}

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });

/** One node as a container of the node image; `replace` makes a new container in its place. */
class NodeContainer {
  generation = 0;
  constructor(
    readonly id: string,
    readonly dataDir: string,
    readonly runDir: string,
    readonly port: number,
    readonly env: Record<string, string>,
    readonly pgDir: string,
  ) {}

  get name(): string {
    return `${TAG}-${this.id}-${this.generation}`;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async run(): Promise<void> {
    const env = {
      ...this.env,
      FORKPOINT_NODE_ID: this.id,
      FORKPOINT_NODE_URL: this.url,
      FORKPOINT_HOST: '127.0.0.1',
      FORKPOINT_PORT: String(this.port),
      FORKPOINT_NETWORK_CIDR: testSubnet(this.dataDir),
      FORKPOINT_LOG_LEVEL: 'warn',
    };
    await podman(
      'run', '-d', '--name', this.name,
      ...limits,
      ...daemonSetFlags({ '/var/lib/forkpoint': this.dataDir, '/run/forkpoint': this.runDir }),
      '-v', `${this.pgDir}:${this.pgDir}`,
      ...Object.entries(env).flatMap(([k, v]) => ['-e', `${k}=${v}`]),
      NODE_IMAGE, 'serve',
    );
    await until(`node ${this.id} answering`, async () => {
      const r = await request(`${this.url}/healthz`).catch(() => undefined);
      await r?.body.dump();
      return r?.statusCode === 200;
    }, 120_000).catch(async (err: Error) => {
      const logs = await podman('logs', this.name).catch(() => undefined);
      throw new Error(`${err.message}\n${logs?.stdout ?? ''}\n${logs?.stderr ?? ''}`);
    });
  }

  async restart(): Promise<void> {
    await podman('restart', '-t', '10', this.name);
    await until(`node ${this.id} answering again`, async () => {
      const r = await request(`${this.url}/healthz`).catch(() => undefined);
      await r?.body.dump();
      return r?.statusCode === 200;
    }, 120_000);
  }

  /** Stops and removes the container, then runs a new one in its place. */
  async replace(): Promise<void> {
    await this.remove();
    this.generation++;
    await this.run();
  }

  async remove(): Promise<void> {
    await podman('rm', '-f', '-t', '10', this.name).catch(() => undefined);
  }
}

let postgres: TestPostgres;
let s3: S3rver;
let token: string;
let a: NodeContainer;
let b: NodeContainer;
const dirs: string[] = [];
const shared: string[] = [];

const api = async <T = any>(node: NodeContainer, method: string, path: string, body?: unknown) => {
  const res = await request(node.url + path, {
    method: method as 'GET',
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
    headersTimeout: 60_000,
    bodyTimeout: 60_000,
  });
  const text = await res.body.text();
  return { status: res.statusCode, body: (text ? JSON.parse(text) : null) as T };
};
const exec = async (node: NodeContainer, id: string, command: string) => {
  const r = await api<{ exit_code: number; stdout: string }>(node, 'POST', `/instances/${id}/exec`, { command });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body;
};
const counter = async (node: NodeContainer, id: string) => Number((await exec(node, id, 'cat /tmp/count')).stdout.trim());
/** The host pid of the sandbox's PID 1, from its node's run state (a host path). */
const initPid = (node: NodeContainer, id: string) => Number(readFileSync(join(node.dataDir, 'instances', id, 'run', 'pid'), 'utf8'));

beforeAll(async () => {
  // Built by test/node-image.test.ts in the same run; by this file when it runs on its own.
  await ensureNodeImage();
  const tmp = async (prefix: string) => {
    const d = await mkdtemp(join(tmpdir(), prefix));
    dirs.push(d);
    return d;
  };
  postgres = await TestPostgres.start();
  s3 = new S3rver({ address: '127.0.0.1', port: 0, directory: await tmp('forkpoint-s3-'), silent: true });
  const { port } = (await s3.run()) as { port: number };
  const database = await postgres.database('nodes');
  // PostgreSQL listens on a socket in a directory of its own: the containers get that directory.
  const pgDir = new URL(database).searchParams.get('host')!;
  const env = {
    FORKPOINT_DATABASE_URL: database,
    FORKPOINT_S3_ENDPOINT: `http://127.0.0.1:${port}`,
    FORKPOINT_S3_BUCKET: 'nodes',
    FORKPOINT_S3_ACCESS_KEY_ID: 'S3RVER',
    FORKPOINT_S3_SECRET_ACCESS_KEY: 'S3RVER',
    FORKPOINT_NODE_HEARTBEAT_S: '0.5',
  };
  const node = async (id: string) => {
    const data = await tmp(`forkpoint-nc-${id}-`);
    // A host path with shared propagation, as kubelet makes a Bidirectional volume.
    await execa('mount', ['--bind', data, data]);
    shared.push(data);
    await execa('mount', ['--make-shared', data]);
    return new NodeContainer(id, data, await tmp(`forkpoint-nc-run-${id}-`), await freePort(), env, pgDir);
  };
  a = await node('node-a');
  b = await node('node-b');
  await a.run();
  token = readFileSync(join(a.dataDir, 'initial-token'), 'utf8').trim();
  await b.run();
}, 600_000);

afterAll(async () => {
  const step = async (what: () => Promise<unknown>) => {
    await what().catch((err: unknown) => process.stderr.write(`node-container test clean-up: ${String(err)}\n`));
  };
  // What the nodes run goes through their API, then the containers, then what they left.
  for (const n of [a, b]) {
    if (!n) continue;
    await step(async () => {
      const list = (await api<{ items: { id: string; node: string }[] }>(n, 'GET', '/instances?limit=100')).body.items;
      for (const i of list.filter((x) => x.node === n.id)) await api(n, 'DELETE', `/instances/${i.id}`);
    });
  }
  for (const n of [a, b]) if (n) await step(() => n.remove());
  await step(() => removeNodeImages());
  for (const d of shared.reverse()) await step(() => execa('umount', ['-l', d]));
  await step(async () => s3?.close());
  await step(async () => postgres?.stop());
  for (const d of dirs) await step(() => rm(d, { recursive: true, force: true }));
}, 180_000);

describe('the node image, run as the DaemonSet runs it', () => {
  let inst: { id: string };

  it('two node containers serve one cluster: create on A, checkpoint, fork on B', async () => {
    const made = await api<{ id: string; node: string }>(a, 'POST', '/instances', { name: 'kept' });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    expect(made.body.node).toBe('node-a');
    inst = made.body;
    await exec(a, inst.id, 'echo carried > /root/file && (i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done) >/dev/null 2>&1 &');
    await until('the counter counting', async () => (await counter(a, inst.id)) > 3, 20_000);
    const ckpt = await api<{ id: string; status: string }>(a, 'POST', `/instances/${inst.id}/checkpoints?wait=durable`, { memory: true });
    expect([ckpt.status, ckpt.body.status], JSON.stringify(ckpt.body)).toEqual([200, 'ready']);
    const fork = await api<{ id: string; node: string }>(b, 'POST', `/instances/${inst.id}/fork`, { checkpoint_id: ckpt.body.id, name: 'far' });
    expect(fork.status, JSON.stringify(fork.body)).toBe(201);
    expect(fork.body.node).toBe('node-b');
    expect((await exec(b, fork.body.id, 'cat /root/file')).stdout).toBe('carried\n');
    const first = await counter(b, fork.body.id);
    await until('the fork\'s counter going on', async () => (await counter(b, fork.body.id)) > first, 20_000);
  });

  it('a restart of A\'s container keeps its sandbox running, and the new server answers for it', async () => {
    const pid = initPid(a, inst.id);
    const before = await counter(a, inst.id);
    await a.restart();
    // The same process, not a new one restored from the checkpoint: its pid and its count.
    expect(initPid(a, inst.id)).toBe(pid);
    expect(await counter(a, inst.id)).toBeGreaterThan(before);
    expect((await api<{ status: string }>(a, 'GET', `/instances/${inst.id}`)).body.status).toBe('running');
  });

  it('a replaced container (removed, a new one run in its place) keeps A\'s sandbox too', async () => {
    const pid = initPid(a, inst.id);
    const before = await counter(a, inst.id);
    await a.replace();
    expect(initPid(a, inst.id)).toBe(pid);
    const after = await counter(a, inst.id);
    expect(after).toBeGreaterThan(before);
    await until('the counter going on under the new server', async () => (await counter(a, inst.id)) > after, 20_000);
    // Asked through B, the call reaches A's new container.
    expect((await exec(b, inst.id, 'cat /root/file')).stdout).toBe('carried\n');
  });
});
