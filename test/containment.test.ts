/**
 * Attacks on the host, on other tenants and on the server, made the way untrusted code would
 * make them: as root inside a sandbox (with a small static "attack kit" for the system calls a
 * shell cannot make), or through the API. Each `it` is one attack and what must hold after it.
 * README, "Security", lists the same matrix.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readFile, rmdir } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execa } from 'execa';
import { buildAttackKit, installKit, KIT, type AttackKit } from './helpers/attack-kit.js';
import { bothOrUndo, eventually, sleep, startServer, type TestServer } from './helpers/server.js';

let s: TestServer;
let kit: AttackKit;
let a: string; // the attacker's instance
let b: string; // another tenant's
beforeAll(async () => {
  [s, kit] = await bothOrUndo(startServer(), buildAttackKit(), (x) => x.close(), (k) => k.cleanup());
  const other = await s.fp.store.tokens.create('tenant-b', 'test');
  [a, b] = await Promise.all([
    s.instance({ name: 'attacker' }).then((i) => i.id as string),
    s.api('POST', '/instances', { name: 'victim' }, { authorization: `Bearer ${other.token}` }).then((r) => r.body.id as string),
  ]);
  await installKit(s, a, kit);
});
afterAll(async () => {
  await s?.close();
  await kit?.cleanup();
});

const sh = async (id: string, command: string) => s.exec(id, { command, timeout_ms: 20_000 });
const attack = async (id: string, args: string) => (await sh(id, `${KIT} ${args}`)).stdout.trim();
const ownerB = 'tenant-b';

/** The system calls Docker's default seccomp profile refuses a container without CAP_SYS_ADMIN,
 * and a few more; each one works on this host (the kit run outside any sandbox proves it). */
const refusedCalls: [string, RegExp][] = [
  ['addkey fp-containment', /refused EPERM/],
  ['keyctl-join', /refused EPERM/],
  ['unshare-user', /refused EPERM/],
  ['unshare-net', /refused EPERM/],
  ['clone-user', /refused EPERM/],
  ['clone3', /refused ENOSYS/],
  ['setns', /refused EPERM/],
  ['mount', /refused EPERM/],
  ['mount-cgroup', /refused EPERM/],
  ['bpf', /refused EPERM/],
  ['perf', /refused EPERM/],
  ['io-uring', /refused EPERM/],
  ['userfaultfd', /refused EPERM/],
  ['vsock', /refused EPERM/],
  ['syslog', /refused EPERM/],
  ['open-by-handle', /refused EPERM/],
  ['kexec', /refused EPERM/],
  ['reboot', /refused EPERM/],
  ['ptrace-agent', /refused EPERM/],
  ['pidfd-getfd', /refused EPERM/],
];

