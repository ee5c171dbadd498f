import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import type { Failpoint } from '../src/lib/failpoints.js';
import { ChildServer } from './helpers/child-server.js';
import { eventually, overlaysUnder } from './helpers/server.js';

// kill -9 of the server at each phase of a checkpoint (freeze, dump, rename, thaw), a rollback,
// a fork, a hibernation and a build, made exact by failpoints (src/lib/failpoints.ts): the
// server armed with one dies there as by SIGKILL. After the restart every instance runs (or
// hibernates, to wake on the next call) with its counter going on, a rolled-back one from the
// checkpoint's state; a build leaves nothing behind and builds again.
let dataDir: string;
let server: ChildServer | undefined;

afterEach(async () => {
  try {
    if (!server || server.proc.exitCode !== null || server.proc.signalCode !== null) server = await ChildServer.start(dataDir);
    for (const i of (await server.api('GET', '/instances?limit=500')).body.items) await server.api('DELETE', `/instances/${i.id}`);
    await server.stop();
    server = undefined;
    expect(await overlaysUnder(dataDir)).toEqual([]);
  } finally {
    // Even when a server could not be started to clean up: what is not mounted goes (a mount
    // left is the leftovers check's to report, and its files are not removed through it).
    if ((await overlaysUnder(dataDir)).length === 0) await rm(dataDir, { recursive: true, force: true });
  }
});

const COUNTER = 'n=0; while true; do n=$((n+1)); echo $n > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done';
const read = async (s: ChildServer, id: string, command: string) => {
  const r = await s.api('POST', `/instances/${id}/exec`, { command });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return (r.body.stdout as string).trim();
};
const counter = async (s: ChildServer, id: string) => Number(await read(s, id, 'cat /tmp/c 2>/dev/null || echo -1'));
const counting = async (s: ChildServer, id: string) => {
  const first = await counter(s, id);
  await eventually(async () => (await counter(s, id)) > first);
  return first;
};

/** How many counter loops run in the instance's sandbox, read from the host: its cgroup's
 * processes (a sandbox left over beside the one the store knows would count twice). */
async function countersRunning(s: ChildServer, id: string): Promise<number> {
  const node = (await s.api('GET', `/instances/${id}`)).body.node as string;
  const group = existsSync('/sys/fs/cgroup/cgroup.controllers') ? `/sys/fs/cgroup/forkpoint/${node}/${id}` : `/sys/fs/cgroup/pids/forkpoint/${node}/${id}`;
  const pids = readFileSync(join(group, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean);
  // Each process's parent is read before its command line: the loop forks `mv` and `sleep`, and
  // until it execs, a child reads as the loop too (seen under load). Read apart, the child could
  // be gone by the time its parent was asked, and count as a second loop.
  const loops = new Map<string, string>(); // pid -> parent pid
  for (const p of pids) {
    try {
      const parent = readFileSync(`/proc/${p}/stat`, 'utf8').replace(/^.*\) /, '').split(' ')[1]!;
      if (readFileSync(`/proc/${p}/cmdline`, 'utf8').includes('n=0; while true')) loops.set(p, parent);
    } catch {
      // gone meanwhile
    }
  }
  return [...loops].filter(([, parent]) => !loops.has(parent)).length;
}

/** The CPU weight of the instance's group, as the host has it. */
async function cpuWeight(s: ChildServer, id: string): Promise<string> {
  const node = (await s.api('GET', `/instances/${id}`)).body.node as string;
  const v2 = existsSync('/sys/fs/cgroup/cgroup.controllers');
  return readFileSync(v2 ? `/sys/fs/cgroup/forkpoint/${node}/${id}/cpu.weight` : `/sys/fs/cgroup/cpu/forkpoint/${node}/${id}/cpu.shares`, 'utf8').trim();
}

/** A server armed at `point`, an instance on it with a counter (and what `prepare` adds). */
async function armed(point: Failpoint) {
  dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-phase-'));
  server = await ChildServer.start(dataDir, undefined, { FORKPOINT_FAILPOINTS: point });
  const inst = (await server.api('POST', '/instances', { name: 'phased' })).body as { id: string };
  await server.api('POST', `/instances/${inst.id}/processes`, { command: COUNTER });
  await counting(server, inst.id);
  return inst.id;
}

