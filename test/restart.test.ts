import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { request } from 'undici';
import { createServer, type AddressInfo, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { linkPrefixOf } from '../src/lib/ipv4.js';
import { testSubnet } from './helpers/subnets.js';
import { ChildServer } from './helpers/child-server.js';

const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
import { eventually, overlaysUnder, sleep } from './helpers/server.js';

let dataDir: string;
let server: ChildServer | undefined;

afterEach(async () => {
  // Leave nothing behind: delete every instance through a live server, then the data.
  if (!server || server.proc.exitCode !== null) server = await ChildServer.start(dataDir);
  for (const i of (await server.api('GET', '/instances?limit=500')).body.items) await server.api('DELETE', `/instances/${i.id}`);
  await server.stop();
  server = undefined;
  expect(await overlaysUnder(dataDir)).toEqual([]);
  await rm(dataDir, { recursive: true, force: true });
});

const exec = async (s: ChildServer, id: string, body: Record<string, unknown>) => {
  const r = await s.api('POST', `/instances/${id}/exec`, body);
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body;
};

describe('one live server per data directory and per subnet', () => {
  it('a second server on the same data directory, on the same subnet, or on a subnet of the same link prefix refuses to start and touches nothing', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-restart-'));
    server = await ChildServer.start(dataDir);
    const inst = (await server.api('POST', '/instances', { name: 'first' })).body;
    await server.api('POST', `/instances/${inst.id}/processes`, { command: 'n=0; while true; do n=$((n+1)); echo $n > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.1; done' });
    const counter = async () => Number((await exec(server!, inst.id, { command: 'cat /tmp/c' })).stdout);
    const hostNet = async () => ({
      tables: (await execa('nft', ['list', 'tables'])).stdout.split('\n').sort(),
      lo: (await execa('ip', ['-4', '-o', 'addr', 'show', 'dev', 'lo'])).stdout.split('\n').map((l) => l.split(/\s+/)[3]).sort(),
    });
    await eventually(async () => (await counter()) > 0);
    const before = await hostNet();
    const gateway = `${testSubnet(dataDir).replace(/\.0\/24$/, '.1')}/32`;
    expect(before.lo).toContain(gateway);
    const table = `table inet forkpoint_${linkPrefixOf(testSubnet(dataDir))}`;
    expect(before.tables).toContain(table);
    const other = await mkdtemp(join(tmpdir(), 'forkpoint-second-'));
    try {
      // Another subnet whose link names and firewall table would be the first's (1 in 4,096).
      const twin = Array.from({ length: 128 * 256 }, (_, i) => `10.${i >> 8}.${i & 255}.0/24`).find((c) => linkPrefixOf(c) === linkPrefixOf(testSubnet(dataDir)))!;
      for (const [dir, cidr, what] of [[dataDir, testSubnet(other), 'the data directory'], [other, testSubnet(dataDir), "the sandboxes' subnet"], [other, twin, "the host links' prefix"]] as const) {
        const second = await execa(process.execPath, [CLI, 'serve', '--port', '0'], { env: { ...process.env, FORKPOINT_DATA_DIR: dir, FORKPOINT_NETWORK_CIDR: cidr }, reject: false, timeout: 60_000 });
        expect(second.exitCode, what).toBe(1);
        expect(second.stderr).toContain(`${what}`);
        expect(second.stderr).toContain('belongs to another live forkpoint server');
        expect(second.stdout).not.toContain('listening');
        // The first server's sandbox runs on, its network as it was.
        const c = await counter();
        await eventually(async () => (await counter()) > c);
        expect((await server.api('GET', `/instances/${inst.id}`)).body.status).toBe('running');
        // (Other servers of the suite may come and go meanwhile: only the first's are checked.)
        const after = await hostNet();
        expect(after.tables).toContain(table);
        expect(after.lo).toContain(gateway);
      }
    } finally {
      await rm(other, { recursive: true, force: true });
    }
  });
});