describe('containment matrix, from inside a sandbox', () => {
  it.each(refusedCalls)('%s is refused', async (call, expected) => {
    expect(await attack(a, call)).toMatch(expected);
  });

  it('the same calls work on the host, so the refusals above are the sandbox\'s doing', async () => {
    for (const call of ['unshare-net', 'clone3', 'io-uring', 'userfaultfd', 'syslog']) {
      expect((await execa(kit.hostPath, call.split(' '))).stdout).toMatch(/: ok/);
    }
  });

  it('a 32-bit system call kills the caller (only the native ABI is allowed)', async () => {
    const r = await sh(a, `${KIT} int80; echo status=$?`);
    expect(r.stdout).not.toMatch(/int80: ok/);
    expect(r.stdout).toMatch(/status=159/); // 128 + SIGSYS
  });

  it('/proc/sys and the other read-only paths cannot be written', async () => {
    for (const path of ['/proc/sys/kernel/core_pattern', '/proc/sys/vm/drop_caches', '/proc/sys/kernel/panic', '/proc/sys/fs/file-max', '/proc/sysrq-trigger']) {
      if (!existsSync(path)) continue;
      const r = await sh(a, `echo 1 > ${path}; echo rc=$?`);
      expect(r.stdout, path).toMatch(/rc=[1-9]/);
      expect(r.stderr, path).toMatch(/Read-only file system/);
    }
    const irq = await sh(a, 'ls /proc/irq >/dev/null && for f in /proc/irq/default_smp_affinity; do echo 1 > $f; echo rc=$?; done');
    expect(irq.stdout).toMatch(/rc=[1-9]/);
  });

  it('masked /proc paths show nothing', async () => {
    const r = await sh(a, 'for p in /proc/kcore /proc/keys /proc/key-users /proc/timer_list /proc/sched_debug /proc/kallsyms /proc/kmsg /proc/slabinfo /proc/vmallocinfo; do [ -e $p ] && echo "$p $(head -c 64 $p | wc -c)"; done; ls -A /proc/acpi 2>/dev/null | wc -l');
    const lines = r.stdout.trim().split('\n');
    expect(lines.pop()).toBe('0');
    for (const line of lines) expect(line, line).toMatch(/ 0$/);
  });

  it('no mount lies hidden under another: each is something the sandbox sees (and CRIU dumps and restores)', async () => {
    const r = await sh(a, 'cat /proc/self/mountinfo');
    const text: string = r.stdout;
    const mounts = text.trim().split('\n').map((line) => line.split(' ')).map((f) => ({ id: f[0], parent: f[1], point: f[4]! }));
    const points = mounts.map((m) => m.point);
    expect(points.length).toBeGreaterThan(10);
    expect(points.filter((p, i) => points.indexOf(p) !== i)).toEqual([]);
    // the sandbox's own boot id, bound over the read-only /proc/sys
    const bootId = mounts.find((m) => m.point === '/proc/sys/kernel/random/boot_id');
    expect(bootId?.parent).toBe(mounts.find((m) => m.point === '/proc/sys')?.id);
  });

  it('cannot mount, mknod a device, or regain capabilities; the filter is on, and NoNewPrivs where root is the host\'s', async () => {
    const m = await sh(a, 'mkdir -p /mnt/x && mount -t tmpfs none /mnt/x');
    expect(m.exit_code).not.toBe(0);
    expect((await sh(a, 'mknod /tmp/mem c 1 1')).exit_code).not.toBe(0);
    const status = (await sh(a, 'grep -E "CapEff|CapBnd|NoNewPrivs|Seccomp:" /proc/self/status')).stdout;
    // In its own user namespace a set-user-id program reaches the sandbox's root at most (sudo
    // works, as in Docker); on the host's ids it gains nothing.
    expect(status).toMatch(/NoNewPrivs:\s+0/);
    expect(status).toMatch(/Seccomp:\s+2/);
    const hostIds = await s.instance({ name: 'nnp-hostids', user_namespace: false });
    expect((await sh(hostIds.id, 'grep -E "NoNewPrivs|Seccomp:" /proc/self/status')).stdout).toMatch(/NoNewPrivs:\s+1\nSeccomp:\s+2/);
    const bnd = BigInt('0x' + /CapBnd:\s+([0-9a-f]+)/.exec(status)![1]);
    for (const cap of [21 /* SYS_ADMIN */, 16 /* SYS_MODULE */, 17 /* SYS_RAWIO */, 19 /* SYS_PTRACE */, 24 /* SYS_RESOURCE */, 27 /* MKNOD */, 12 /* NET_ADMIN */, 25 /* SYS_TIME */]) {
      expect(bnd & (1n << BigInt(cap)), `capability ${cap}`).toBe(0n);
    }
  });

  it('the agent cannot be traced or read by the sandbox\'s own root', async () => {
    const r = await sh(a, 'cat /proc/1/environ; echo rc=$?; readlink /proc/1/exe; echo rc=$?');
    expect(r.stdout).toMatch(/rc=1\n.*rc=1/s);
  });
});

