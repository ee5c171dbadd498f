import { existsSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ChildServer } from './helpers/child-server.js';
import { startServer, type TestServer } from './helpers/server.js';
import { until } from './helpers/wait.js';

/**
 * Warm forks on the real engine: the first fork of a memory checkpoint leaves a sandbox restored
 * from it and frozen; the next fork takes it. What the fork must be is what a cold one is: the
 * checkpoint's processes (a counter), a shell's state, files, its own name, address and uid
 * range; and what the standby is before it is taken: frozen, nobody's, on no list.
 */
let s: TestServer;
/** The forks' standbys (each create leaves one of its image too). */
const forkStandbys = () => s.fp.warm.held().filter((h) => h.kind === 'fork');
const imageStandbys = () => s.fp.warm.held().filter((h) => h.key === 'image:default');
beforeAll(async () => {
  s = await startServer({ warmForks: 2 }, undefined, process.env.FP_TEST_LOG ? { logFile: process.env.FP_TEST_LOG } : {});
});
afterAll(async () => {
  await s?.close();
});

const COUNTER = 'n=0; while true; do n=$((n+1)); echo $n > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done';
const sh = async (id: string, command: string, session?: string) => s.exec(id, { command, timeout_ms: 20_000, ...(session ? { session } : {}) });
const count = async (id: string) => Number((await sh(id, 'cat /tmp/c')).stdout);