describe('a stop signal', () => {
  it('SIGTERM while a subprocess of the server is under way (an image pull that hangs) is a clean shutdown, not a death by the signal', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-sigterm-'));
    // A registry that takes connections and never answers: the pull's skopeo waits on it.
    const sockets: Socket[] = [];
    const registry = createServer((sk) => sockets.push(sk));
    await new Promise<void>((r) => registry.listen(0, '127.0.0.1', r));
    try {
      server = await ChildServer.start(dataDir);
      const { token } = server;
      const pid = server.proc.pid!;
      const pull = server.api('POST', '/images/pull', { reference: `127.0.0.1:${(registry.address() as AddressInfo).port}/hangs:1` }).catch(() => undefined);
      await eventually(async () => (await execa('pgrep', ['-P', String(pid), 'skopeo'], { reject: false })).exitCode === 0, 15_000);
      const exited = new Promise<[number | null, string | null]>((r) => server!.proc.once('exit', (code, signal) => r([code, signal])));
      server.proc.kill('SIGTERM');
      await sleep(200);
      // The pull fails once its registry is gone, and the shutdown, which waited for it, ends.
      for (const sk of sockets) sk.destroy();
      registry.close();
      expect(await exited).toEqual([0, null]);
      await pull;
      server = await ChildServer.start(dataDir, token); // for the clean-up after each test
    } finally {
      for (const sk of sockets) sk.destroy();
      registry.close();
    }
  });

  it('a stop ends though a client keeps an event stream open (the stream ends with it)', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-sigterm-'));
    server = await ChildServer.start(dataDir);
    const { token } = server;
    const inst = (await server.api('POST', '/instances', {})).body;
    const stream = await request(`${server.url}/instances/${inst.id}/events`, { headers: { authorization: `Bearer ${token}` } });
    expect(stream.statusCode).toBe(200);
    const ended = new Promise<void>((r) => {
      stream.body.on('error', () => r());
      stream.body.on('end', () => r());
      stream.body.resume();
    });
    const exited = new Promise<[number | null, string | null]>((r) => server!.proc.once('exit', (code, signal) => r([code, signal])));
    const t = Date.now();
    server.proc.kill('SIGTERM');
    expect(await exited).toEqual([0, null]);
    expect(Date.now() - t).toBeLessThan(30_000);
    await ended;
    server = await ChildServer.start(dataDir, token); // for the clean-up after each test
  });
});

