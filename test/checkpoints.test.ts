import { lstatSync, readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildAttackKit, installKit, KIT, type AttackKit } from './helpers/attack-kit.js';
import { eventually, sleep, startServer, type TestServer } from './helpers/server.js';

let s: TestServer;
let kit: Promise<AttackKit>;
beforeAll(async () => {
  kit = buildAttackKit();
  s = await startServer();
});
afterAll(async () => {
  await s?.close();
  await (await kit).cleanup();
});

const checkpoint = async (id: string, body: Record<string, unknown> = {}) => {
  const r = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, body);
  if (r.status !== 200 || r.body.status !== 'ready') throw new Error(`checkpoint: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
};
const rollback = async (id: string, checkpointId: string) => {
  const r = await s.api('POST', `/instances/${id}/rollback`, { checkpoint_id: checkpointId });
  if (r.status !== 200) throw new Error(`rollback: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
};
const counter = async (id: string) => Number((await s.exec(id, { command: 'cat /tmp/n' })).stdout);
const startCounter = (id: string) =>
  s.api('POST', `/instances/${id}/processes`, { command: 'i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done' });

describe('checkpoint → change → rollback', () => {
  it('brings back files and memory: the counter continues from its checkpointed value, the shell has its cwd and variables', async () => {
    const inst = await s.instance({ name: 'roller' });
    await s.exec(inst.id, { command: 'echo original > /root/a; echo keep > /root/b' });
    await s.exec(inst.id, { command: 'cd /etc && export MOOD=calm', session: 'main' });
    await startCounter(inst.id);
    await sleep(300);
    const ck = await checkpoint(inst.id, { label: 'calm' });
    expect(ck).toMatchObject({ status: 'ready', memory: true, label: 'calm', instance_id: inst.id });
    expect(ck.memory_bytes).toBeGreaterThan(0);
    const atCheckpoint = Number(await s.engine.layout.layer((await s.fp.store.checkpoints.get(ck.id))!.layers[0]!) && (await import('node:fs')).readFileSync(join(s.engine.layout.layer((await s.fp.store.checkpoints.get(ck.id))!.layers[0]!), 'tmp/n'), 'utf8'));
    await s.exec(inst.id, { command: 'echo changed > /root/a; rm /root/b; echo new > /root/c' });
    await s.exec(inst.id, { command: 'cd / && export MOOD=angry', session: 'main' });
    await eventually(async () => (await counter(inst.id)) > atCheckpoint + 3, 5_000);

    const after = await rollback(inst.id, ck.id);
    expect(after.status).toBe('running');
    expect(after.head_checkpoint_id).toBe(ck.id);
    const files = await s.exec(inst.id, { command: 'cat /root/a /root/b; ls /root' });
    expect(files.stdout).toBe('original\nkeep\na\nb\n');
    const shell = await s.exec(inst.id, { command: 'pwd; echo $MOOD', session: 'main' });
    expect(shell.stdout).toBe('/etc\ncalm\n');
    const resumed = await counter(inst.id);
    expect(resumed).toBeGreaterThanOrEqual(atCheckpoint);
    expect(resumed).toBeLessThan(atCheckpoint + 8);
    await eventually(async () => (await counter(inst.id)) > resumed, 5_000); // still running
  });

  it('two rollbacks in a row, in both directions', async () => {
    const inst = await s.instance({ name: 'pingpong' });
    await s.exec(inst.id, { command: 'echo 1 > /root/v' });
    const one = await checkpoint(inst.id, { label: 'one' });
    await s.exec(inst.id, { command: 'echo 2 > /root/v; touch /root/only-two' });
    const two = await checkpoint(inst.id, { label: 'two' });
    expect(two.parent_id).toBe(one.id);
    await s.exec(inst.id, { command: 'echo 3 > /root/v' });
    const read = async () => (await s.exec(inst.id, { command: 'cat /root/v; ls /root' })).stdout;
    await rollback(inst.id, one.id);
    expect(await read()).toBe('1\nv\n');
    await rollback(inst.id, two.id);
    expect(await read()).toBe('2\nonly-two\nv\n');
    await rollback(inst.id, one.id);
    expect(await read()).toBe('1\nv\n');
    await rollback(inst.id, one.id);
    expect(await read()).toBe('1\nv\n');
  });

  it('a files-only checkpoint rolls back to its files on a fresh boot', async () => {
    const inst = await s.instance({ name: 'disky' });
    await s.exec(inst.id, { command: 'echo disk > /root/f' });
    await startCounter(inst.id);
    const ck = await checkpoint(inst.id, { memory: false });
    expect(ck.memory).toBe(false);
    expect(ck.memory_bytes).toBe(0);
    expect((await s.exec(inst.id, { command: 'echo $((1+1))' })).stdout).toBe('2\n'); // ran on through it
    await s.exec(inst.id, { command: 'rm /root/f' });
    await rollback(inst.id, ck.id);
    const r = await s.exec(inst.id, { command: 'cat /root/f; ps -o args | grep -c "[w]hile true"' });
    expect(r.stdout).toBe('disk\n0\n');
  });
});

