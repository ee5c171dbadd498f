/**
 * Issue 25: forks of a large sandbox, restored lazily (their pages filled by `criu lazy-pages` on
 * the first touch and in the background: engine/lazy-pages.ts) next to restored whole (a server
 * with `lazyRestoreMb` 0), in the same run, interleaved. The source holds MIB MiB written before its
 * checkpoint (the attack kit's `memfill`, test/fixtures/attack.c); each round forks it on both
 * servers and times, over HTTP, the fork to its first exec's answer, and the fork to the answer of
 * a checksum the fork computes over every word of that memory (every page read: all of it in).
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { request } from 'undici';
import { benchServer, memoryCheckpoint, stats, table, type BenchServer } from './lib.js';

const N = Number(process.env.BENCH_N ?? 8);
const MIB = Number(process.env.BENCH_MIB ?? 512);
const KIT_SOURCE = new URL('../test/fixtures/attack.c', import.meta.url).pathname;
const work = await mkdtemp(join(process.env.FORKPOINT_BENCH_DIR ?? tmpdir(), 'forkpoint-lazy-'));
const kit = join(work, 'attack');
await execa('cc', ['-static', '-O2', '-o', kit, KIT_SOURCE]);
const lazy = await benchServer({ config: { lazyRestoreMb: '128' } });
const whole = await benchServer({ config: { lazyRestoreMb: '0' } });

async function sh(s: BenchServer, id: string, command: string): Promise<string> {
  const r = await s.api('POST', `/instances/${id}/exec`, { command, timeout_ms: 120_000 });
  if (r.status !== 200 || r.body.exit_code !== 0) throw new Error(`${command}: ${JSON.stringify(r.body)}`);
  return String(r.body.stdout).trim();
}

/** The filler's checksum of its memory, asked of it and waited for (bounded). */
async function checksum(s: BenchServer, id: string): Promise<string> {
  await sh(s, id, 'rm -f /tmp/memfill.sum; kill -USR1 $(pidof attack)');
  for (let i = 0; i < 2000; i++) {
    const sum = await sh(s, id, 'cat /tmp/memfill.sum 2>/dev/null || true');
    if (sum) return sum;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error('no checksum in time');
}

/** An instance whose filler holds MIB MiB, checkpointed; its id, checkpoint and checksum. */
async function source(s: BenchServer): Promise<{ id: string; checkpoint: string; sum: string }> {
  const id = (await s.api('POST', '/instances', { limits: { memory_mb: MIB * 2 + 512 } })).body.id as string;
  const up = await request(`${s.url}/instances/${id}/files?path=/usr/local/bin/attack`, { method: 'PUT', headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/octet-stream' }, body: await readFile(kit) });
  await up.body.dump();
  await sh(s, id, 'chmod 755 /usr/local/bin/attack');
  await s.api('POST', `/instances/${id}/processes`, { command: `exec /usr/local/bin/attack memfill ${MIB} /tmp` });
  for (let i = 0; i < 600 && (await sh(s, id, 'test -e /tmp/memfill.ready && echo y || true')) !== 'y'; i++) await new Promise((r) => setTimeout(r, 100));
  const sum = await checksum(s, id);
  return { id, checkpoint: (await memoryCheckpoint(s, id)).id, sum };
}

/** A fork to its first exec, and to its checksum of all the memory, in ms. */
async function timedFork(s: BenchServer, src: { id: string; checkpoint: string; sum: string }): Promise<{ exec: number; all: number }> {
  const t = performance.now();
  const f = await s.api('POST', `/instances/${src.id}/fork`, { checkpoint_id: src.checkpoint });
  if (f.status !== 201) throw new Error(JSON.stringify(f.body));
  await sh(s, f.body.id, 'true');
  const exec = performance.now() - t;
  const sum = await checksum(s, f.body.id);
  const all = performance.now() - t;
  if (sum !== src.sum) throw new Error(`the fork's memory differs: ${sum} against ${src.sum}`);
  await s.api('DELETE', `/instances/${f.body.id}`);
  return { exec, all };
}

try {
  const lazySource = await source(lazy);
  const wholeSource = await source(whole);
  const out = { lazyExec: [] as number[], lazyAll: [] as number[], wholeExec: [] as number[], wholeAll: [] as number[] };
  const before = lazy.engine.lazyRestoreCount;
  for (let i = -1; i < N; i++) {
    // Alternating which goes first; round -1 warms up (page cache, the restorer pools).
    const order = i % 2 === 0 ? ['lazy', 'whole'] : ['whole', 'lazy'];
    for (const which of order) {
      await new Promise((r) => setTimeout(r, 200));
      const r = which === 'lazy' ? await timedFork(lazy, lazySource) : await timedFork(whole, wholeSource);
      if (i < 0) continue;
      if (which === 'lazy') out.lazyExec.push(r.exec), out.lazyAll.push(r.all);
      else out.wholeExec.push(r.exec), out.wholeAll.push(r.all);
    }
  }
  if (lazy.engine.lazyRestoreCount - before !== N + 1) throw new Error(`${lazy.engine.lazyRestoreCount - before} of ${N + 1} forks were restored lazily`);
  table(`a fork of a sandbox holding ${MIB} MiB written before its checkpoint (user namespace), lazy next to whole (same run, interleaved)`, [
    { name: 'fork + first exec, lazy restore', stats: stats(out.lazyExec) },
    { name: '  baseline: fork + first exec, restored whole', stats: stats(out.wholeExec) },
    { name: 'fork + checksum of all its memory, lazy restore', stats: stats(out.lazyAll) },
    { name: '  baseline: fork + checksum of all its memory, restored whole', stats: stats(out.wholeAll) },
  ]);
} finally {
  await lazy.close();
  await whole.close();
  await rm(work, { recursive: true, force: true });
}
