/**
 * Issue 14: forks across nodes. Two forkpoint nodes (separate processes and data directories)
 * share a PostgreSQL (a throwaway cluster) and an object store (s3rver), all on this machine. A
 * running instance on node A is checkpointed (with memory) after a 1 MB change, N times; each
 * checkpoint is forked
 *   - on A, where its data is (the baseline, measured in the same run),
 *   - on B, cold: B lacks the checkpoint's new layer and memory image and fetches them from the
 *     object store (its older layers came with earlier forks),
 *   - on B again, warm: all of it is on B's disk now.
 * And once, the first fork on B: nothing of the instance on B yet.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import S3rver from 's3rver';
import { ChildServer } from '../test/helpers/child-server.js';
import { TestPostgres } from '../test/helpers/postgres.js';
import { stats, table } from './lib.js';

const N = Number(process.env.BENCH_N ?? 6);
const dirs: string[] = [];
const tmp = async (p: string) => {
  const d = await mkdtemp(join(tmpdir(), p));
  dirs.push(d);
  return d;
};

const postgres = await TestPostgres.start();
const s3 = new S3rver({ address: '127.0.0.1', port: 0, directory: await tmp('forkpoint-bench-s3-'), silent: true });
const { port } = (await s3.run()) as { port: number };
const env = {
  FORKPOINT_DATABASE_URL: await postgres.database('bench'),
  FORKPOINT_S3_ENDPOINT: `http://127.0.0.1:${port}`,
  FORKPOINT_S3_BUCKET: 'bench',
  FORKPOINT_S3_ACCESS_KEY_ID: 'S3RVER',
  FORKPOINT_S3_SECRET_ACCESS_KEY: 'S3RVER',
  FORKPOINT_MAX_CHECKPOINTS: '1000',
};
const a = await ChildServer.start(await tmp('forkpoint-bench-a-'), undefined, { ...env, FORKPOINT_NODE_ID: 'bench-a' });
const b = await ChildServer.start(await tmp('forkpoint-bench-b-'), a.token, { ...env, FORKPOINT_NODE_ID: 'bench-b' });

async function durableCheckpoint(node: ChildServer, id: string): Promise<string> {
  const c = (await node.api('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true })).body as { id: string; status: string };
  if (c.status !== 'ready') throw new Error(JSON.stringify(c));
  for (let i = 0; i < 6000; i++) {
    if ((await node.api('GET', `/instances/${id}/checkpoints/${c.id}`)).body.durable) return c.id;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error('never durable');
}

async function fork(node: ChildServer, id: string, checkpoint: string): Promise<number> {
  const t = performance.now();
  const r = await node.api('POST', `/instances/${id}/fork`, { checkpoint_id: checkpoint });
  const ms = performance.now() - t;
  if (r.status !== 201) throw new Error(`fork on ${node.url}: ${r.status} ${JSON.stringify(r.body)}`);
  await node.api('DELETE', `/instances/${r.body.id}`);
  return ms;
}

try {
  const inst = (await a.api('POST', '/instances', {})).body as { id: string };
  await a.api('POST', `/instances/${inst.id}/exec`, { command: '(while true; do date +%s%N > /tmp/now; sleep 0.1; done) >/dev/null 2>&1 &' });
  const same: number[] = [];
  const cold: number[] = [];
  const warm: number[] = [];
  let first = 0;
  for (let i = 0; i < N; i++) {
    await a.api('POST', `/instances/${inst.id}/exec`, { command: `head -c 1000000 /dev/urandom > /root/change-${i}` });
    const c = await durableCheckpoint(a, inst.id);
    same.push(await fork(a, inst.id, c));
    const ms = await fork(b, inst.id, c);
    if (i === 0) first = ms;
    else cold.push(ms);
    warm.push(await fork(b, inst.id, c));
  }
  table('forks across nodes (issue 14): two nodes, PostgreSQL and s3rver on this machine; 1 MB change per checkpoint', [
    { name: 'fork on another node, nothing of it there yet', stats: stats([first]) },
    { name: 'fork on another node, cold (new layer + memory fetched)', stats: stats(cold) },
    { name: 'fork on another node, warm (all on its disk)', stats: stats(warm) },
    { name: '  baseline: fork on the same node', stats: stats(same) },
  ]);
  await a.api('DELETE', `/instances/${inst.id}`);
} finally {
  // Whatever a failure left: deleted through the API (each call finds the instance's node).
  const left = ((await a.api('GET', '/instances?limit=100').catch(() => ({ body: { items: [] } }))).body.items ?? []) as { id: string }[];
  for (const i of left) await a.api('DELETE', `/instances/${i.id}`).catch(() => {});
  await b.stop();
  await a.stop();
  await s3.close();
  await postgres.stop();
  for (const d of dirs) await rm(d, { recursive: true, force: true });
}