describe('a files-only checkpoint of a small upper', () => {
  it('copies it in a freeze, no CRIU: the processes run on untouched, and the copy is the upper exactly', async () => {
    const inst = await s.instance({ name: 'copied' });
    await startCounter(inst.id);
    const made = await s.exec(inst.id, {
      command: [
        'echo one > /root/a && ln /root/a /root/a2 && ln -s /etc/shadow /root/evil && mkfifo /root/fifo',
        'truncate -s 10G /root/sparse && echo tail >> /root/sparse',
        'echo owned > /root/owned && chown 1234:1234 /root/owned && chmod 4755 /root/owned',
        'rm /etc/nsswitch.conf && rm -rf /etc/skel && mkdir /etc/skel && echo n > /etc/skel/new',
      ].join(' && '),
    });
    expect(made.exit_code, made.stderr).toBe(0);
    const sb = s.engine.sandbox(inst.id)!;
    const [pid, startTime] = [sb.pid, sb.startTime];
    const ck = await checkpoint(inst.id, { memory: false });
    // Not dumped and restored: the same processes (a restore has new host pids).
    expect([s.engine.sandbox(inst.id)!.pid, s.engine.sandbox(inst.id)!.startTime]).toEqual([pid, startTime]);
    expect(ck.pause_ms).toBeGreaterThan(0);
    const upper = s.engine.layout.upper(inst.id);
    expect(readFileSync(join(upper, 'root/a'), 'utf8')).toBe('one\n'); // the instance keeps its upper
    const layer = s.engine.layout.layer((await s.fp.store.checkpoints.get(ck.id))!.layers[0]!);
    // Seen from the host: a symlink stays one (never followed), a sparse file stays sparse, ids stay canonical.
    expect(lstatSync(join(layer, 'root/evil')).isSymbolicLink()).toBe(true);
    expect(statSync(join(layer, 'root/sparse')).blocks * 512).toBeLessThan(1024 * 1024);
    expect(statSync(join(layer, 'root/owned')).uid).toBe(1234);
    const c0 = await counter(inst.id);
    await eventually(async () => (await counter(inst.id)) > c0, 5_000);

    await s.exec(inst.id, { command: 'echo two > /root/a; rm /root/evil /root/fifo; echo back > /etc/nsswitch.conf; rm /etc/skel/new; echo later > /root/later' });
    await rollback(inst.id, ck.id);
    const r = await s.exec(inst.id, {
      command: [
        'cat /root/a; stat -c %h /root/a; readlink /root/evil; test -p /root/fifo && echo fifo',
        'stat -c %s /root/sparse; tail -c 5 /root/sparse; stat -c "%u:%g %a" /root/owned',
        'test -e /etc/nsswitch.conf || echo whiteout; ls -A /etc/skel; test -e /root/later || echo no-later',
      ].join('; '),
    });
    expect(r.stdout).toBe(['one', '2', '/etc/shadow', 'fifo', '10737418245', 'tail', '1234:1234 4755', 'whiteout', 'new', 'no-later', ''].join('\n'));
  });
});

