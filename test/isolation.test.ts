import { existsSync, watch } from 'node:fs';
import { mkdtemp, readdir, writeFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execa } from 'execa';
import { sleep, startServer, type TestServer } from './helpers/server.js';

/** The devices controller is cgroup v1's; on v2 device access needs a BPF program (not done). */
const s_cgroupV1 = () => !existsSync('/sys/fs/cgroup/cgroup.controllers');

let s: TestServer;
let a: string;
let b: string;
beforeAll(async () => {
  s = await startServer();
  [a, b] = (await Promise.all([s.instance({ name: 'alpha' }), s.instance({ name: 'beta' })])).map((i) => i.id);
});
afterAll(async () => s?.close());

describe('isolation', () => {
  it('two instances cannot see each other\'s files or processes', async () => {
    await s.exec(a, { command: 'echo secret > /root/alpha.txt' });
    await s.api('POST', `/instances/${a}/processes`, { command: 'exec sleep 1234' });
    const r = await s.exec(b, { command: 'ls /root; ps -o args; hostname' });
    expect(r.stdout).not.toContain('alpha.txt');
    expect(r.stdout).not.toContain('sleep 1234');
    expect(r.stdout).toContain('beta');
  });

  it('a sandbox has its own pid namespace: PID 1 is the agent', async () => {
    const r = await s.exec(a, { command: 'cat /proc/1/cmdline | tr "\\0" " "; echo; ps -o pid,args | wc -l' });
    expect(r.stdout.split('\n')[0]).toBe('fp-agent init ');
    expect(Number(r.stdout.split('\n')[1])).toBeLessThan(10);
  });

  it('cannot see host files or host processes', async () => {
    const marker = `/tmp/forkpoint-host-marker-${process.pid}`;
    await writeFile(marker, 'host');
    try {
      const r = await s.exec(a, { command: `ls ${marker}; ps -o args | grep -c "[v]itest"; true` });
      expect(r.stderr).toMatch(/No such file/);
      expect(r.stdout.trim()).toBe('0');
      const fs = await s.exec(a, { command: 'cat /proc/self/mountinfo' });
      expect(fs.stdout).not.toContain(s.dataDir);
    } finally {
      await rm(marker);
    }
  });

  it('has its own loopback and one link of its own, and the host\'s loopback is not its', async () => {
    const r = await s.exec(a, { command: 'cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d " "' });
    expect(r.stdout.trim().split('\n').sort()).toEqual(['eth0', 'lo']);
    const port = new URL(s.url).port;
    const reach = await s.exec(a, { command: `nc -w 1 127.0.0.1 ${port} </dev/null; echo rc=$?` });
    expect(reach.stdout).toContain('rc=1');
    const lo = await s.exec(a, { command: '(nc -l -p 7000 -e echo pong &) ; sleep 0.2; nc 127.0.0.1 7000 </dev/null' });
    expect(lo.stdout).toBe('pong\n');
  });

  it('cannot mount, mknod a device, or regain privileges', async () => {
    const m = await s.exec(a, { command: 'mkdir -p /mnt/x && mount -t tmpfs none /mnt/x' });
    expect(m.exit_code).not.toBe(0);
    const n = await s.exec(a, { command: 'mknod /tmp/mem c 1 1' });
    expect(n.exit_code).not.toBe(0);
    const caps = await s.exec(a, { command: 'grep -E "CapBnd|NoNewPrivs" /proc/self/status' });
    const bnd = BigInt('0x' + /CapBnd:\s+([0-9a-f]+)/.exec(caps.stdout)![1]);
    for (const cap of [21 /* SYS_ADMIN */, 16 /* SYS_MODULE */, 17 /* SYS_RAWIO */, 27 /* MKNOD */, 19 /* SYS_PTRACE */, 12 /* NET_ADMIN */]) {
      expect(bnd & (1n << BigInt(cap))).toBe(0n);
    }
    // In its own user namespace (the default) a set-user-id program may reach the sandbox's
    // root (sudo), never more: NoNewPrivs is left off there, as Docker leaves it.
    expect(caps.stdout).toMatch(/NoNewPrivs:\s+0/);
  });

  it.runIf(s_cgroupV1())('opens only the standard devices, even ones an image carries', async () => {
    // An image made (or imported) on the host may hold any device node: here the host's
    // console, which root in the sandbox could otherwise open for writing.
    const image = s.engine.layout.image('withdev');
    await execa('cp', ['-a', s.engine.layout.image('default'), image]);
    await execa('mknod', [join(image, 'console'), 'c', '5', '1']);
    const inst = await s.instance({ image: 'withdev' });
    const probe = 'true >/console; echo console=$?; true >/dev/null; echo null=$?; head -c 4 /dev/urandom | wc -c';
    const r = await s.exec(inst.id, { command: probe });
    expect(r.stdout).toBe('console=1\nnull=0\n4\n');
    expect(r.stderr).toMatch(/console: Operation not permitted/);
    // and so after a checkpoint and a restore
    const ck = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true });
    expect(ck.body.status).toBe('ready');
    expect((await s.exec(inst.id, { command: probe })).stdout).toBe('console=1\nnull=0\n4\n');
    await s.api('DELETE', `/instances/${inst.id}`);
  });
});