/** Makes the call that reaches the failpoint, and waits for the server to die of it (a call
 * that answers instead, having missed the failpoint, fails the test with its answer). */
async function dieDuring(call: () => Promise<unknown>): Promise<void> {
  const s = server!;
  const exited = new Promise<NodeJS.Signals | null>((r) => s.proc.once('exit', (_code, signal) => r(signal)));
  const answer = await call().catch(() => undefined); // the connection goes down with the server
  let timer: NodeJS.Timeout | undefined;
  const missed = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the server did not die at the failpoint; the call answered ${JSON.stringify(answer)}`)), 20_000);
  });
  try {
    expect(await Promise.race([exited, missed])).toBe('SIGKILL'); // it died at the failpoint, not of anything else
  } finally {
    clearTimeout(timer);
  }
}

/** The server's Prometheus text (its token is the operator's). */
const metricsOf = async (s: ChildServer) => (await request(`${s.url}/metrics`, { headers: { authorization: `Bearer ${s.token}` } })).body.text();

async function restart(): Promise<ChildServer> {
  const token = server!.token;
  server = await ChildServer.start(dataDir, token);
  return server;
}

describe('kill -9 in a checkpoint\'s freeze (its upper copied, its memory dumped with the processes left running): the sandbox thaws, the copy and the dump go', () => {
  // checkpoint.staged: thawed already, the memory image still in memory (not on disk).
  for (const [point, memory] of [['checkpoint.frozen', false], ['checkpoint.copied', false], ['checkpoint.frozen', true], ['checkpoint.copied', true], ['checkpoint.staged', true]] as const) {
    it(`${point}, ${memory ? 'memory' : 'files only'}`, async () => {
      const id = await armed(point);
      await read(server!, id, 'echo kept > /root/f; echo doomed > /root/g');
      const started = await read(server!, id, "cut -d' ' -f22 /proc/1/stat"); // a restore would change it
      const before = await counter(server!, id);
      await dieDuring(() => server!.api('POST', `/instances/${id}/checkpoints?wait=true`, { memory }));
      const s = await restart();
      expect((await s.api('GET', `/instances/${id}`)).body.status).toBe('running');
      expect(await read(s, id, "cut -d' ' -f22 /proc/1/stat")).toBe(started); // the same processes, thawed
      expect(await counting(s, id)).toBeGreaterThanOrEqual(before);
      expect(await countersRunning(s, id)).toBe(1);
      const list = (await s.api('GET', `/instances/${id}/checkpoints`)).body.items as { status: string }[];
      expect(list.map((c) => c.status)).toEqual(['failed']);
      // The copy is nobody's: not under the instance's upper (a file deleted now stays deleted
      // through a remount) and not on the disk.
      const layers = (await readdir(join(dataDir, 'layers'))).filter((l) => l.startsWith('lyr_'));
      expect(layers).toEqual([]);
      expect(await readdir(join(dataDir, 'checkpoints'))).toEqual([]); // nor the memory image
      const node = (await s.api('GET', `/instances/${id}`)).body.node as string;
      expect(await readdir(`/dev/shm/forkpoint-dumps-${node}`)).toEqual([]); // nor its staged copy
      await read(s, id, 'rm /root/g');
      const now = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, {});
      expect(now.body.status, JSON.stringify(now.body)).toBe('ready');
      expect((await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: now.body.id })).status).toBe(200);
      expect(await read(s, id, 'cat /root/f; test -e /root/g || echo gone')).toBe('kept\ngone');
    });
  }
});

describe('kill -9 at each phase of a checkpoint whose upper is frozen by rename (dump, rename, restore): the sandbox runs on, its counter goes on', () => {
  for (const point of ['checkpoint.paused', 'checkpoint.dumped', 'checkpoint.renamed', 'checkpoint.restored'] as const) {
    it(point, async () => {
      const id = await armed(point);
      // More than a freeze copies (upper-copy.ts, COPY_LIMITS): the upper is frozen by rename.
      await read(server!, id, 'echo kept > /root/f; head -c 41943040 /dev/zero > /root/big');
      const before = await counter(server!, id);
      let checkpointId = '';
      await dieDuring(async () => {
        const r = await server!.api('POST', `/instances/${id}/checkpoints`, {});
        checkpointId = r.body.id;
        await server!.api('GET', `/instances/${id}/checkpoints/${checkpointId}?wait=true`);
      });
      const s = await restart();
      expect((await s.api('GET', `/instances/${id}`)).body.status).toBe('running');
      expect(await counting(s, id)).toBeGreaterThanOrEqual(before); // the same processes, not a fresh boot
      expect(await countersRunning(s, id)).toBe(1); // and only once
      expect(await overlaysUnder(dataDir)).toHaveLength(1); // one disk mounted, its own
      expect(await cpuWeight(s, id)).toBe(existsSync('/sys/fs/cgroup/cgroup.controllers') ? '100' : '1024'); // not left weighed up for the pause
      expect(await read(s, id, 'cat /root/f')).toBe('kept');
      const list = (await s.api('GET', `/instances/${id}/checkpoints`)).body.items as { id: string; status: string; error: string | null }[];
      for (const c of list) expect(c.status, JSON.stringify(c)).not.toBe('processing');
      // Whatever the crash left, a checkpoint now and a rollback to it work.
      const now = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, {});
      expect(now.body.status, JSON.stringify(now.body)).toBe('ready');
      expect((await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: now.body.id })).status).toBe(200);
      expect(await read(s, id, 'cat /root/f')).toBe('kept');
      await counting(s, id);
    });
  }
});

describe('kill -9 during a rollback: after the restart it runs from the checkpoint', () => {
  for (const point of ['rollback.killed', 'rollback.restored'] as const) {
    it(point, async () => {
      const id = await armed(point);
      const ck = (await server!.api('POST', `/instances/${id}/checkpoints?wait=true`, {})).body;
      expect(ck.status).toBe('ready');
      await read(server!, id, 'echo after > /root/marker');
      await dieDuring(() => server!.api('POST', `/instances/${id}/rollback`, { checkpoint_id: ck.id }));
      const s = await restart();
      expect((await s.api('GET', `/instances/${id}`)).body.status).toBe('running');
      expect(await read(s, id, 'cat /root/marker 2>/dev/null || echo none')).toBe('none'); // the checkpoint's files
      await counting(s, id); // its processes
      expect(await countersRunning(s, id)).toBe(1);
      expect(await overlaysUnder(dataDir)).toHaveLength(1);
      expect((await s.api('GET', `/instances/${id}`)).body.head_checkpoint_id).toBe(ck.id);
    });
  }
});

describe('kill -9 during a warm rollback (its standby swapped in): after the restart it runs from the checkpoint, once, and nothing of the standby or the old sandbox is left', () => {
  for (const point of ['rollback.routed', 'rollback.swapped'] as const) {
    it(point, async () => {
      dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-phase-'));
      server = await ChildServer.start(dataDir, undefined, { FORKPOINT_FAILPOINTS: point, FORKPOINT_WARM_FORKS: '2' });
      const id = (await server.api('POST', '/instances', { name: 'phased' })).body.id as string;
      await server.api('POST', `/instances/${id}/processes`, { command: COUNTER });
      await counting(server, id);
      const ck = (await server.api('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true })).body;
      expect(ck.status).toBe('ready');
      // The first rollback restores and leaves a standby of the checkpoint, held frozen.
      expect((await server.api('POST', `/instances/${id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
      const node = (await server.api('GET', `/instances/${id}`)).body.node as string;
      const standbyState = `/sys/fs/cgroup/freezer/forkpoint/${node}/${id}~rollback/freezer.state`;
      await eventually(async () => existsSync(standbyState) && readFileSync(standbyState, 'utf8').trim() === 'FROZEN', 20_000);
      // Held in the pool too, not only frozen: a rollback takes only a standby the pool holds (on a
      // loaded machine the one came a while after the other, and the rollback was cold).
      await eventually(async () => /^forkpoint_warm_standbys\{kind="rollback"\} 1$/m.test(await metricsOf(server!)), 20_000);
      await read(server, id, 'echo after > /root/marker');
      await dieDuring(() => server!.api('POST', `/instances/${id}/rollback`, { checkpoint_id: ck.id }));
      const s = await restart();
      expect((await s.api('GET', `/instances/${id}`)).body.status).toBe('running');
      expect(await read(s, id, 'cat /root/marker 2>/dev/null || echo none')).toBe('none');
      await counting(s, id);
      expect(await countersRunning(s, id)).toBe(1);
      expect(await overlaysUnder(dataDir)).toHaveLength(1);
      expect((await readdir(join(dataDir, 'instances'))).filter((d) => d.includes('~'))).toEqual([]);
      expect((await readdir(`/sys/fs/cgroup/freezer/forkpoint/${node}`)).filter((g) => g.includes('~'))).toEqual([]);
      // Its address reaches it: a server in it answers through a forward.
      await s.api('POST', `/instances/${id}/processes`, { command: 'mkdir -p /srv && echo here > /srv/index.html && httpd -f -p 8080 -h /srv' });
      const forward = (await s.api('POST', `/instances/${id}/port-forwards`, { guest_port: 8080 })).body.port_forward;
      expect(await eventually(async () => (await fetch(`http://127.0.0.1:${forward.host_port}/`).then((r) => r.text()).catch(() => undefined)) === 'here\n')).toBe(true);
    });
  }
});

