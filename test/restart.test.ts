import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterEach, describe, expect, it } from 'vitest';
import { ChildServer } from './helpers/child-server.js';
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

describe('server restart', () => {
  it('re-adopts running sandboxes: processes, shell sessions and files carry on', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-restart-'));
    server = await ChildServer.start(dataDir);
    const inst = (await server.api('POST', '/instances', { name: 'survivor' })).body;
    await exec(server, inst.id, { command: 'cd /srv && export KEPT=yes', session: 'main' });
    const bg = (await server.api('POST', `/instances/${inst.id}/processes`, { command: 'while true; do date +%s%N >> /tmp/ticks; sleep 0.05; done' })).body;
    const pid = Number((await readFile(join(dataDir, 'instances', inst.id, 'run', 'pid'), 'utf8')).trim());
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

  it('a crash in the middle of a checkpoint leaves it failed with a reason, and nothing stray', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-crash-'));
    server = await ChildServer.start(dataDir);
    const inst = (await server.api('POST', '/instances', { name: 'crashy' })).body;
    await exec(server, inst.id, { command: 'echo safe > /root/f' });
    const good = (await server.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { label: 'good' })).body;
    expect(good.status).toBe('ready');
    // Enough dirty memory that the dump takes a while.
    await server.api('POST', `/instances/${inst.id}/processes`, { command: 'x=$(head -c 150000000 /dev/zero | tr "\\0" a); sleep 600' });
    await sleep(1500);
    const started = (await server.api('POST', `/instances/${inst.id}/checkpoints`, { label: 'interrupted' })).body;
    await sleep(30);
    const token = server.token;
    await server.stop('SIGKILL');
    await sleep(3000); // let an orphaned criu finish whatever it was doing

    server = await ChildServer.start(dataDir, token);
    const cp = (await server.api('GET', `/instances/${inst.id}/checkpoints/${started.id}`)).body;
    expect(cp.status).toBe('failed');
    expect(cp.error).toMatch(/server stopped/);
    const state = (await server.api('GET', `/instances/${inst.id}`)).body.status;
    expect(['running', 'stopped']).toContain(state);
    if (state === 'stopped') {
      expect(await overlaysUnder(join(dataDir, 'instances', inst.id))).toEqual([]);
      expect((await server.api('POST', `/instances/${inst.id}/start`)).body.status).toBe('running');
    }
    expect((await exec(server, inst.id, { command: 'cat /root/f' })).stdout).toBe('safe\n');
    // The checkpoint taken before the crash is as good as ever.
    const rb = await server.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: good.id });
    expect(rb.status, JSON.stringify(rb.body)).toBe(200);
    expect((await exec(server, inst.id, { command: 'cat /root/f' })).stdout).toBe('safe\n');
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