describe('the confinement survives checkpoint, rollback and fork (CRIU carries it)', () => {
  const probe = `grep -E "^(NoNewPrivs|Seccomp):" /proc/self/status | tr -s '\\t ' ' '; (echo x > /proc/sys/kernel/core_pattern) 2>/dev/null || echo sys-ro; wc -c < /proc/keys; cat /proc/1/environ >/dev/null 2>&1 || echo agent-private; ${KIT} addkey fp-after`;
  // NoNewPrivs is off in a sandbox's own user namespace (sudo), and stays so: what matters is
  // that nothing changes through CRIU.
  const confined = ['NoNewPrivs: 0', 'Seccomp: 2', 'sys-ro', '0', 'agent-private', 'addkey: refused EPERM'].join('\n') + '\n';

  it('after a checkpoint, a rollback and in a fork, every process is as confined as at boot', async () => {
    const inst = await s.instance({ name: 'survivor' });
    await installKit(s, inst.id, kit);
    expect((await sh(inst.id, probe)).stdout).toBe(confined);
    await s.exec(inst.id, { command: 'true', session: 'main' }); // a shell made before the checkpoint
    const ck = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    expect(ck.status).toBe('ready');
    expect((await sh(inst.id, probe)).stdout).toBe(confined);
    expect((await s.exec(inst.id, { command: probe, session: 'main' })).stdout).toBe(confined);
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    expect((await sh(inst.id, probe)).stdout).toBe(confined);
    expect((await s.exec(inst.id, { command: probe, session: 'main' })).stdout).toBe(confined);
    const fork = (await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id })).body;
    expect((await sh(fork.id, probe)).stdout).toBe(confined);
    expect((await s.exec(fork.id, { command: probe, session: 'main' })).stdout).toBe(confined);
  });
});

describe('finding 1: /proc/sys is not writable (host root through core_pattern)', () => {
  it('a core_pattern pipe to a sandbox file is refused and the host runs nothing', async () => {
    const before = readFileSync('/proc/sys/kernel/core_pattern', 'utf8');
    const marker = join(tmpdir(), `forkpoint-pwned-${process.pid}`);
    await sh(a, `printf '#!/bin/sh\\ntouch ${marker}\\n' > /tmp/pwn.sh && chmod 755 /tmp/pwn.sh`);
    const w = await sh(a, `printf '|/proc/%%P/root/tmp/pwn.sh' > /proc/sys/kernel/core_pattern; echo rc=$?`);
    expect(w.stdout).toMatch(/rc=[1-9]/);
    await sh(a, 'ulimit -c unlimited; sh -c \'kill -SEGV $$\'; true');
    await sleep(200);
    expect(readFileSync('/proc/sys/kernel/core_pattern', 'utf8')).toBe(before);
    expect(existsSync(marker)).toBe(false);
  });
});

describe('finding 2: kernel keyrings are not shared', () => {
  it('a key added in one sandbox is seen neither in another tenant\'s nor on the host', async () => {
    // b belongs to tenant-b: the kit goes in through the core, as tenant-b's own upload would
    await s.fp.files.write(ownerB, b, KIT, kit.binary);
    await s.fp.commands.exec(ownerB, b, { command: `chmod 755 ${KIT}` });
    expect(await attack(a, 'addkey fp-tenant-secret')).toMatch(/refused/);
    const seen = await s.fp.commands.exec(ownerB, b, { command: `${KIT} findkey fp-tenant-secret` });
    expect(seen.stdout.toBuffer().toString()).toMatch(/findkey: refused/);
    expect(readFileSync('/proc/keys', 'utf8')).not.toContain('fp-tenant-secret');
  });
});