describe('a memory checkpoint of a small upper', () => {
  it('is dumped with the processes left running (no restore), and its files and memory are of one moment: a fork and a rollback go on exactly where it was', async () => {
    const inst = await s.instance({ name: 'dumped-running' });
    // Each step counts in memory, then appends the count to a file: a copy of the upper taken
    // at another moment than the memory dump would show as a gap or a repeat in the log.
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'i=0; while true; do i=$((i+1)); echo $i >> /root/log; sleep 0.005; done' });
    await eventually(async () => Number((await s.exec(inst.id, { command: 'wc -l < /root/log' })).stdout) > 20);
    const sb = s.engine.sandbox(inst.id)!;
    const [pid, startTime] = [sb.pid, sb.startTime];
    const ck = await checkpoint(inst.id, { memory: true });
    expect(ck.memory_bytes).toBeGreaterThan(0);
    // The same processes (a restore has new host pids), and the instance keeps its upper.
    expect([s.engine.sandbox(inst.id)!.pid, s.engine.sandbox(inst.id)!.startTime]).toEqual([pid, startTime]);
    const contiguous = async (id: string) => {
      await sleep(100);
      const lines: number[] = (await s.exec(id, { command: 'cat /root/log' })).stdout.trim().split('\n').map(Number);
      expect(lines.length).toBeGreaterThan(20);
      expect(lines.every((n, i) => n === i + 1), `not contiguous: ${lines.filter((n, i) => n !== i + 1).slice(0, 3).join(',')}`).toBe(true);
      return lines.length;
    };
    const f = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id });
    expect(f.status, JSON.stringify(f.body)).toBe(201);
    await contiguous(f.body.id);
    await s.exec(inst.id, { command: 'echo later > /root/later' });
    await rollback(inst.id, ck.id);
    expect(s.engine.sandbox(inst.id)!.pid).not.toBe(pid); // now restored from the dump
    await contiguous(inst.id);
    expect((await s.exec(inst.id, { command: 'test -e /root/later || echo gone' })).stdout).toBe('gone\n');

    // Past what a memory checkpoint copies (a copy repeats the upper since its last rename), the
    // upper is frozen by rename: dumped and restored, and the next checkpoint's layer is small.
    await s.exec(inst.id, { command: 'head -c 300000 /dev/urandom > /root/big' });
    const restored = s.engine.sandbox(inst.id)!.pid;
    const big = await checkpoint(inst.id);
    expect(big.delta_bytes).toBeGreaterThan(300000);
    expect(s.engine.sandbox(inst.id)!.pid).not.toBe(restored);
    const next = await checkpoint(inst.id);
    expect(next.delta_bytes).toBeLessThan(100000);
    await contiguous(inst.id);
  });
});

describe('what CRIU reads of a task through its parasite', () => {
  it('signal handlers and timers come back in a fork and a rollback: a running interval timer, a virtual one, a POSIX one, SA_RESTART', async () => {
    const inst = await s.instance({ name: 'timers' });
    await installKit(s, inst.id, await kit);
    await s.api('POST', `/instances/${inst.id}/processes`, { command: `exec ${KIT} timers /tmp` });
    const state = async (id: string) => {
      const line = (await s.exec(id, { command: 'cat /tmp/timers 2>/dev/null || true' })).stdout.trim();
      const m = /^(\d+) (.*)$/.exec(line);
      return { alarms: m ? Number(m[1]) : 0, rest: m?.[2] };
    };
    await eventually(async () => (await state(inst.id)).alarms > 3);
    const ck = await checkpoint(inst.id, { memory: true });
    const expectTicking = async (id: string) => {
      const before = await state(id);
      expect(before.rest).toBe('usr1=1 restart=1 virtual=7 posix=3');
      // The 20 ms interval timer fires on after the restore: the count goes on from the copy's.
      await eventually(async () => (await state(id)).alarms > before.alarms + 3);
    };
    const f = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id });
    expect(f.status, JSON.stringify(f.body)).toBe(201);
    await expectTicking(f.body.id);
    await rollback(inst.id, ck.id);
    await expectTicking(inst.id);
  });
});

