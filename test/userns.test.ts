/**
 * Root in a sandbox is nobody on the host: each sandbox runs in a user namespace of its own,
 * its ids a range of host ids no other sandbox holds. Attacks made from inside sandboxes (root
 * and not), read from the host's side: /proc/<pid>/status of every process of a sandbox, the
 * upper layer on disk, the host's own inotify, a server started with capabilities to hand out.
 */
import { readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execa } from 'execa';
import { buildAttackKit, installKit, KIT, type AttackKit } from './helpers/attack-kit.js';
import { ChildServer } from './helpers/child-server.js';
import { bothOrUndo, eventually, startServer, type TestServer } from './helpers/server.js';
import { usernsImage, type Extent } from '../src/engine/userns-image.js';

const RANGE = 65536;
let s: TestServer;
let kit: AttackKit;
beforeAll(async () => {
  [s, kit] = await bothOrUndo(startServer(), buildAttackKit(), (x) => x.close(), (k) => k.cleanup());
});
afterAll(async () => {
  await s?.close();
  await kit?.cleanup();
});

const sh = async (id: string, command: string, session?: string) => s.exec(id, { command, timeout_ms: 20_000, ...(session ? { session } : {}) });
const baseOf = async (id: string): Promise<number> => {
  const base = (await s.fp.store.instances.get(id))?.uidBase;
  if (base === null || base === undefined) throw new Error(`${id} has no uid range`);
  return base;
};

/** The host's view of a process: its real, effective, saved and fs uids and gids. */
function hostIds(pid: number): number[] {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return status
    .split('\n')
    .filter((l) => /^(Uid|Gid):/.test(l))
    .flatMap((l) => l.split(/\s+/).slice(1, 5).map(Number));
}

/** Every host pid in the sandbox's pid namespace (its PID 1's). */
function processesOf(id: string): number[] {
  const init = s.engine.sandbox(id)?.pid;
  if (!init) throw new Error(`${id} is not running here`);
  const ns = readlinkSync(`/proc/${init}/ns/pid`);
  const pids: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readlinkSync(`/proc/${name}/ns/pid`) === ns) pids.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

/** Every id of every process of the sandbox lies in its range; returns the processes' ids. */
async function expectInRange(id: string): Promise<number[][]> {
  const base = await baseOf(id);
  const all = processesOf(id).map(hostIds);
  expect(all.length).toBeGreaterThan(0);
  for (const ids of all) for (const x of ids) expect(x >= base && x < base + RANGE, `host id ${x} outside ${base}..${base + RANGE - 1}`).toBe(true);
  return all;
}