describe('server restart', () => {
  it('re-adopts running sandboxes: processes, shell sessions and files carry on', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-restart-'));
    server = await ChildServer.start(dataDir);
    const inst = (await server.api('POST', '/instances', { name: 'survivor' })).body;
    await exec(server, inst.id, { command: 'cd /srv && export KEPT=yes', session: 'main' });
    const bg = (await server.api('POST', `/instances/${inst.id}/processes`, { command: 'while true; do date +%s%N >> /tmp/ticks; sleep 0.05; done' })).body;
    const pid = Number((await readFile(join(dataDir, 'instances', inst.id, 'run', 'pid'), 'utf8')).trim());
    // The server runs above its sandboxes (FORKPOINT_SERVER_NICE, -5); they start at 0.
    const niceOf = (p: number) => readFileSync(`/proc/${p}/stat`, 'utf8').replace(/^.*\) /, '').split(' ')[16];
    expect(niceOf(server.proc.pid!)).toBe('-5');
    expect((await exec(server, inst.id, { command: "awk '{ print $19 }' /proc/[0-9]*/stat | sort -u" })).stdout).toBe('0\n');
    const token = server.token;
    await server.stop('SIGTERM');
    expect(existsSync(`/proc/${pid}`)).toBe(true); // the sandbox outlives the server

    server = await ChildServer.start(dataDir, token);
    const after = (await server.api('GET', `/instances/${inst.id}`)).body;
    expect(after.status).toBe('running');
    expect((await exec(server, inst.id, { command: 'pwd; echo $KEPT', session: 'main' })).stdout).toBe('/srv\nyes\n');
    const n1 = Number((await exec(server, inst.id, { command: 'wc -l < /tmp/ticks' })).stdout);
    await sleep(300);
    expect(Number((await exec(server, inst.id, { command: 'wc -l < /tmp/ticks' })).stdout)).toBeGreaterThan(n1);
    expect((await server.api('GET', `/instances/${inst.id}/processes/${bg.process_id}`)).body.status).toBe('running');
  });

  it('kill -9 of the server in the middle of a checkpoint costs the sandbox nothing: it runs on, its counter goes on; the checkpoint is finished or failed with a reason', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-crash-'));
    server = await ChildServer.start(dataDir);
    const inst = (await server.api('POST', '/instances', { name: 'crashy' })).body;
    await exec(server, inst.id, { command: 'echo safe > /root/f' });
    await server.api('POST', `/instances/${inst.id}/processes`, { command: 'n=0; while true; do n=$((n+1)); echo $n > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done' });
    const good = (await server.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { label: 'good' })).body;
    expect(good.status).toBe('ready');
    // Enough dirty memory that the dump takes a while.
    await server.api('POST', `/instances/${inst.id}/processes`, { command: 'x=$(head -c 150000000 /dev/zero | tr "\\0" a); sleep 600' });
    await sleep(1500);
    const before = Number((await exec(server, inst.id, { command: 'cat /tmp/c' })).stdout);
    const started = (await server.api('POST', `/instances/${inst.id}/checkpoints`, { label: 'interrupted' })).body;
    await sleep(30);
    const token = server.token;
    await server.stop('SIGKILL');
    await sleep(3000); // let an orphaned criu finish whatever it was doing

    server = await ChildServer.start(dataDir, token);
    const cp = (await server.api('GET', `/instances/${inst.id}/checkpoints/${started.id}`)).body;
    expect(['ready', 'failed']).toContain(cp.status);
    if (cp.status === 'failed') expect(cp.error).toMatch(/server stopped/);
    expect((await server.api('GET', `/instances/${inst.id}`)).body.status).toBe('running');
    // The counter goes on from where it was, not from 0: the processes are the same ones.
    const after = Number((await exec(server, inst.id, { command: 'cat /tmp/c' })).stdout);
    expect(after).toBeGreaterThanOrEqual(before);
    await eventually(async () => Number((await exec(server!, inst.id, { command: 'cat /tmp/c' })).stdout) > after);
    expect((await exec(server, inst.id, { command: 'cat /root/f' })).stdout).toBe('safe\n');
    if (cp.status === 'ready') {
      // A finished checkpoint is as good as one that never saw a crash.
      const rb = await server.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: cp.id });
      expect(rb.status, JSON.stringify(rb.body)).toBe(200);
    }
    // The checkpoint taken before the crash is as good as ever.
    const rb = await server.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: good.id });
    expect(rb.status, JSON.stringify(rb.body)).toBe(200);
    expect((await exec(server, inst.id, { command: 'cat /root/f' })).stdout).toBe('safe\n');
  });

  it('kill -9 of the server in the middle of a hibernation costs the sandbox nothing: after the restart it wakes with its counter', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-crash-'));
    server = await ChildServer.start(dataDir);
    const inst = (await server.api('POST', '/instances', { name: 'sleepy' })).body;
    await server.api('POST', `/instances/${inst.id}/processes`, { command: 'n=0; while true; do n=$((n+1)); echo $n > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.05; done' });
    await server.api('POST', `/instances/${inst.id}/processes`, { command: 'x=$(head -c 150000000 /dev/zero | tr "\\0" a); sleep 600' });
    await sleep(1500);
    const before = Number((await exec(server, inst.id, { command: 'cat /tmp/c' })).stdout);
    const hibernating = server.api('POST', `/instances/${inst.id}/hibernate`).catch(() => undefined);
    await sleep(30);
    const token = server.token;
    await server.stop('SIGKILL');
    await hibernating;
    await sleep(3000); // let an orphaned criu finish whatever it was doing

    server = await ChildServer.start(dataDir, token);
    const status = (await server.api('GET', `/instances/${inst.id}`)).body.status;
    expect(['running', 'hibernated']).toContain(status);
    // An exec wakes a hibernated instance; the counter goes on from where it was.
    const after = Number((await exec(server, inst.id, { command: 'cat /tmp/c' })).stdout);
    expect(after).toBeGreaterThanOrEqual(before);
    await eventually(async () => Number((await exec(server!, inst.id, { command: 'cat /tmp/c' })).stdout) > after);
    expect((await server.api('GET', `/instances/${inst.id}`)).body.status).toBe('running');
  });

  it('kill -9 of the server in the middle of a rollback: after the restart the instance runs either as it was or as the rollback made it, files and processes of the same side', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-crash-'));
    server = await ChildServer.start(dataDir);
    const inst = (await server.api('POST', '/instances', { name: 'rolled' })).body;
    const loop = (file: string) => `n=0; while true; do n=$((n+1)); echo $n > /tmp/${file}.new; mv /tmp/${file}.new /tmp/${file}; sleep 0.02; done`;
    await server.api('POST', `/instances/${inst.id}/processes`, { command: loop('a') });
    await server.api('POST', `/instances/${inst.id}/processes`, { command: 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); sleep 600' });
    await sleep(1000);
    const ck = (await server.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    expect(ck.status).toBe('ready');
    // After the checkpoint: another loop and a file, which the rollback takes away.
    await server.api('POST', `/instances/${inst.id}/processes`, { command: loop('b') });
    await exec(server, inst.id, { command: 'echo after > /root/marker' });
    const rolling = server.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id }).catch(() => undefined);
    await sleep(20);
    const token = server.token;
    await server.stop('SIGKILL');
    await rolling;
    await sleep(3000);

    server = await ChildServer.start(dataDir, token);
    expect((await server.api('GET', `/instances/${inst.id}`)).body.status).toBe('running');
    const read = async (f: string) => Number((await exec(server!, inst.id, { command: `cat /tmp/${f} 2>/dev/null || echo -1` })).stdout);
    const marker = (await exec(server, inst.id, { command: 'cat /root/marker 2>/dev/null || echo none' })).stdout.trim();
    // As it was (the marker, and loop b running) or as the rollback made it (neither); loop a
    // runs either way.
    const [a0, b0] = [await read('a'), await read('b')];
    await eventually(async () => (await read('a')) > a0);
    if (marker === 'after') await eventually(async () => (await read('b')) > b0);
    else expect([marker, b0]).toEqual(['none', -1]);
    // What the store says it stands on is what it runs on: a checkpoint now and a rollback to it
    // keep the same files.
    await exec(server, inst.id, { command: 'echo again > /root/second' });
    const now = (await server.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    expect(now.status).toBe('ready');
    expect((await server.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: now.id })).status).toBe(200);
    expect((await exec(server, inst.id, { command: 'cat /root/second; cat /root/marker 2>/dev/null || echo none' })).stdout).toBe(`again\n${marker}\n`);
  });

  it('after a machine restart (every sandbox and mount gone) instances are stopped and ready checkpoints still work', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-reboot-'));
    server = await ChildServer.start(dataDir);
    const inst = (await server.api('POST', '/instances', { name: 'rebooted' })).body;
    await exec(server, inst.id, { command: 'echo v1 > /root/f; cd /opt && export A=1', session: 'main' });
    const ck = (await server.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {})).body;
    await exec(server, inst.id, { command: 'echo v2 > /root/f' });
    const token = server.token;
    const pid = Number((await readFile(join(dataDir, 'instances', inst.id, 'run', 'pid'), 'utf8')).trim());
    await server.stop('SIGKILL');
    // What a reboot does: every process and mount is gone.
    process.kill(pid, 'SIGKILL');
    await eventually(async () => !existsSync(`/proc/${pid}/root/.fp`));
    await execa('umount', [join(dataDir, 'instances', inst.id, 'merged')]);

    server = await ChildServer.start(dataDir, token);
    expect((await server.api('GET', `/instances/${inst.id}`)).body.status).toBe('stopped');
    expect((await server.api('POST', `/instances/${inst.id}/start`)).body.status).toBe('running');
    expect((await exec(server, inst.id, { command: 'cat /root/f' })).stdout).toBe('v2\n');
    expect((await server.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    expect((await exec(server, inst.id, { command: 'cat /root/f; pwd; echo $A', session: 'main' })).stdout).toBe('v1\n/opt\n1\n');
  });
});