describe('checkpoint jobs', () => {
  it('a closed connection is closed on the agent\'s side too before anything is dumped', async () => {
    // A warm CRIU dumps within a millisecond of the pause: a socket the host has let go of
    // but the agent has not yet closed would fail the dump ("Unix socket N not found").
    const inst = await s.instance();
    const sb = s.engine.sandbox(inst.id)!;
    const agentSockets = () =>
      readdirSync(`/proc/${sb.pid}/fd`).map((fd) => { try { return readlinkSync(`/proc/${sb.pid}/fd/${fd}`); } catch { return ''; } }).filter((l) => l.startsWith('socket:'));
    const before = new Set(agentSockets());
    const c = await sb.sideAgent();
    const ours = await eventually(async () => agentSockets().filter((x) => !before.has(x)).pop());
    // With the agent stopped it cannot close its end, so close() must not be done yet.
    process.kill(sb.pid, 'SIGSTOP');
    let done = false;
    const closing = c.close().then(() => (done = true));
    try {
      await sleep(300);
      expect(done).toBe(false);
    } finally {
      process.kill(sb.pid, 'SIGCONT');
    }
    await closing;
    expect(agentSockets()).not.toContain(ours);
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('answers 202 processing, then becomes ready; exec during the checkpoint waits and succeeds', async () => {
    const inst = await s.instance({ name: 'busy' });
    const long = s.exec(inst.id, { command: 'sleep 0.5; echo carried through' });
    await sleep(100);
    const started = await s.api('POST', `/instances/${inst.id}/checkpoints`, { label: 'async' });
    expect(started.status).toBe(202);
    expect(started.body.status).toBe('processing');
    const early = await s.api('DELETE', `/instances/${inst.id}/checkpoints/${started.body.id}`);
    expect(early.status).toBe(409);
    expect(early.body.error.code).toBe('CONFLICT');
    // Calls keep arriving all through the pause: every one waits and succeeds.
    const calls: Promise<any>[] = [];
    let i = 0;
    while ((await s.fp.store.checkpoints.get(started.body.id))!.status === 'processing' && i < 400) {
      calls.push(s.exec(inst.id, { command: `echo during-${i}` }));
      i++;
      await sleep(2);
    }
    const results = await Promise.all(calls);
    results.forEach((r, k) => expect(r).toMatchObject({ exit_code: 0, stdout: `during-${k}\n` }));
    expect((await long).stdout).toBe('carried through\n');
    const done = await s.api('GET', `/instances/${inst.id}/checkpoints/${started.body.id}?wait=true`);
    expect(done.body.status).toBe('ready');
    expect(done.body.delta_bytes).toBeGreaterThanOrEqual(0);
  });

  it('a dump that fails ends `failed` with a reason, and the instance runs on unharmed', async () => {
    const inst = await s.instance({ name: 'unlucky' });
    await s.exec(inst.id, { command: 'echo fine > /root/f' });
    // A file lock: CRIU refuses to dump one without --file-locks.
    await installKit(s, inst.id, await kit);
    // The kit (a static binary, more than a memory checkpoint copies) is frozen into a layer
    // first: the doomed checkpoint's upper is small, copied while CRIU dumps beside it.
    await checkpoint(inst.id);
    await s.api('POST', `/instances/${inst.id}/processes`, { command: `${KIT} holdlock /root/lock` });
    await eventually(async () => (await s.exec(inst.id, { command: 'cat /proc/locks' })).stdout.includes('FLOCK'));
    const pid = s.engine.sandbox(inst.id)!.pid;
    const layers = readdirSync(s.engine.layout.layers).sort();
    const r = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { label: 'doomed' });
    expect(r.body.status).toBe('failed');
    expect(r.body.error).toMatch(/criu dump failed: .*lock/i);
    expect(s.engine.sandbox(inst.id)!.pid).toBe(pid);
    expect(readdirSync(s.engine.layout.layers).sort()).toEqual(layers); // the copy made beside the dump is gone
    expect((await s.api('GET', `/instances/${inst.id}`)).body.status).toBe('running');
    expect((await s.exec(inst.id, { command: 'cat /root/f; grep -c FLOCK /proc/locks' })).stdout).toBe('fine\n1\n');
    expect((await s.api('GET', `/instances/${inst.id}/checkpoints`)).body.items[0].status).toBe('failed');
  });

  it('an idle instance that cannot be hibernated is not dumped again at every idle timeout: it backs off', async () => {
    const inst = await s.instance({ name: 'unsleeping' });
    await installKit(s, inst.id, await kit);
    await s.api('POST', `/instances/${inst.id}/processes`, { command: `${KIT} holdlock /root/lock` });
    await eventually(async () => (await s.exec(inst.id, { command: 'cat /proc/locks' })).stdout.includes('FLOCK'));
    const engine = s.engine;
    const real = engine.hibernate.bind(engine);
    let tries = 0;
    engine.hibernate = async (...args: Parameters<typeof engine.hibernate>) => {
      if (args[0].id === inst.id) tries++;
      return real(...args);
    };
    try {
      expect((await s.api('PATCH', `/instances/${inst.id}`, { idle_timeout_s: 1 })).status).toBe(200);
      await sleep(6000);
      // Once, then not before its backoff (30 s); it used to be every ~1.3 s.
      expect(tries).toBe(1);
      expect((await s.api('GET', `/instances/${inst.id}`)).body.status).toBe('running');
    } finally {
      engine.hibernate = real;
      await s.api('DELETE', `/instances/${inst.id}`);
    }
  });

  it('an established TCP connection is no reason to fail: the checkpoint is ready and the connection goes on', async () => {
    const inst = await s.instance({ name: 'connected' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'sleep 600 | nc -l -p 9000 > /root/received' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'sleep 0.2; (echo before; sleep 2; echo after) | nc 127.0.0.1 9000' });
    await eventually(async () => (await s.exec(inst.id, { command: 'netstat -tn' })).stdout.includes('ESTABLISHED'));
    const r = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { label: 'with a connection' });
    expect(r.body.error ?? null).toBeNull();
    expect(r.body.status).toBe('ready');
    await eventually(async () => (await s.exec(inst.id, { command: 'cat /root/received' })).stdout === 'before\nafter\n', 5000);
  });

  it('enforces the per-instance limit; delete_oldest retention makes room', async () => {
    const inst = await s.instance({ name: 'limited', max_checkpoints: 2 });
    const a = await checkpoint(inst.id, { memory: false });
    await checkpoint(inst.id, { memory: false });
    const refused = await s.api('POST', `/instances/${inst.id}/checkpoints`, { memory: false });
    expect(refused.status).toBe(429);
    expect(refused.body.error.code).toBe('QUOTA_EXCEEDED');
    const c = await checkpoint(inst.id, { memory: false, retention: { mode: 'delete_oldest' } });
    const ids = (await s.api('GET', `/instances/${inst.id}/checkpoints`)).body.items.map((x: { id: string }) => x.id);
    expect(ids).toHaveLength(2);
    expect(ids).toContain(c.id);
    expect(ids).not.toContain(a.id);
  });

  it('a rollback racing the retention that would delete its checkpoint: the rollback lands, retention takes another, nothing ends in error', async () => {
    const inst = await s.instance({ name: 'raced', max_checkpoints: 3 });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'n=0; while true; do n=$((n+1)); echo $n > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done' });
    const first = await checkpoint(inst.id, { memory: true });
    await checkpoint(inst.id, { memory: true });
    // A checkpoint in flight holds the instance; the rollback to the oldest chooses it and waits;
    // a third checkpoint asks retention for room, and the oldest ready one is the rollback's.
    const inFlight = s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true });
    await sleep(5);
    const rolled = s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: first.id });
    await sleep(5);
    const third = s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true, retention: { mode: 'delete_oldest' } });
    const [a, r, c] = await Promise.all([inFlight, rolled, third]);
    expect([a.status, a.body.status]).toEqual([200, 'ready']);
    // 404 only if retention took it before the rollback chose it (the sleeps make that rare).
    expect([200, 404], JSON.stringify(r.body)).toContain(r.status);
    expect([c.status, c.body.status], JSON.stringify(c.body)).toEqual([200, 'ready']);
    const now = (await s.api('GET', `/instances/${inst.id}`)).body;
    expect([now.status, now.error]).toEqual(['running', null]);
    const ids = ((await s.api('GET', `/instances/${inst.id}/checkpoints`)).body.items as { id: string }[]).map((x) => x.id);
    if (r.status === 200) expect(ids).toContain(first.id); // chosen, it stays: retention took another
    expect(ids).toHaveLength(3);
  });

  it('copies no file data: the frozen layer holds the very inode, and the disk barely grows', async () => {
    const inst = await s.instance({ name: 'bigfile' });
    await s.exec(inst.id, { command: 'head -c 67108864 /dev/urandom > /root/big', timeout_ms: 30_000 });
    const upperFile = join(s.engine.layout.upper(inst.id), 'root/big');
    const inode = statSync(upperFile).ino;
    const before = await s.engine.diskUsage(s.dataDir);
    const ck = await checkpoint(inst.id, { memory: false });
    const layer = (await s.fp.store.checkpoints.get(ck.id))!.layers[0]!;
    expect(statSync(join(s.engine.layout.layer(layer), 'root/big')).ino).toBe(inode);
    const grown = (await s.engine.diskUsage(s.dataDir)) - before;
    expect(grown).toBeLessThan(64 * 1024 * 1024 * 0.1);
    expect(ck.delta_bytes).toBeGreaterThanOrEqual(64 * 1024 * 1024);
  });
});