describe('finding 3: limits cannot be escaped', () => {
  const v1 = !existsSync('/sys/fs/cgroup/cgroup.controllers');
  // A sandbox's groups are its node's: forkpoint/<node>/<instance>.
  const limitFiles = (id: string) => {
    const g = `forkpoint/${s.fp.cluster.nodeId}/${id}`;
    return v1
      ? [`/sys/fs/cgroup/memory/${g}/memory.limit_in_bytes`, `/sys/fs/cgroup/pids/${g}/pids.max`, `/sys/fs/cgroup/cpu/${g}/cpu.cfs_quota_us`]
      : [`/sys/fs/cgroup/${g}/memory.max`, `/sys/fs/cgroup/${g}/pids.max`, `/sys/fs/cgroup/${g}/cpu.max`];
  };

  it('unshare -U (user, mount and cgroup namespaces) is refused, and the limits on the host stay', async () => {
    const before = await Promise.all(limitFiles(a).map((f) => readFile(f, 'utf8')));
    const r = await sh(a, 'unshare -U -m -C sh -c "mkdir -p /tmp/cg && mount -t cgroup -o memory none /tmp/cg && echo -1 > /tmp/cg/forkpoint/*/*/memory.limit_in_bytes"; echo rc=$?');
    expect(r.stdout).toMatch(/rc=[1-9]/);
    expect(r.stderr).toMatch(/unshare|Operation not permitted/);
    expect(await Promise.all(limitFiles(a).map((f) => readFile(f, 'utf8')))).toEqual(before);
  });

  it('child cgroups under an instance\'s group go with the instance', async () => {
    const inst = await s.instance({ name: 'nested' });
    const groups = limitFiles(inst.id).map((f) => join(f, '..'));
    const children = groups.map((g) => join(g, 'made-inside'));
    for (const c of children) await mkdir(c, { recursive: true });
    expect((await s.api('DELETE', `/instances/${inst.id}`)).status).toBe(204);
    for (const g of groups) expect(existsSync(g), g).toBe(false);
    for (const c of children) await rmdir(c).catch(() => undefined);
  });
});

describe('finding 4: the agent socket cannot be swapped for another sandbox\'s or a host socket', () => {
  it('a sandbox racing symlinks into /.fp/agent.sock reaches neither tenant B nor a host socket', async () => {
    const victim = await s.instance({ name: 'victim2' });
    await s.exec(victim.id, { command: 'echo victim-secret > /root/secret' });
    const attacker = await s.instance({ name: 'swapper' });
    await installKit(s, attacker.id, kit);
    // A host socket that counts who connects to it.
    const hostSock = join(tmpdir(), `forkpoint-hostsock-${process.pid}.sock`);
    let hostConnections = 0;
    const host: Server = createServer((c) => {
      hostConnections++;
      c.destroy();
    });
    await new Promise<void>((r) => host.listen(hostSock, r));
    try {
      const victimSocket = `/proc/${s.engine.sandbox(victim.id)!.pid}/root/.fp/agent.sock`;
      for (const target of [victimSocket, hostSock]) {
        const pid = (await s.api('POST', `/instances/${attacker.id}/processes`, { command: `${KIT} swap ${target} 3` })).body.process_id;
        await sleep(100);
        // Every output read opens a connection of its own: each one is a chance for the race.
        const seen: string[] = [];
        const until = Date.now() + 2500;
        while (Date.now() < until) {
          const out = await s.api('GET', `/instances/${attacker.id}/processes/${pid}/output`);
          seen.push(JSON.stringify(out.body));
          const r = await s.api('POST', `/instances/${attacker.id}/exec`, { command: 'cat /root/secret; hostname', timeout_ms: 2000 });
          seen.push(JSON.stringify(r.body));
          expect(r.status).toBeLessThan(500 + 4); // 409 or 503: the agent is unreachable, never another's
        }
        expect(seen.join('\n')).not.toContain('victim-secret');
        expect(seen.join('\n')).not.toContain('victim2');
      }
      expect(hostConnections).toBe(0);
      // The victim is untouched.
      expect((await s.exec(victim.id, { command: 'cat /root/secret' })).stdout).toBe('victim-secret\n');
    } finally {
      host.close();
    }
  });
});