describe('user namespaces, from inside and from the host', () => {
  it('root inside is the range\'s first host id: the map is not the identity, and the view and /healthz say so', async () => {
    const inst = await s.instance({ name: 'mapped' });
    const base = await baseOf(inst.id);
    expect(inst.user_namespace).toBe(true);
    expect(base).toBeGreaterThanOrEqual(s.fp.config.uidRangeStart);
    const maps = (await sh(inst.id, 'cat /proc/self/uid_map /proc/self/gid_map; id -u')).stdout.trim().split('\n').map((l: string) => l.trim().split(/\s+/).join(' '));
    expect(maps).toEqual([`0 ${base} ${RANGE}`, `0 ${base} ${RANGE}`, '0']);
    expect(hostIds(s.engine.sandbox(inst.id)!.pid)).toEqual(Array(8).fill(base));
    expect((await s.api('GET', '/healthz')).body.engine.user_namespaces).toBe('on');
  });

  it('every process of a sandbox runs as host ids of its range: after create, rollback, fork, wake and a restart', async () => {
    const inst = await s.instance({ name: 'ranged' });
    await installKit(s, inst.id, kit);
    // a root process and a user's, kept running by a shell session
    await sh(inst.id, `sleep 600 & ${KIT} runas 1000 /bin/sleep 600 & echo kept > /root/kept`, 'main');
    const check = async (id: string) => {
      const ids = await expectInRange(id);
      const base = await baseOf(id);
      expect(ids.some((x) => x[1] === base + 1000), 'the user\'s process is base + 1000').toBe(true);
    };
    // `runas` is a process of base + 0 until its setuid: wait for the user's process itself, not a count
    const base = await baseOf(inst.id);
    await eventually(async () => processesOf(inst.id).some((pid) => { try { return hostIds(pid)[1] === base + 1000; } catch { return false; } }));
    await check(inst.id);

    const ck = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { label: 'ranged' })).body;
    expect(ck.status).toBe('ready');
    await check(inst.id);
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    await check(inst.id);

    const fork = (await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id })).body;
    expect(fork.user_namespace).toBe(true);
    expect(await baseOf(fork.id)).not.toBe(await baseOf(inst.id));
    await check(fork.id);
    expect((await sh(fork.id, 'cat /root/kept; stat -c %u:%g /root/kept; cat /proc/self/uid_map')).stdout.split('\n').slice(0, 2)).toEqual(['kept', '0:0']);

    expect((await s.api('POST', `/instances/${inst.id}/hibernate`)).body.status).toBe('hibernated');
    expect((await s.api('POST', `/instances/${inst.id}/wake`)).body.status).toBe('running');
    await check(inst.id);

    const dataDir = s.dataDir;
    await s.close({ keepSandboxes: true });
    s = await startServer({}, dataDir);
    for (const id of [inst.id, fork.id]) {
      expect((await s.api('GET', `/instances/${id}`)).body.status).toBe('running');
      await check(id);
    }
  });

  it('a memory image whose user namespace was tampered with: a map from the host\'s root still restores into the fork\'s own range; a map wider than a range is refused and nothing of it runs', async () => {
    const inst = await s.instance({ name: 'tampered' });
    await sh(inst.id, 'sleep 600 &', 'main');
    const ck = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    expect(ck.status).toBe('ready');
    const images = s.engine.layout.checkpoint(ck.id);
    const usernsImages = readdirSync(images).filter((n) => /^userns-\d+\.img$/.test(n));
    expect(usernsImages.length).toBeGreaterThan(0);
    const tamper = (extents: Extent[]) => usernsImages.forEach((n) => writeFileSync(join(images, n), usernsImage(extents)));

    tamper([{ first: 0, lower_first: 0, count: RANGE }]);
    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id });
    expect(fork.status, JSON.stringify(fork.body)).toBe(201);
    const ids = await expectInRange(fork.body.id);
    expect(ids.flat()).not.toContain(0);
    expect((await sh(fork.body.id, 'cat /proc/self/uid_map')).stdout.trim().split(/\s+/).map(Number)).toEqual([0, await baseOf(fork.body.id), RANGE]);

    // Two ranges' worth: its ids 65536.. would be another sandbox's.
    tamper([{ first: 0, lower_first: await baseOf(inst.id), count: 2 * RANGE }]);
    const groupOf = (pid: number | string) => readFileSync(`/proc/${pid}/cgroup`, 'utf8').split('\n').find((l) => /^\d+:pids:/.test(l) || l.startsWith('0::'))?.split(':')[2];
    const node = groupOf(s.engine.sandbox(inst.id)!.pid)!.split('/').slice(0, -1).join('/');
    const running = new Set(s.engine.liveIds());
    const wide = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id });
    expect(wide.status, JSON.stringify(wide.body)).toBe(503);
    expect(wide.body.error).toMatchObject({ code: 'UNAVAILABLE', details: { engine: 'RESTORE_FAILED' } });
    // CRIU's reason (deploy/criu/0007), or the engine's own with an unpatched CRIU
    expect(wide.body.error.message).toMatch(/Cannot rebase uid_map|not a map of one range/);
    expect(new Set(s.engine.liveIds())).toEqual(running);
    const rollback = await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id });
    expect(rollback.status, JSON.stringify(rollback.body)).toBe(503);
    // Every process in this node's groups is a live sandbox's (or its rollback standby's): none
    // is left of the refused ones.
    const groups = new Set<string>();
    for (const pid of readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
      try {
        const g = groupOf(pid);
        if (g?.startsWith(`${node}/`)) groups.add(g.slice(node.length + 1).split('/')[0]!);
      } catch {
        // gone meanwhile
      }
    }
    const live = s.engine.liveIds();
    expect([...groups].filter((g) => !live.some((id) => g === id || g.startsWith(`${id}~`)))).toEqual([]);
  });

  it('two sandboxes never share a range: 50 created, forked and deleted in a mix', async () => {
    const source = await s.instance({ name: 'mix-source' });
    const ck = (await s.api('POST', `/instances/${source.id}/checkpoints?wait=true`, {})).body;
    const live = new Set<string>([source.id]);
    for (let i = 0; i < 50; i++) {
      if (i % 5 === 4) {
        const victim = [...live].find((id) => id !== source.id);
        if (victim) {
          expect((await s.api('DELETE', `/instances/${victim}`)).status).toBeLessThan(300);
          live.delete(victim);
        }
      } else if (i % 2 === 0) {
        live.add((await s.instance({ name: `mix-${i}` })).id);
      } else {
        const r = await s.api('POST', `/instances/${source.id}/fork`, { checkpoint_id: ck.id, name: `mix-${i}` });
        expect(r.status, JSON.stringify(r.body)).toBe(201);
        live.add(r.body.id);
      }
      const bases = await Promise.all([...live].map(baseOf));
      expect(new Set(bases).size).toBe(live.size);
    }
    for (const id of live) {
      expect(hostIds(s.engine.sandbox(id)!.pid)[0]).toBe(await baseOf(id));
      if (id !== source.id) await s.api('DELETE', `/instances/${id}`);
    }
  });

  it('a file written as root is canonical uid 0 in the upper on disk, and the range\'s uid through the host\'s view of the overlay', async () => {
    const inst = await s.instance({ name: 'owners' });
    const base = await baseOf(inst.id);
    await sh(inst.id, 'echo x > /root/by-root; echo y > /tmp/by-user; chown 1000:1000 /tmp/by-user');
    const upper = s.engine.disk.upperOf(inst.id);
    const merged = s.engine.layout.merged(inst.id);
    expect([statSync(join(upper, 'root/by-root')).uid, statSync(join(upper, 'tmp/by-user')).uid]).toEqual([0, 1000]);
    expect([statSync(join(merged, 'root/by-root')).uid, statSync(join(merged, 'tmp/by-user')).uid]).toEqual([base, base + 1000]);
    // the image's own files too: canonical on disk, the range's through the overlay
    expect(statSync(join(merged, 'bin')).uid).toBe(base);
  });

  it('a setuid-root program takes a user of the sandbox to the sandbox\'s root at most (sudo): a host id of its range, with its bounded capabilities; on the host\'s ids it gives nothing', async () => {
    const inst = await s.instance({ name: 'setuid' });
    await installKit(s, inst.id, kit);
    await sh(inst.id, `cp ${KIT} /tmp/suid && chown 0:0 /tmp/suid && chmod 4755 /tmp/suid`);
    // the setuid-root program itself, kept running: what does the host see it as?
    await sh(inst.id, `${KIT} runas 1000 /tmp/suid inotify 1 600 > /dev/null &`, 'main');
    const base = await baseOf(inst.id);
    // The setuid program itself, once exec'd (before that, `runas` has the user's ids in full).
    const running = (p: number) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0')[0] === '/tmp/suid';
      } catch {
        return false; // gone meanwhile
      }
    };
    const pid = await eventually(async () => processesOf(inst.id).find((p) => running(p) && hostIds(p)[0] === base + 1000));
    // real uid the user's, effective and saved the sandbox's root: both in the range; gids untouched
    expect(hostIds(pid)).toEqual([base + 1000, base, base, base, base + 1000, base + 1000, base + 1000, base + 1000]);
    const eff = BigInt('0x' + /CapEff:\s+([0-9a-f]+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);
    for (const cap of [21 /* SYS_ADMIN */, 19 /* SYS_PTRACE */, 27 /* MKNOD */, 12 /* NET_ADMIN */, 2 /* DAC_READ_SEARCH */, 25 /* SYS_TIME */]) {
      expect(eff & (1n << BigInt(cap)), `capability ${cap}`).toBe(0n);
    }
    // On the host's ids the sandbox's root is the host's: there no_new_privs holds it back.
    const hostIdsInst = await s.instance({ name: 'setuid-hostids', user_namespace: false });
    await installKit(s, hostIdsInst.id, kit);
    await sh(hostIdsInst.id, `cp ${KIT} /tmp/suid && chown 0:0 /tmp/suid && chmod 4755 /tmp/suid`);
    expect((await sh(hostIdsInst.id, `${KIT} runas 1000 /tmp/suid runas 0 /bin/true`)).stdout).toMatch(/runas: refused EPERM/);
  });

  it('root in its own user namespace still cannot make namespaces, touch netfilter, mount, make devices, or reach bpf, keyrings, userfaultfd, io_uring', async () => {
    const inst = await s.instance({ name: 'narrow' });
    const ck = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    const fork = (await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id })).body;
    for (const id of [inst.id, fork.id]) {
      await installKit(s, id, kit);
      for (const call of ['unshare-user', 'unshare-net', 'clone-user', 'nft', 'mount', 'mknod', 'bpf', 'keyctl-join', 'userfaultfd', 'io-uring', 'ptrace-agent']) {
        expect((await sh(id, `${KIT} ${call}`)).stdout, `${call} in ${id}`).toMatch(/refused E(PERM|ACCES)/);
      }
      const caps = (await sh(id, 'grep -E "^Cap(Inh|Eff|Amb)" /proc/self/status')).stdout;
      expect(caps).toMatch(/CapInh:\s+0{16}/);
      expect(caps).toMatch(/CapAmb:\s+0{16}/);
    }
    // the kit's calls work on the host: the refusals are the sandbox's doing
    for (const call of ['mknod']) expect((await execa(kit.hostPath, [call], { cwd: tmpdir() })).stdout).toMatch(/: ok/);
    await rm('/tmp/fp-null', { force: true });
  });

  it('a sandbox that exhausts its inotify instances leaves the host\'s root and another sandbox theirs', async () => {
    const [a, b] = await Promise.all([s.instance({ name: 'inotify-a' }), s.instance({ name: 'inotify-b' })]);
    await Promise.all([installKit(s, a.id, kit), installKit(s, b.id, kit)]);
    await sh(a.id, `${KIT} inotify 1000000 60 > /tmp/held &`, 'main');
    const held = await eventually(async () => (await sh(a.id, 'cat /tmp/held')).stdout.trim() || undefined);
    expect(held).toMatch(/^inotify: opened 128 \(EMFILE\)$/);
    expect((await execa(kit.hostPath, ['inotify', '100', '0'])).stdout).toBe('inotify: opened 100 (all)');
    expect((await sh(b.id, `${KIT} inotify 100 0`)).stdout.trim()).toBe('inotify: opened 100 (all)');
  });

  it('a restored sandbox is bounded before it runs again: a loop opening inotify instances through a checkpoint, a fork and a rollback never holds more than 128', async () => {
    const a = await s.instance({ name: 'inotify-race' });
    await installKit(s, a.id, kit);
    // The loop holds 128 when it is dumped and tries again at once after each refusal: a restored
    // namespace left unbounded for a moment (as it was until the engine bounded it, after CRIU
    // had resumed the tree) lets it open more.
    await sh(a.id, `${KIT} inotify-race 4 > /tmp/race &`, 'main');
    await new Promise((r) => setTimeout(r, 300));
    const ck = (await s.api('POST', `/instances/${a.id}/checkpoints?wait=true`, { memory: true })).body;
    expect(ck.status, ck.error).toBe('ready');
    const fork = (await s.api('POST', `/instances/${a.id}/fork`, { checkpoint_id: ck.id })).body;
    expect(fork.status).toBe('running');
    expect((await s.api('POST', `/instances/${a.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    for (const id of [a.id, fork.id]) {
      const held = await eventually(async () => (await sh(id, 'cat /tmp/race')).stdout.trim() || undefined, 15_000);
      expect(held, id).toBe('inotify-race: opened 128');
    }
  });

  it('user_namespace: false keeps the host\'s ids, said in the view, and its forks keep them too', async () => {
    const inst = await s.instance({ name: 'hostids', user_namespace: false });
    expect(inst.user_namespace).toBe(false);
    expect((await s.fp.store.instances.get(inst.id))?.uidBase).toBeNull();
    expect((await sh(inst.id, 'cat /proc/self/uid_map')).stdout.trim().split(/\s+/)).toEqual(['0', '0', '4294967295']);
    const ck = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    const fork = (await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id })).body;
    expect(fork.user_namespace).toBe(false);
    expect(hostIds(s.engine.sandbox(fork.id)!.pid)[0]).toBe(0);
  });
});

describe('uid ranges run out, and a server that holds capabilities', () => {
  it('with every range of the pool held, a create answers 503 with its reason; an instance without a user namespace still starts', async () => {
    const small = await startServer({ uidRanges: 2 });
    try {
      await small.instance({ name: 'one' });
      await small.instance({ name: 'two' });
      const r = await small.api('POST', '/instances', { name: 'three' });
      expect(r.status).toBe(503);
      expect(r.body.error).toMatchObject({ code: 'UNAVAILABLE', details: { reason: 'UID_RANGES_EXHAUSTED' } });
      expect((await small.api('GET', '/instances')).body.items).toHaveLength(2);
      expect((await small.api('POST', '/instances', { name: 'three', user_namespace: false })).status).toBe(201);
    } finally {
      await small.close();
    }
  });

  it('one owner holds at most its share of the pool: past it a create answers 429 with its reason, and another owner still gets ranges', async () => {
    const small = await startServer({ uidRanges: 4, uidRangesPerOwner: 2 });
    try {
      const other = await small.fp.store.tokens.create('tenant-b', 'test');
      const asOther = { authorization: `Bearer ${other.token}` };
      await small.instance({ name: 'a1' });
      await small.instance({ name: 'a2' });
      const r = await small.api('POST', '/instances', { name: 'a3' });
      expect(r.status).toBe(429);
      expect(r.body.error).toMatchObject({ code: 'QUOTA_EXCEEDED', details: { reason: 'UID_RANGES_PER_OWNER', limit: 2 } });
      for (const name of ['b1', 'b2']) expect((await small.api('POST', '/instances', { name }, asOther)).status).toBe(201);
      for (const i of (await small.api('GET', '/instances', undefined, asOther)).body.items) await small.api('DELETE', `/instances/${i.id}`, undefined, asOther);
    } finally {
      await small.close();
    }
  });

  it('a server started with inheritable and ambient capabilities hands none of them to its sandboxes', async () => {
    const caps = '+sys_admin,+sys_ptrace,+mknod,+net_admin,+sys_time,+dac_read_search';
    const dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-caps-'));
    let server: ChildServer | undefined;
    try {
      server = await ChildServer.start(dataDir, undefined, {}, ['setpriv', '--inh-caps', caps, '--ambient-caps', caps]);
      expect(readFileSync(`/proc/${server.proc.pid}/status`, 'utf8')).toMatch(/CapAmb:\s+0*[1-9a-f]/);
      for (const userNamespace of [true, false]) {
        const inst = (await server.api('POST', '/instances', { user_namespace: userNamespace })).body;
        const r = (await server.api('POST', `/instances/${inst.id}/exec`, { command: 'grep -E "^Cap" /proc/self/status; mknod /tmp/n c 1 3 && echo MKNOD-WORKED; ip link add fp0 type dummy 2>/dev/null && echo NETADMIN-WORKED; true' })).body;
        expect(r.stdout).toMatch(/CapInh:\s+0{16}/);
        expect(r.stdout).toMatch(/CapAmb:\s+0{16}/);
        const eff = BigInt(`0x${/CapEff:\s+([0-9a-f]+)/.exec(r.stdout)![1]}`);
        for (const bit of [21n, 19n, 27n, 12n, 25n, 2n]) expect((eff >> bit) & 1n, `capability ${bit} in ${userNamespace}`).toBe(0n);
        expect(r.stdout).not.toMatch(/WORKED/);
      }
    } finally {
      if (server) {
        for (const i of (await server.api('GET', '/instances')).body.items ?? []) await server.api('DELETE', `/instances/${i.id}`);
        await server.stop();
      }
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

describe('memory limits', () => {
  it('bound swap too: memory and swap together no more than the memory limit (cgroup v1), no swap (v2)', async () => {
    const inst = await s.instance({ name: 'noswap', limits: { memory_mb: 96 } });
    const lines = readFileSync(`/proc/${s.engine.sandbox(inst.id)!.pid}/cgroup`, 'utf8').split('\n');
    const v1 = lines.find((l) => /^\d+:memory:/.test(l));
    if (v1) {
      const dir = join('/sys/fs/cgroup/memory', v1.split(':')[2]!);
      expect(readFileSync(join(dir, 'memory.memsw.limit_in_bytes'), 'utf8').trim()).toBe(String(96 * 1024 * 1024));
      expect(readFileSync(join(dir, 'memory.limit_in_bytes'), 'utf8').trim()).toBe(String(96 * 1024 * 1024));
    } else {
      const dir = join('/sys/fs/cgroup', lines.find((l) => l.startsWith('0::'))!.slice(3));
      expect(readFileSync(join(dir, 'memory.swap.max'), 'utf8').trim()).toBe('0');
    }
  });
});