describe('CRIU\'s raised priority', () => {
  it('stays with CRIU: what it restores runs at its own nice values, none at CRIU\'s', async () => {
    const inst = await s.instance({ name: 'niced' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'renice -n 5 -p $$ > /dev/null && exec sleep 100000' });
    const nices = async (id: string) => (await s.exec(id, { command: "awk '{ print $19 }' /proc/[0-9]*/stat | sort -un" })).stdout;
    await eventually(async () => (await nices(inst.id)) === '0\n5\n');
    const ck = await checkpoint(inst.id);
    expect(await nices(inst.id)).toBe('0\n5\n');
    const f = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id });
    expect(f.status).toBe(201);
    expect(await nices(f.body.id)).toBe('0\n5\n');
    // And seen from the host, CRIU's own workers run above the sandboxes.
    const criu = readdirSync('/proc').filter((p) => /^\d+$/.test(p)).filter((p) => {
      try {
        const argv = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
        return argv[0] === s.engine.criu.path && argv.includes('swrk');
      } catch {
        return false;
      }
    });
    expect(criu.length).toBeGreaterThan(0);
    for (const p of criu) expect(readFileSync(`/proc/${p}/stat`, 'utf8').replace(/^.*\) /, '').split(' ')[16]).toBe('-10');
  });
});