describe('kill -9 during a fork and a hibernation', () => {
  it('fork.restored: the fork runs after the restart, from the checkpoint; its source runs on', async () => {
    const id = await armed('fork.restored');
    const before = await counter(server!, id);
    const ck = (await server!.api('POST', `/instances/${id}/checkpoints?wait=true`, {})).body;
    await dieDuring(() => server!.api('POST', `/instances/${id}/fork`, { checkpoint_id: ck.id, name: 'the-fork' }));
    const s = await restart();
    const fork = ((await s.api('GET', '/instances')).body.items as { id: string; name: string; status: string }[]).find((i) => i.name === 'the-fork');
    expect(fork?.status).toBe('running');
    expect(await counting(s, fork!.id)).toBeGreaterThanOrEqual(before); // the checkpoint's counter, going on
    await counting(s, id);
    expect([await countersRunning(s, id), await countersRunning(s, fork!.id)]).toEqual([1, 1]);
    expect(await overlaysUnder(dataDir)).toHaveLength(2);
  });

  for (const point of ['hibernate.dumped', 'hibernate.renamed'] as const) {
    it(`${point}: the instance wakes with its counter`, async () => {
      const id = await armed(point);
      await read(server!, id, 'echo kept > /root/f');
      const before = await counter(server!, id);
      await dieDuring(() => server!.api('POST', `/instances/${id}/hibernate`));
      const s = await restart();
      expect(['running', 'hibernated']).toContain((await s.api('GET', `/instances/${id}`)).body.status);
      expect(await counting(s, id)).toBeGreaterThanOrEqual(before); // an exec wakes it
      expect(await read(s, id, 'cat /root/f')).toBe('kept');
      expect((await s.api('GET', `/instances/${id}`)).body.status).toBe('running');
      expect(await countersRunning(s, id)).toBe(1);
      expect(await overlaysUnder(dataDir)).toHaveLength(1);
    });
  }
});