describe('finding 5: a malformed frame from the agent closes that connection, nothing more', () => {
  it('a fake agent answering "length 0, type ERROR" leaves the server and other instances up', async () => {
    const victim = await s.instance({ name: 'bystander' });
    const fake = await s.instance({ name: 'faker' });
    await installKit(s, fake.id, kit);
    await s.api('POST', `/instances/${fake.id}/processes`, { command: `${KIT} fakeagent 1 50 20 error0` });
    await sleep(200);
    for (let i = 0; i < 5; i++) {
      const r = await s.api('POST', `/instances/${fake.id}/checkpoints?wait=true`, { memory: true });
      expect(r.status).toBeLessThan(500 + 4);
      const e = await s.api('POST', `/instances/${fake.id}/exec`, { command: 'echo hi' });
      expect([409, 503]).toContain(e.status);
    }
    expect((await s.api('GET', '/healthz', undefined, {})).status).toBe(200);
    expect((await s.exec(victim.id, { command: 'echo alive' })).stdout).toBe('alive\n');
    expect((await s.api('DELETE', `/instances/${fake.id}`)).status).toBe(204);
  });

  it('a fuzzing fake agent (thousands of random and truncated frames) harms nothing else', async () => {
    const victim = await s.instance({ name: 'bystander2' });
    const fake = await s.instance({ name: 'fuzzer' });
    await installKit(s, fake.id, kit);
    const proc = (await s.api('POST', `/instances/${fake.id}/processes`, { command: `${KIT} fakeagent 42 40 30` })).body.process_id;
    await sleep(200);
    const statuses = new Set<number>();
    for (let i = 0; i < 40; i++) {
      const [out, ex, list] = await Promise.all([
        s.api('GET', `/instances/${fake.id}/processes/${proc}/output`),
        s.api('POST', `/instances/${fake.id}/exec`, { command: 'true', timeout_ms: 2000 }),
        s.api('GET', `/instances/${fake.id}/processes`),
      ]);
      for (const r of [out, ex, list]) {
        statuses.add(r.status);
        if (r.status >= 500 && r.status !== 503) console.error('fuzz', r.status, JSON.stringify(r.body));
      }
      if (i % 10 === 0) expect((await s.exec(victim.id, { command: 'echo alive' })).stdout).toBe('alive\n');
    }
    for (const st of statuses) expect(st === 200 || st === 404 || st === 409 || st === 503, `status ${st}`).toBe(true);
    expect((await s.api('GET', '/healthz', undefined, {})).status).toBe(200);
    expect((await s.exec(victim.id, { command: 'echo still alive' })).stdout).toBe('still alive\n');
    expect((await s.api('DELETE', `/instances/${fake.id}`)).status).toBe(204);
  });
});

describe('the agent\'s socket is the server\'s', () => {
  it('attack: a sandbox process that opens 40 connections to its agent has each closed at once; the server still reaches the agent after checkpoints (new connections each)', async () => {
    const inst = await s.instance({ name: 'slot-taker' });
    await installKit(s, inst.id, kit);
    const proc = (await s.api('POST', `/instances/${inst.id}/processes`, { command: `${KIT} agentconns 40 30` })).body.process_id;
    const seen = await eventually(async () => /agentconns: made (\d+) closed (\d+)/.exec((await s.api('GET', `/instances/${inst.id}/processes/${proc}/output`)).body.stdout ?? '') ?? undefined);
    expect(Number(seen[1]), seen[0]).toBe(40);
    expect(Number(seen[2]), seen[0]).toBe(40);
    // A checkpoint closes the server's connections and makes new ones, the process still there.
    for (let i = 0; i < 3; i++) {
      expect((await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true })).body.status).toBe('ready');
      expect((await s.exec(inst.id, { command: 'echo reached' })).stdout).toBe('reached\n');
    }
    expect((await s.api('DELETE', `/instances/${inst.id}`)).status).toBe(204);
  });
});