describe('a pause\'s short scheduler slices', () => {
  // For the pause, CRIU, its relay and every thread of the frozen sandbox get the kernel's
  // shortest slice (native/sched_slice.c): on busy CPUs each then wakes without waiting for
  // another task's slice to end. The sandbox's threads must have their own back afterwards.
  it('are the pause\'s alone: after checkpoints each thread of the sandbox has its slice back, one it chose itself included', async () => {
    const inst = await s.instance({ name: 'sliced' });
    await installKit(s, inst.id, await kit);
    // The kit (~1 MB) into a layer of its own, so that the checkpoints below copy a small upper
    // and leave the processes running (a larger upper is renamed, the processes restored).
    await checkpoint(inst.id);
    await s.api('POST', `/instances/${inst.id}/processes`, { command: `exec ${KIT} slice 500000` });
    const sliceOf = (path: string) => Number(/^se\.slice\s+:\s+(\d+)/m.exec(readFileSync(path, 'utf8'))![1]);
    const threads = () =>
      readFileSync(join(s.engine.cgroups.freezerDir(inst.id), 'tasks'), 'utf8').trim().split('\n').sort()
        .map((tid) => ({ tid, comm: readFileSync(`/proc/${tid}/comm`, 'utf8').trim(), slice: sliceOf(`/proc/${tid}/sched`) }));
    await eventually(async () => threads().some((t) => t.comm === 'attack'));
    const before = threads();
    const usual = sliceOf('/proc/self/sched'); // this process's: the kernel's default
    const chosen = before.find((t) => t.comm === 'attack')!.slice;
    // A kernel without slices of one's choosing (before Linux 6.12) refuses it: then all is usual.
    expect([500000, usual]).toContain(chosen);
    expect(before.filter((t) => t.comm !== 'attack').map((t) => t.slice)).toEqual(before.filter((t) => t.comm !== 'attack').map(() => usual));
    for (let i = 0; i < 3; i++) expect((await checkpoint(inst.id)).memory).toBe(true);
    expect(threads()).toEqual(before); // the same threads (left running), with the same slices
  });
});