describe('kill -9 during a build', () => {
  it('build.step-ran: the build\'s sandbox is gone after the restart, and the same build then succeeds', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-phase-'));
    server = await ChildServer.start(dataDir, undefined, { FORKPOINT_FAILPOINTS: 'build.step-ran' });
    const dockerfile = 'FROM default\nRUN echo built > /built\n';
    await dieDuring(() => server!.api('POST', '/images', { name: 'phased', dockerfile }));
    const s = await restart();
    expect(await overlaysUnder(dataDir)).toEqual([]); // no build sandbox left mounted
    const built = await s.api('POST', '/images', { name: 'phased', dockerfile });
    expect(built.status, JSON.stringify(built.body)).toBeLessThan(300);
    const inst = (await s.api('POST', '/instances', { image: 'phased' })).body;
    expect(await read(s, inst.id, 'cat /built')).toBe('built');
  });
});

describe('a launch that fails (the agent\'s connection, a rollback\'s restored sandbox not coming up)', () => {
  // The server's own uid pool, high above the one every other test's servers allocate from the
  // bottom of: a process with a host uid in it is this server's sandboxes', read from /proc.
  const POOL = { start: 2 ** 31 - 16 * 65536, ranges: 16 };
  const poolEnv = { FORKPOINT_UID_RANGE_START: String(POOL.start), FORKPOINT_UID_RANGES: String(POOL.ranges) };
  /** The host pids of live processes whose real uid is in the pool, by their range's base. */
  function poolProcesses(): Map<number, number[]> {
    const found = new Map<number, number[]>();
    for (const pid of readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
      let status: string;
      try {
        status = readFileSync(`/proc/${pid}/status`, 'utf8');
      } catch {
        continue; // gone meanwhile
      }
      const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
      if (/^State:\s+Z/m.test(status) || uid < POOL.start || uid >= POOL.start + POOL.ranges * 65536) continue;
      const base = uid - (uid % 65536);
      found.set(base, [...(found.get(base) ?? []), Number(pid)]);
    }
    return found;
  }

  it('create, fork and rollback answer their error and leave no process of theirs, after the answer, a DELETE or a restart', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-phase-'));
    server = await ChildServer.start(dataDir, undefined, poolEnv);
    const src = (await server.api('POST', '/instances', { name: 'source' })).body as { id: string };
    await server.api('POST', `/instances/${src.id}/processes`, { command: COUNTER });
    await counting(server, src.id);
    const ck = (await server.api('POST', `/instances/${src.id}/checkpoints?wait=true`, {})).body as { id: string; status: string };
    expect(ck.status).toBe('ready');
    const before = poolProcesses();
    expect(before.size).toBe(1); // the source's, in a range of the pool
    const [srcRange] = [...before.keys()];

    const token = server.token;
    await server.stop();
    server = await ChildServer.start(dataDir, token, { ...poolEnv, FORKPOINT_FAULTS: 'launch.attach,rollback.launched' });
    // Re-adopted after the restart (no launch): it counts on.
    await counting(server, src.id);

    const created = await server.api('POST', '/instances', { name: 'never' });
    expect([created.status, created.body.error?.code], JSON.stringify(created.body)).toEqual([503, 'UNAVAILABLE']);
    expect([...poolProcesses().keys()]).toEqual([srcRange]);
    const forked = await server.api('POST', `/instances/${src.id}/fork`, { checkpoint_id: ck.id, name: 'never-fork' });
    expect([forked.status, forked.body.error?.code], JSON.stringify(forked.body)).toEqual([503, 'UNAVAILABLE']);
    expect([...poolProcesses().keys()]).toEqual([srcRange]);
    // The failed create stays, in error with its reason, as a failed `docker run` leaves its
    // container; the failed fork is gone (all or nothing).
    const listed = (await server.api('GET', '/instances')).body.items as { id: string; name: string; status: string; error: string | null }[];
    expect(listed.map((i) => [i.name, i.status]).sort()).toEqual([['never', 'error'], ['source', 'running']]);
    expect(listed.find((i) => i.name === 'never')!.error).toMatch(/agent did not answer/);
    expect((await server.api('DELETE', `/instances/${listed.find((i) => i.name === 'never')!.id}`)).status).toBe(204);

    // The rollback killed the source's processes and restored the checkpoint's, which did not
    // come up: none of either runs on.
    const rolled = await server.api('POST', `/instances/${src.id}/rollback`, { checkpoint_id: ck.id });
    expect(rolled.status, JSON.stringify(rolled.body)).toBe(503);
    expect(poolProcesses()).toEqual(new Map());
    expect((await server.api('DELETE', `/instances/${src.id}`)).status).toBe(204);
    await server.stop();
    server = await ChildServer.start(dataDir, token, poolEnv);
    expect((await server.api('GET', '/instances')).body.items).toEqual([]);
    expect(poolProcesses()).toEqual(new Map());
    expect(await overlaysUnder(dataDir)).toEqual([]);
  });
});