/** The host's uids of every process in the sandbox's pid namespace. */
function hostUids(id: string): number[] {
  const init = s.engine.sandbox(id)!.pid;
  const ns = readlinkSync(`/proc/${init}/ns/pid`);
  const uids: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readlinkSync(`/proc/${name}/ns/pid`) !== ns) continue;
      uids.push(Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${name}/status`, 'utf8'))![1]));
    } catch {
      // gone meanwhile
    }
  }
  return uids;
}

/** The freezer state of the sandbox's PID 1's group, from the host (cgroup v1 or v2). */
function freezerState(id: string): string {
  const lines = readFileSync(`/proc/${s.engine.sandbox(id)!.pid}/cgroup`, 'utf8').split('\n');
  const v1 = lines.find((l) => l.split(':')[1]?.split(',').includes('freezer'));
  if (v1) return readFileSync(`/sys/fs/cgroup/freezer${v1.split(':')[2]}/freezer.state`, 'utf8').trim();
  const v2 = lines.find((l) => l.startsWith('0::'))!.slice(3);
  return readFileSync(`/sys/fs/cgroup${v2}/cgroup.freeze`, 'utf8').trim() === '1' ? 'FROZEN' : 'THAWED';
}

describe('warm forks', () => {
  it('the next fork of a checkpoint takes the standby the last one left: the checkpoint\'s processes, shell, files, its own name and range', async () => {
    const inst = await s.instance({ name: 'warm-source' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: COUNTER });
    await sh(inst.id, 'cd /etc && export MOOD=calm', 'main');
    await sh(inst.id, 'echo kept > /root/file');
    await until('the counter to count', async () => (await count(inst.id)) > 2, 10_000);
    const beforeCheckpoint = await count(inst.id);
    const ck = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true })).body;
    expect(ck.status).toBe('ready');
    await sh(inst.id, 'echo changed > /root/file; export MOOD=angry', 'main');

    const cold = (await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id })).body;
    await s.fp.warm.settled();
    const [standby] = forkStandbys();
    expect(standby?.key).toBe(ck.id);
    expect(standby!.id).not.toBe(cold.id);
    // Held frozen, on no list, nobody's to reach.
    expect(freezerState(standby!.id)).toBe('FROZEN');
    expect((await s.api('GET', '/instances')).body.items.map((i: { id: string }) => i.id)).not.toContain(standby!.id);
    expect((await s.api('GET', `/instances/${standby!.id}`)).status).toBe(404);
    expect((await s.api('POST', `/instances/${standby!.id}/exec`, { command: 'true' })).status).toBe(404);

    const warm = (await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id, name: 'warm-copy' })).body;
    expect(warm.id).toBe(standby!.id);
    expect([warm.name, warm.status, warm.warm_fork, cold.warm_fork]).toEqual(['warm-copy', 'running', true, false]);
    expect(freezerState(warm.id)).toBe('THAWED');
    // The checkpoint's state, going on from where it was.
    expect((await sh(warm.id, 'pwd; echo $MOOD; hostname', 'main')).stdout).toBe('/etc\ncalm\nwarm-copy\n');
    expect((await sh(warm.id, 'cat /root/file')).stdout).toBe('kept\n');
    // Its executions are the checkpoint's processes, as a cold fork's are.
    const procsOf = async (id: string) => ((await s.api('GET', `/instances/${id}/processes`)).body.items as { process_id: number; command: string; status: string }[]).map((p) => [p.process_id, p.command, p.status]).sort();
    const procs = await procsOf(warm.id);
    expect(procs.length).toBeGreaterThan(0);
    expect(procs).toEqual(await procsOf(cold.id));
    const first = await count(warm.id);
    expect(first).toBeGreaterThanOrEqual(beforeCheckpoint);
    await until('the warm fork\'s counter to go on', async () => (await count(warm.id)) > first, 10_000);
    // Its own machine: address, uid range (every process in it), upper.
    const [w, c] = await Promise.all([s.fp.store.instances.get(warm.id), s.fp.store.instances.get(cold.id)]);
    expect(w!.address).not.toBe(c!.address);
    expect(w!.uidBase).not.toBe(c!.uidBase);
    for (const uid of hostUids(warm.id)) expect(uid >= w!.uidBase! && uid < w!.uidBase! + 65536, `uid ${uid}`).toBe(true);
    await sh(warm.id, 'echo warm > /root/file');
    expect((await sh(cold.id, 'cat /root/file')).stdout).toBe('kept\n');

    // The pool fills again; deleting the checkpoint's instance takes its standby along.
    await s.fp.warm.settled();
    const [next] = forkStandbys();
    expect(next?.key).toBe(ck.id);
    for (const id of [warm.id, cold.id, inst.id]) expect((await s.api('DELETE', `/instances/${id}`)).status).toBe(204);
    expect(forkStandbys()).toEqual([]);
    expect(s.engine.sandbox(next!.id)).toBeUndefined();
    expect(await s.fp.store.instances.get(next!.id)).toBeUndefined();
  });

  it('a template\'s next instance is warm: the template\'s running processes, the create\'s own variables and name', async () => {
    expect((await s.api('POST', '/templates', { name: 'warm-tpl', from_image: 'default', start_command: 'sleep 1000' })).status).toBe(201);
    const before = new Set(forkStandbys().map((h) => h.id));
    const a = (await s.api('POST', '/instances', { template: 'warm-tpl' })).body;
    await s.fp.warm.settled();
    const [standby] = forkStandbys().filter((h) => !before.has(h.id));
    expect(standby).toBeDefined();
    const b = (await s.api('POST', '/instances', { template: 'warm-tpl', name: 'tpl-b', env: { WHO: 'b' } })).body;
    expect(b.id).toBe(standby!.id);
    expect((await sh(b.id, 'echo $WHO; hostname; ps -o args | grep -c "^sleep 1000"')).stdout).toBe('b\ntpl-b\n1\n');
    expect((await s.api('DELETE', '/templates/warm-tpl')).status).toBe(204);
    expect(forkStandbys().filter((h) => h.key === standby!.key)).toEqual([]);
    for (const id of [a.id, b.id]) expect((await s.api('DELETE', `/instances/${id}`)).status).toBe(204);
  });

  it('a create from an image takes the standby the last create of it left: booted, frozen until then, its own name, variables, address and range', async () => {
    const a = await s.instance({});
    await s.fp.warm.settled();
    const [standby] = imageStandbys();
    expect(standby).toBeDefined();
    expect(freezerState(standby!.id)).toBe('FROZEN');
    const b = (await s.api('POST', '/instances', { name: 'warm-made', env: { WHO: 'b' } })).body;
    expect([b.id, b.warm_fork, b.status]).toEqual([standby!.id, true, 'running']);
    expect(freezerState(b.id)).toBe('THAWED');
    expect((await sh(b.id, 'echo $WHO; hostname; id -u')).stdout).toBe('b\nwarm-made\n0\n');
    const [ra, rb] = await Promise.all([s.fp.store.instances.get(a.id), s.fp.store.instances.get(b.id)]);
    expect(rb!.address).not.toBe(ra!.address);
    expect(rb!.uidBase).not.toBe(ra!.uidBase);
    for (const uid of hostUids(b.id)) expect(uid >= rb!.uidBase! && uid < rb!.uidBase! + 65536, `uid ${uid}`).toBe(true);
    // A create that names a secret store is not warm: a standby has none of its secrets or allowlist
    // (one was taken, and the store's secrets and allowlist were dropped).
    await s.fp.warm.settled();
    expect(imageStandbys()).toHaveLength(1);
    const store = await s.api('POST', '/api/secret-stores', { name: 'warm-test', egressAllowlist: ['example.internal'] });
    await s.api('PUT', `/api/secret-stores/${store.body.id}/secrets/TOKEN`, { value: 'never-seen' });
    const c = await s.api('POST', '/api/sandboxes', { templateID: 'default', secretStore: 'warm-test' });
    expect(c.status, JSON.stringify(c.body)).toBe(201);
    const rc = (await s.fp.store.instances.get(c.body.sandboxID))!;
    expect([rc.warmFork, rc.egress, rc.secrets.map((x) => x.name)]).toEqual([false, { egress: 'deny', allow: ['example.internal'], deny: [] }, ['TOKEN']]);
    expect((await sh(rc.id, 'printf %s "$TOKEN"')).stdout).toMatch(/^osb_sealed_[0-9a-f]{32}$/);
    for (const id of [a.id, b.id, rc.id]) expect((await s.api('DELETE', `/instances/${id}`)).status).toBe(204);
  });

  it('a standby whose PID 1 is killed from the host while it is held is not handed out: the create boots instead, the dead standby removed', async () => {
    const a = await s.instance({});
    await s.fp.warm.settled();
    const [standby] = imageStandbys();
    expect(standby).toBeDefined();
    const pid = s.engine.sandbox(standby!.id)!.pid;
    // Frozen, it keeps the SIGKILL pending until thawed: the take must see it coming.
    process.kill(pid, 'SIGKILL');
    const b = (await s.api('POST', '/instances', { name: 'after-a-dead-standby' })).body;
    expect(b.id).not.toBe(standby!.id);
    expect([b.status, b.warm_fork]).toEqual(['running', false]);
    expect((await sh(b.id, 'hostname')).stdout).toBe('after-a-dead-standby\n');
    expect((await s.api('GET', `/instances/${standby!.id}`)).status).toBe(404);
    for (const id of [a.id, b.id]) expect((await s.api('DELETE', `/instances/${id}`)).status).toBe(204);
  });

  it('a server killed (-9) while it holds a standby removes it at its next start: its processes, disk and record', async () => {
    const dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-warm-test-'));
    const mounted = () => readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(`${dataDir}/instances/`)).length;
    let server = await ChildServer.start(dataDir, undefined, { FORKPOINT_WARM_FORKS: '2' });
    try {
      const inst = (await server.api('POST', '/instances', {})).body;
      const ck = (await server.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true })).body;
      const fork = (await server.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id })).body;
      expect(fork.status).toBe('running');
      // The instance, its fork, and a standby of each (the fork's, the create's of its image).
      await until('the standbys to be made (four disks mounted)', () => mounted() === 4, 20_000);
      await server.stop('SIGKILL');
      server = await ChildServer.start(dataDir, server.token, { FORKPOINT_WARM_FORKS: '2' });
      expect(mounted()).toBe(2);
      expect((await server.api('GET', '/instances')).body.items.map((i: { id: string }) => i.id).sort()).toEqual([inst.id, fork.id].sort());
      for (const id of [inst.id, fork.id]) expect((await server.api('DELETE', `/instances/${id}`)).status).toBe(204);
      expect(mounted()).toBe(0);
    } finally {
      await server.stop();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

describe('warm rollbacks', () => {
  /** The v1 freezer state of a group of this server's (a standby's has no live sandbox). */
  const nodeId = () => s.fp.cluster.nodeId;
  const groupFrozen = (group: string) => readFileSync(`/sys/fs/cgroup/freezer/forkpoint/${nodeId()}/${group}/freezer.state`, 'utf8').trim();
  const asideDirs = () => readdirSync(join(s.dataDir, 'instances')).filter((d) => d.includes('~'));
  /** Whether each rollback so far swapped in a standby (the `rollback` events' `warm`). */
  const warmth: boolean[] = [];
  beforeAll(() => s.fp.events.tap((e) => e.type === 'rollback' && warmth.push(e.data.warm === true)));

  it('the next rollback to a checkpoint swaps in the standby the last one left: the checkpoint\'s processes, shell and files, the same address and range, the old sandbox gone', async () => {
    const inst = await s.instance({ name: 'warm-rollback' });
    await sh(inst.id, 'mkdir -p /srv && echo served > /srv/index.html && echo kept > /root/file');
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'httpd -f -p 8080 -h /srv' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: COUNTER });
    await sh(inst.id, 'cd /etc && export MOOD=calm', 'main');
    const forward = (await s.api('POST', `/instances/${inst.id}/port-forwards`, { guest_port: 8080 })).body.port_forward;
    await until('the counter to count', async () => (await count(inst.id)) > 2, 10_000);
    // The checkpoint holds a value between these two: the sandbox runs on from its thaw, before
    // the checkpoint is ready (its memory image still on its way to disk).
    const beforeCheckpoint = await count(inst.id);
    const ck = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true })).body;
    expect(ck.status).toBe('ready');
    const atCheckpoint = await count(inst.id);

    // The first rollback restores, and leaves a standby of the checkpoint beside the instance.
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    await s.fp.warm.settled();
    const held = s.fp.warm.held().filter((h) => h.kind === 'rollback');
    expect(held.map((h) => [h.id, h.key])).toEqual([[inst.id, `rollback:${inst.id}:${ck.id}`]]);
    expect(groupFrozen(`${inst.id}~rollback`)).toBe('FROZEN');
    // The instance runs on beside it, on its own: the host routes its address to it alone.
    await sh(inst.id, 'echo changed > /root/file; echo gone > /srv/index.html', 'main');
    await sh(inst.id, 'export MOOD=angry', 'main');
    expect(await (await fetch(`http://127.0.0.1:${forward.host_port}/`)).text()).toBe('gone\n');
    await until('the counter to pass the checkpoint', async () => (await count(inst.id)) > atCheckpoint + 20, 20_000);
    const oldPid = s.engine.sandbox(inst.id)!.pid;

    const rb = await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id });
    expect(rb.status).toBe(200);
    expect(warmth).toEqual([false, true]);
    expect(rb.body.network.address).toBe(inst.network.address);
    expect(s.engine.sandbox(inst.id)!.pid).not.toBe(oldPid);
    // The checkpoint's state: files, the shell's directory and variable, the counter from its value.
    expect((await sh(inst.id, 'cat /root/file')).stdout).toBe('kept\n');
    expect((await sh(inst.id, 'echo $MOOD $PWD', 'main')).stdout.trim()).toBe('calm /etc');
    const after = await count(inst.id);
    expect(after).toBeGreaterThanOrEqual(beforeCheckpoint);
    expect(after).toBeLessThan(atCheckpoint + 20);
    await until('the counter to count on', async () => (await count(inst.id)) > after, 10_000);
    // The forward reaches the swapped-in sandbox's server, at the same address.
    expect(await (await fetch(`http://127.0.0.1:${forward.host_port}/`)).text()).toBe('served\n');
    // The old sandbox is gone, every process of the new one is in the instance's range.
    await until('the old sandbox gone', () => !existsSync(`/proc/${oldPid}`), 10_000);
    const range = (await s.fp.store.instances.get(inst.id))!.uidBase!;
    for (const uid of hostUids(inst.id)) expect(uid >= range && uid < range + 65536, `uid ${uid}`).toBe(true);
    expect(groupFrozen(inst.id)).toBe('THAWED');
    // What was put aside goes in the background; the next standby is made again.
    await s.fp.warm.settled();
    await until('the old disk removed', () => asideDirs().every((d) => d.endsWith('~rollback')), 10_000);
    expect(s.fp.warm.held().filter((h) => h.kind === 'rollback')).toHaveLength(1);

    // An instance that rolls back gets a standby of its newest checkpoint in place of the last:
    // the first rollback to it is warm too, with that checkpoint's state.
    await sh(inst.id, 'echo second > /root/file');
    const ck2 = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true })).body;
    await s.fp.warm.settled();
    expect(s.fp.warm.held().filter((h) => h.kind === 'rollback').map((h) => h.key)).toEqual([`rollback:${inst.id}:${ck2.id}`]);
    await sh(inst.id, 'echo third > /root/file');
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck2.id })).status).toBe(200);
    expect(warmth).toEqual([false, true, true]);
    expect((await sh(inst.id, 'cat /root/file')).stdout).toBe('second\n');
    // One to another checkpoint restores.
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    expect(warmth).toEqual([false, true, true, false]);
    expect((await sh(inst.id, 'cat /root/file')).stdout).toBe('kept\n');
    await s.fp.warm.settled();

    // Deleting the instance takes its standby with it: no disk, group or mount left.
    expect((await s.api('DELETE', `/instances/${inst.id}`)).status).toBe(204);
    await s.fp.warm.settled();
    expect(s.fp.warm.held().filter((h) => h.kind === 'rollback')).toHaveLength(0);
    await until('nothing of the instance left', () => asideDirs().length === 0 && !readFileSync('/proc/self/mountinfo', 'utf8').includes(inst.id), 10_000);
    expect(readdirSync(`/sys/fs/cgroup/freezer/forkpoint/${nodeId()}`).filter((g) => g.startsWith(inst.id))).toEqual([]);
  }, 90_000);

  it('an instance on the host\'s ids (user_namespace: false) rolls back warm as well', async () => {
    const inst = await s.instance({ user_namespace: false });
    await sh(inst.id, 'echo kept > /root/file');
    const ck = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true })).body;
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    await s.fp.warm.settled();
    await sh(inst.id, 'echo changed > /root/file');
    const before = warmth.length;
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    expect(warmth.slice(before)).toEqual([true]);
    expect((await sh(inst.id, 'cat /root/file')).stdout).toBe('kept\n');
    for (const uid of hostUids(inst.id)) expect(uid).toBe(0);
    expect((await s.api('DELETE', `/instances/${inst.id}`)).status).toBe(204);
  });
});