describe('fork', () => {
  it('ten forks of one checkpoint run at once, isolated from each other and from the original', async () => {
    const inst = await s.instance({ name: 'parent' });
    await s.exec(inst.id, { command: 'echo shared > /root/base' });
    await startCounter(inst.id);
    const ck = await checkpoint(inst.id);
    const r = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id, count: 10 });
    expect(r.status).toBe(201);
    const forks: { id: string; name: string; source_checkpoint_id: string }[] = r.body.instances;
    expect(forks).toHaveLength(10);
    expect(new Set(forks.map((f) => f.id)).size).toBe(10);
    await Promise.all(forks.map((f, i) => s.exec(f.id, { command: `echo fork-${i} > /root/mine` })));
    const outs = await Promise.all(forks.map((f) => s.exec(f.id, { command: 'cat /root/base /root/mine; hostname' })));
    outs.forEach((o, i) => expect(o.stdout).toBe(`shared\nfork-${i}\n${forks[i]!.name}\n`));
    // Each fork carries the running counter on from the checkpoint.
    const first = await Promise.all(forks.map((f) => counter(f.id)));
    await sleep(300);
    const later = await Promise.all(forks.map((f) => counter(f.id)));
    later.forEach((n, i) => expect(n).toBeGreaterThan(first[i]!));
    expect((await s.exec(inst.id, { command: 'ls /root' })).stdout).toBe('base\n');
    expect(forks.every((f) => f.source_checkpoint_id === ck.id)).toBe(true);
    const pids = forks.map((f) => s.engine.sandbox(f.id)!.pid);
    expect(new Set(pids).size).toBe(10);
    await Promise.all(forks.map((f) => s.api('DELETE', `/instances/${f.id}`)));
  });

  it('without a checkpoint forks the current state; the original keeps running', async () => {
    const inst = await s.instance({ name: 'now' });
    await s.exec(inst.id, { command: 'cd /var && export WHERE=here', session: 'main' });
    const r = await s.api('POST', `/instances/${inst.id}/fork`, { name: 'now-copy' });
    expect(r.status).toBe(201);
    const fork = r.body; // without count: the instance itself
    expect(fork.name).toBe('now-copy');
    expect((await s.exec(fork.id, { command: 'pwd; echo $WHERE; hostname', session: 'main' })).stdout).toBe('/var\nhere\nnow-copy\n');
    expect((await s.exec(inst.id, { command: 'echo $WHERE', session: 'main' })).stdout).toBe('here\n');
  });

  it('a fork has its own checkpoints and forks: a tree three deep, shown by lineage', async () => {
    const root = await s.instance({ name: 'gen0' });
    await s.exec(root.id, { command: 'echo 0 > /root/gen' });
    const c0 = await checkpoint(root.id, { label: 'c0' });
    const f1 = (await s.api('POST', `/instances/${root.id}/fork`, { checkpoint_id: c0.id, name: 'gen1' })).body;
    await s.exec(f1.id, { command: 'echo 1 >> /root/gen' });
    const c1 = await checkpoint(f1.id, { label: 'c1' });
    expect(c1.parent_id).toBe(c0.id);
    const f2 = (await s.api('POST', `/instances/${f1.id}/fork`, { checkpoint_id: c1.id, name: 'gen2' })).body;
    await s.exec(f2.id, { command: 'echo 2 >> /root/gen' });
    const c2 = await checkpoint(f2.id, { label: 'c2' });
    const f3 = (await s.api('POST', `/instances/${f2.id}/fork`, { checkpoint_id: c2.id, name: 'gen3' })).body;
    expect((await s.exec(f3.id, { command: 'cat /root/gen' })).stdout).toBe('0\n1\n2\n');
    expect((await s.exec(root.id, { command: 'cat /root/gen' })).stdout).toBe('0\n');
    const tree = (await s.api('GET', `/instances/${root.id}/lineage`)).body;
    const path = [tree.id, tree.children[0].id, tree.children[0].children[0].id];
    expect(path).toEqual([root.id, c0.id, f1.id]);
    const gen2 = tree.children[0].children[0].children[0].children[0];
    expect(gen2.id).toBe(f2.id);
    expect(gen2.children[0].children[0].id).toBe(f3.id);
  });

  it('deleting a checkpoint a fork stands on keeps the fork working; its layers go with the last user', async () => {
    const inst = await s.instance({ name: 'origin' });
    await s.exec(inst.id, { command: 'echo payload > /root/p' });
    const ck = await checkpoint(inst.id);
    const layers = (await s.fp.store.checkpoints.get(ck.id))!.layers;
    const fork = (await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id })).body;
    expect((await s.api('DELETE', `/instances/${inst.id}/checkpoints/${ck.id}`)).status).toBe(204);
    expect((await s.exec(fork.id, { command: 'cat /root/p' })).stdout).toBe('payload\n');
    // The original goes too; the fork still stands on the layer.
    expect((await s.api('DELETE', `/instances/${inst.id}`)).status).toBe(204);
    expect((await s.exec(fork.id, { command: 'cat /root/p' })).stdout).toBe('payload\n');
    expect(statSync(s.engine.layout.layer(layers[0]!)).isDirectory()).toBe(true);
    const fork2 = (await s.api('POST', `/instances/${fork.id}/fork`, {})).body;
    expect((await s.exec(fork2.id, { command: 'cat /root/p' })).stdout).toBe('payload\n');
    expect((await s.api('DELETE', `/instances/${fork.id}`)).status).toBe(204);
    expect((await s.api('DELETE', `/instances/${fork2.id}`)).status).toBe(204);
    await eventually(async () => !(await s.fp.store.layers.all()).includes(layers[0]!));
  });

  it('refuses a checkpoint of another instance and a failed checkpoint', async () => {
    const a = await s.instance({ name: 'aa' });
    const b = await s.instance({ name: 'bb' });
    const ck = await checkpoint(a.id, { memory: false });
    expect((await s.api('POST', `/instances/${b.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(404);
    expect((await s.api('POST', `/instances/${b.id}/fork`, { checkpoint_id: ck.id })).status).toBe(404);
    expect((await s.api('DELETE', `/instances/${a.id}/checkpoints/ckpt_missing`)).status).toBe(404);
  });
});
