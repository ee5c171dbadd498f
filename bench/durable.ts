/**
 * Issue 14: what making a checkpoint durable costs. A sandbox with 100 MB on its disk, a 1 MB
 * change between checkpoints: each durable copy uploads only the new layer and the memory
 * image. Next to it, in the same run: the local checkpoint (ready, before any upload).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import S3rver from 's3rver';
import { benchServer, stats, table } from './lib.js';

const N = Number(process.env.BENCH_N ?? 8);
const dir = await mkdtemp(join(tmpdir(), 'forkpoint-bench-s3-'));
const s3 = new S3rver({ address: '127.0.0.1', port: 0, directory: dir, silent: true, configureBuckets: [{ name: 'bench', configs: [] }] });
const { port } = (await s3.run()) as { port: number };
const s = await benchServer({ config: { s3Endpoint: `http://127.0.0.1:${port}`, s3Bucket: 'bench', s3AccessKeyId: 'S3RVER', s3SecretAccessKey: 'S3RVER' } });

async function checkpoint(id: string): Promise<{ readyMs: number; durableMs: number; bytes: number }> {
  const t = performance.now();
  const c = (await s.api('POST', `/instances/${id}/checkpoints?wait=true`, {})).body as { id: string; status: string };
  if (c.status !== 'ready') throw new Error(JSON.stringify(c));
  const readyMs = performance.now() - t;
  for (let i = 0; i < 6000; i++) {
    const v = (await s.api('GET', `/instances/${id}/checkpoints/${c.id}`)).body as { durable: boolean; uploaded_bytes: number };
    if (v.durable) return { readyMs, durableMs: performance.now() - t, bytes: v.uploaded_bytes };
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error('never durable');
}

try {
  const inst = (await s.api('POST', '/instances', { limits: { memory_mb: 512 } })).body as { id: string };
  await s.api('POST', `/instances/${inst.id}/exec`, { command: 'head -c 100000000 /dev/urandom > /root/big' });
  const first = await checkpoint(inst.id);
  const ready: number[] = [];
  const upload: number[] = [];
  const bytes: number[] = [];
  for (let i = 0; i < N; i++) {
    await s.api('POST', `/instances/${inst.id}/exec`, { command: `head -c 1000000 /dev/urandom > /root/change-${i}` });
    const r = await checkpoint(inst.id);
    ready.push(r.readyMs);
    upload.push(r.durableMs - r.readyMs);
    bytes.push(r.bytes / 1e6);
  }
  table('durable checkpoints (issue 14): 100 MB disk, then 1 MB changes; s3rver on loopback', [
    { name: 'first checkpoint: upload after ready', stats: stats([first.durableMs - first.readyMs]) },
    { name: 'first checkpoint: MB uploaded', stats: stats([first.bytes / 1e6]), unit: 'MB' },
    { name: '1 MB change: upload after ready', stats: stats(upload) },
    { name: '1 MB change: MB uploaded (layer + memory)', stats: stats(bytes), unit: 'MB', target: '≈ 1 + memory' },
    { name: '  baseline: the checkpoint itself (ready)', stats: stats(ready) },
  ]);
  await s.api('DELETE', `/instances/${inst.id}`);
} finally {
  await s.close();
  await s3.close();
  await rm(dir, { recursive: true, force: true });
}