describe('the host is never reached through the sandbox\'s own files', () => {
  it('symlinks planted in /.fp lead nowhere on the host', async () => {
    const target = await mkdtemp(join(tmpdir(), 'forkpoint-escape-'));
    // Anything created there, even if removed again afterwards, is an escape.
    const seen: string[] = [];
    const watcher = watch(target, (_event, name) => seen.push(String(name)));
    try {
      const inst = await s.instance({ name: 'sneaky' });
      await s.exec(inst.id, { command: 'true', session: 'main' });
      await s.exec(inst.id, { command: `rm -rf /.fp/run /.fp/sessions && ln -s ${target} /.fp/run && ln -s ${target}/sessions /.fp/sessions` });
      const r = await s.api('POST', `/instances/${inst.id}/exec`, { command: 'echo hi', session: 'other' });
      expect(r.status).toBeLessThan(500);
      await sleep(100);
      expect(seen).toEqual([]);
      expect(await readdir(target)).toEqual([]);
      // The socket too: replaced by a link to a host socket, the engine refuses to follow it.
      await s.exec(inst.id, { command: `ln -sf ${target}/fake.sock /.fp/agent.sock.new && mv -f /.fp/agent.sock.new /.fp/agent.sock` });
      await s.api('POST', `/instances/${inst.id}/processes`, { command: 'true' }).catch(() => undefined);
      expect(await readdir(target)).toEqual([]);
    } finally {
      watcher.close();
      await rm(target, { recursive: true, force: true });
    }
  });
});

describe('resource limits', () => {
  it('a fork bomb is stopped by the pids limit and the server stays up', async () => {
    const bomb = await s.instance({ name: 'bomb', limits: { pids: 64 } });
    const pid = s.engine.sandbox(bomb.id)!.pid;
    await s.exec(bomb.id, { command: 'b() { b | b & }; b; sleep 3', timeout_ms: 3000 });
    expect((await s.engine.cgroups.events(bomb.id)).pidsRefused).toBeGreaterThan(0);
    expect((await s.api('GET', '/healthz', undefined, {})).status).toBe(200);
    expect((await s.exec(a, { command: 'echo alive' })).stdout).toBe('alive\n');
    expect((await s.api('DELETE', `/instances/${bomb.id}`)).status).toBe(204);
    expect(existsSync(`/proc/${pid}`)).toBe(false);
  });

  it('a memory hog is killed by the memory limit; the sandbox and server live on', async () => {
    const hog = await s.instance({ name: 'hog', limits: { memory_mb: 64 } });
    const r = await s.exec(hog.id, { command: 'x=$(head -c 300000000 /dev/zero | tr "\\0" a); echo survived ${#x}', timeout_ms: 30_000 });
    expect(r.stdout).not.toContain('survived');
    expect(r.exit_code).not.toBe(0);
    expect((await s.exec(hog.id, { command: 'echo still here' })).stdout).toBe('still here\n');
    expect((await s.api('GET', '/healthz', undefined, {})).status).toBe(200);
    const events = await s.engine.cgroups.events(hog.id);
    expect(events.oomKills).toBeGreaterThan(0);
  });
});