describe('finding 6: a server restart keeps forks and restored instances', () => {
  const pidOf = async (id: string) => Number((await readFile(join(dataDir, 'instances', id, 'run', 'pid'), 'utf8')).trim());

  it('forks, a rolled-back instance and a stopped-and-started one are re-adopted after a crash', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-readopt-'));
    server = await ChildServer.start(dataDir);
    const src = (await server.api('POST', '/instances', { name: 'source' })).body;
    await exec(server, src.id, { command: 'echo v1 > /root/f; cd /srv && export K=1', session: 'main' });
    const ck = (await server.api('POST', `/instances/${src.id}/checkpoints?wait=true`, {})).body;
    const forks = (await server.api('POST', `/instances/${src.id}/fork`, { checkpoint_id: ck.id, count: 3 })).body.instances as { id: string }[];
    await exec(server, src.id, { command: 'echo v2 > /root/f' });
    expect((await server.api('POST', `/instances/${src.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    const woken = (await server.api('POST', '/instances', { name: 'woken' })).body;
    await server.api('POST', `/instances/${woken.id}/stop`);
    await server.api('POST', `/instances/${woken.id}/start`);
    const ids = [src.id, ...forks.map((f) => f.id), woken.id];
    const pids = await Promise.all(ids.map(pidOf));
    const token = server.token;
    await server.stop('SIGKILL');

    server = await ChildServer.start(dataDir, token);
    for (const [i, id] of ids.entries()) {
      const inst = (await server.api('GET', `/instances/${id}`)).body;
      expect(inst.status, `${id} after restart`).toBe('running');
      expect(await pidOf(id)).toBe(pids[i]); // the same sandbox, not a new boot
    }
    for (const id of [src.id, ...forks.map((f) => f.id)]) {
      expect((await exec(server, id, { command: 'cat /root/f; pwd; echo $K', session: 'main' })).stdout).toBe('v1\n/srv\n1\n');
      // still as confined as at boot
      expect((await exec(server, id, { command: 'grep -E "^(NoNewPrivs|Seccomp):" /proc/self/status | tr -s "\\t " " "' })).stdout).toBe('NoNewPrivs: 0\nSeccomp: 2\n');
    }
    expect((await exec(server, woken.id, { command: 'echo up' })).stdout).toBe('up\n');
  });

  it('forks cut short by a crash end running: adopted, or their restore done again from the checkpoint at the start', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-cutfork-'));
    server = await ChildServer.start(dataDir);
    const src = (await server.api('POST', '/instances', { name: 'cut' })).body;
    const ck = (await server.api('POST', `/instances/${src.id}/checkpoints?wait=true`, {})).body;
    const pending = server.api('POST', `/instances/${src.id}/fork`, { checkpoint_id: ck.id, count: 4 }).catch(() => undefined);
    // Killed as soon as a fork's directory is made (a fixed wait missed the fork on a busy host).
    const instancesDir = join(dataDir, 'instances');
    const started = Date.now();
    while (readdirSync(instancesDir).length < 2 && Date.now() - started < 10_000) await sleep(2);
    const token = server.token;
    await server.stop('SIGKILL');
    await pending;

    server = await ChildServer.start(dataDir, token);
    const forks = ((await server.api('GET', '/instances?limit=500')).body.items as { id: string; status: string; error: string | null }[]).filter((i) => i.id !== src.id);
    expect(forks.length).toBeGreaterThan(0); // the crash came after the fork had begun
    for (const f of forks) {
      expect(f.status, JSON.stringify(f)).toBe('running');
      expect((await exec(server, f.id, { command: 'echo alive' })).stdout).toBe('alive\n');
    }
  });
});
