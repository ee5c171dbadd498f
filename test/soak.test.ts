import { afterAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';
import { until } from './helpers/wait.js';

// A bounded soak of the transitions where hosted sandboxes lose state: random checkpoints,
// rollbacks, forks, hibernations and wakes (asked for and by idle timeout) and server restarts,
// on instances with a running counter and a tree of files, every one checked after every step.
// FORKPOINT_SOAK_STEPS runs it longer; FORKPOINT_SOAK_SEED replays one run.
const STEPS = Number(process.env.FORKPOINT_SOAK_STEPS ?? 300);
const SEED = Number(process.env.FORKPOINT_SOAK_SEED ?? Date.now() % 100_000);
const MAX_INSTANCES = 4;

/** A small PRNG (mulberry32): the same seed, the same run. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Tracked {
  id: string;
  /** The files it must have under /data, name → content. */
  files: Map<string, string>;
  /** Its checkpoints with the files each holds. */
  checkpoints: { id: string; files: Map<string, string> }[];
}

const COUNTER = 'n=$(cat /tmp/c 2>/dev/null || echo 0); while true; do n=$((n+1)); echo $n > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done';

let s: TestServer;
let dataDir: string | undefined;
afterAll(async () => s?.close());

describe(`soak: ${STEPS} random transitions (seed ${SEED})`, () => {
  it('after every checkpoint, rollback, fork, hibernate, wake, idle hibernation and restart, every instance has its files and its counter runs', async () => {
    const random = prng(SEED);
    const pick = <T>(xs: T[]): T => xs[Math.floor(random() * xs.length)]!;
    s = await startServer();
    dataDir = s.dataDir;
    const sh = async (id: string, command: string) => {
      const r = await s.api('POST', `/instances/${id}/exec`, { command, timeout_ms: 15_000 });
      expect(r.status, `${command}: ${JSON.stringify(r.body)}`).toBe(200);
      return r.body as { exit_code: number; stdout: string };
    };
    const counter = async (id: string) => Number((await sh(id, 'cat /tmp/c')).stdout.trim());
    const check = async (t: Tracked, what: string) => {
      const listing = (await sh(t.id, 'for f in /data/*; do [ -f "$f" ] && echo "$f $(cat "$f")"; done')).stdout;
      const want = [...t.files].map(([k, v]) => `/data/${k} ${v}`).sort().join('\n');
      expect(listing.trim().split('\n').filter(Boolean).sort().join('\n'), `${what}: files of ${t.id}`).toBe(want);
      const c = await counter(t.id);
      await until(`${what}: the counter of ${t.id} moving`, async () => (await counter(t.id)) > c, 10_000);
    };
    const create = async (): Promise<Tracked> => {
      const inst = await s.instance();
      await sh(inst.id, 'mkdir -p /data');
      await s.api('POST', `/instances/${inst.id}/processes`, { command: COUNTER });
      return { id: inst.id, files: new Map(), checkpoints: [] };
    };
    const tracked: Tracked[] = [await create()];
    let written = 0;
    const done: string[] = [];

    const actions: Record<string, (t: Tracked) => Promise<void>> = {
      write: async (t) => {
        const name = `f${++written}`;
        await sh(t.id, `echo ${written} > /data/${name}`);
        t.files.set(name, String(written));
      },
      remove: async (t) => {
        if (!t.files.size) return;
        const name = pick([...t.files.keys()]);
        await sh(t.id, `rm /data/${name}`);
        t.files.delete(name);
      },
      checkpoint: async (t) => {
        const c = await s.api('POST', `/instances/${t.id}/checkpoints?wait=true`, { retention: { mode: 'delete_oldest' } });
        expect([c.status, c.body.status], JSON.stringify(c.body)).toEqual([200, 'ready']);
        t.checkpoints.push({ id: c.body.id, files: new Map(t.files) });
        const kept = new Set(((await s.api('GET', `/instances/${t.id}/checkpoints?limit=100`)).body.items as { id: string }[]).map((x) => x.id));
        t.checkpoints = t.checkpoints.filter((x) => kept.has(x.id));
      },
      rollback: async (t) => {
        if (!t.checkpoints.length) return;
        const c = pick(t.checkpoints);
        const r = await s.api('POST', `/instances/${t.id}/rollback`, { checkpoint_id: c.id });
        expect(r.status, JSON.stringify(r.body)).toBe(200);
        t.files = new Map(c.files);
      },
      fork: async (t) => {
        if (!t.checkpoints.length || tracked.length >= MAX_INSTANCES) return;
        const c = pick(t.checkpoints);
        const r = await s.api('POST', `/instances/${t.id}/fork`, { checkpoint_id: c.id });
        expect(r.status, JSON.stringify(r.body)).toBe(201);
        const f: Tracked = { id: r.body.id, files: new Map(c.files), checkpoints: [] };
        tracked.push(f);
        await check(f, 'fork');
      },
      hibernate: async (t) => {
        const before = await counter(t.id);
        expect((await s.api('POST', `/instances/${t.id}/hibernate`)).status).toBe(200);
        expect((await s.api('GET', `/instances/${t.id}`)).body.status).toBe('hibernated');
        expect((await s.api('POST', `/instances/${t.id}/wake`)).status).toBe(200);
        expect(await counter(t.id)).toBeGreaterThanOrEqual(before);
      },
      idle: async (t) => {
        expect((await s.api('PATCH', `/instances/${t.id}`, { idle_timeout_s: 1 })).status).toBe(200);
        await until(`${t.id} hibernating by itself`, async () => (await s.api('GET', `/instances/${t.id}`)).body.status === 'hibernated', 15_000);
        expect((await s.api('PATCH', `/instances/${t.id}`, { idle_timeout_s: 0 })).status).toBe(200);
        // The next call wakes it.
      },
      delete: async (t) => {
        if (tracked.length < 2) return;
        expect((await s.api('DELETE', `/instances/${t.id}`)).status).toBe(204);
        tracked.splice(tracked.indexOf(t), 1);
      },
      restart: async () => {
        await s.close({ keepSandboxes: true });
        s = await startServer({}, dataDir);
        for (const x of tracked) expect((await s.api('GET', `/instances/${x.id}`)).body.status, x.id).toBe('running');
      },
    };
    const weights: [string, number][] = [['write', 4], ['remove', 2], ['checkpoint', 3], ['rollback', 3], ['fork', 2], ['hibernate', 2], ['idle', 1], ['delete', 1], ['restart', 1]];
    const bag = weights.flatMap(([name, w]) => Array<string>(w).fill(name));
    for (let step = 0; step < STEPS; step++) {
      const action = pick(bag);
      const t = pick(tracked);
      done.push(`${step}:${action}:${t.id}`);
      try {
        await actions[action]!(t);
        for (const x of action === 'restart' ? tracked : tracked.includes(t) ? [t] : []) await check(x, `step ${step} (${action})`);
      } catch (err) {
        throw new Error(`soak seed ${SEED} failed at step ${step} (${action} on ${t.id}); steps: ${done.slice(-12).join(' ')}`, { cause: err });
      }
    }
    for (const x of tracked) await check(x, 'the end');
    for (const x of tracked) await s.api('DELETE', `/instances/${x.id}`);
  }, 600_000);
});