describe('finding 7: every request ends', () => {
  it('a session exec racing a rollback answers (200 or 409), in every round', async () => {
    const inst = await s.instance({ name: 'racer' });
    await s.exec(inst.id, { command: 'echo base > /root/v', session: 'main' });
    const ck = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    for (let round = 0; round < 8; round++) {
      const delay = round * 15;
      const started = Date.now();
      const [ex, rb] = await Promise.all([
        s.api('POST', `/instances/${inst.id}/exec`, { command: 'sleep 0.05; echo ran', session: 'main', timeout_ms: 10_000 }),
        sleep(delay).then(() => s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id })),
      ]);
      expect(rb.status).toBe(200);
      expect([200, 409]).toContain(ex.status);
      expect(Date.now() - started).toBeLessThan(15_000);
    }
    expect((await s.exec(inst.id, { command: 'cat /root/v', session: 'main' })).stdout).toBe('base\n');
  });

  it('an exec whose agent connection drops still answers, with the command\'s real result', async () => {
    const inst = await s.instance({ name: 'dropper' });
    const sb = s.engine.sandbox(inst.id)!;
    const pending = s.api('POST', `/instances/${inst.id}/exec`, { command: 'sleep 0.5; echo done', timeout_ms: 60_000 });
    await sleep(200);
    (sb as unknown as { client: { socket: { destroy(): void } } }).client.socket.destroy();
    const r = await pending;
    expect(r.status).toBe(200);
    expect(r.body.stdout).toBe('done\n');
  });

  it('an exec on a frozen agent ends at its timeout plus a grace, not never', async () => {
    const inst = await s.instance({ name: 'frozen' });
    const sb = s.engine.sandbox(inst.id)!;
    await s.exec(inst.id, { command: 'true' });
    process.kill(sb.pid, 'SIGSTOP');
    try {
      const started = Date.now();
      const r = await s.api('POST', `/instances/${inst.id}/exec`, { command: 'echo never', timeout_ms: 500 });
      expect(r.status).toBe(503);
      expect(Date.now() - started).toBeLessThan(500 + 5000 + 2000);
    } finally {
      process.kill(sb.pid, 'SIGCONT');
    }
    expect((await s.exec(inst.id, { command: 'echo thawed' })).stdout).toBe('thawed\n');
  });
});

describe('finding 8: a fork racing the deletion of its source', () => {
  it('ends defined: forks run and hold their data, or the call answers 404/409; no instance is left in error', async () => {
    for (let round = 0; round < 4; round++) {
      const src = await s.instance({ name: `source-${round}` });
      await s.exec(src.id, { command: 'echo data > /root/f; cd /tmp && export V=7', session: 'main' });
      const ck = (await s.api('POST', `/instances/${src.id}/checkpoints?wait=true`, {})).body;
      const [fork, delCk, delInst] = await Promise.all([
        s.api('POST', `/instances/${src.id}/fork`, { checkpoint_id: ck.id, count: 3 }),
        sleep(round * 4).then(() => s.api('DELETE', `/instances/${src.id}/checkpoints/${ck.id}`)),
        sleep(round * 8).then(() => s.api('DELETE', `/instances/${src.id}`)),
      ]);
      expect([201, 404, 409], JSON.stringify(fork.body)).toContain(fork.status);
      expect([204, 404, 409]).toContain(delCk.status);
      expect([204, 409]).toContain(delInst.status);
      if (fork.status === 201) {
        for (const f of fork.body.instances) {
          expect((await s.exec(f.id, { command: 'cat /root/f; pwd; echo $V', session: 'main' })).stdout).toBe('data\n/tmp\n7\n');
          await s.api('DELETE', `/instances/${f.id}`);
        }
      }
      if (delInst.status === 409) expect((await s.api('DELETE', `/instances/${src.id}`)).status).toBe(204);
      const all = (await s.api('GET', '/instances?limit=500')).body.items as { status: string; name: string }[];
      expect(all.filter((i) => i.status === 'error')).toEqual([]);
    }
  });
});
