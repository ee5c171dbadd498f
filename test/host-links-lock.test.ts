/**
 * The host's link set-up lock (native/netlink.c, host_links_lock): every sandbox's veth is made
 * one at a time under a flock on the host's netns. A set-up that finds it taken waits blocked in
 * flock, not polling (a hundred forks queued behind it polled a quarter of the host's CPU away),
 * goes on as soon as it is let go, and past its bound (2 s) goes on without it. The pair it makes
 * has one queue each way from its creation.
 */
import { execa, type ResultPromise } from 'execa';
import { readFile, readlink } from 'node:fs/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';

const AGENT = loadConfig({ env: {} }).agentPath;
const HOST_IF = `fplk${process.pid % 100000}`;
// The host keeps a sandbox's gateway address on lo (as the engine does: network/index.ts).
const GATEWAY = '10.251.9.1';

/** The count of times the process gave up its CPU of its own will (each poll is one). */
async function voluntarySwitches(pid: number): Promise<number> {
  return Number(/voluntary_ctxt_switches:\s+(\d+)/.exec(await readFile(`/proc/${pid}/status`, 'utf8'))![1]);
}

const started: ResultPromise[] = [];
function start(file: string, args: string[]): ResultPromise {
  const p = execa(file, args, { reject: false, stdin: 'ignore' });
  started.push(p);
  return p;
}

/** Holds the lock (flock(1) on the host's netns, the inode every set-up locks) until killed, or
 * for `seconds`. (In an object: an async function returning the process would wait for its end.) */
async function holdLock(seconds: number): Promise<{ holder: ResultPromise }> {
  // -o: flock(1) alone holds it (its command does not inherit the open), so killing flock lets go.
  const holder = execa('flock', ['-o', '/proc/self/ns/net', '-c', `echo locked; exec sleep ${seconds}`], { reject: false, stdin: 'ignore', buffer: false, detached: true });
  started.push(holder);
  await new Promise<void>((resolve, reject) => {
    holder.stdout!.once('data', () => resolve());
    void holder.then((r) => reject(new Error(`the lock holder ended: ${r.stderr}`)));
  });
  return { holder };
}

/** A netns for the sandbox end: a sleeper's, unshared. */
async function sandboxNetns(): Promise<number> {
  const sleeper = start('unshare', ['-n', 'sleep', '60']);
  for (let i = 0; i < 100; i++) {
    const ns = await readlink(`/proc/${sleeper.pid}/ns/net`).catch(() => undefined);
    if (ns && ns !== (await readlink('/proc/self/ns/net'))) return sleeper.pid!;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error('unshare -n did not get its own netns');
}

const setup = (pid: number) => start(AGENT, ['net-setup', String(pid), HOST_IF, '10.251.9.2', GATEWAY, '02:fb:09:00:00:02']);

beforeEach(async () => {
  await execa('ip', ['addr', 'replace', `${GATEWAY}/32`, 'dev', 'lo']);
});

afterEach(async () => {
  for (const p of started.splice(0)) {
    p.kill('SIGKILL');
    // The holder's group: flock and its sleep.
    try {
      process.kill(-p.pid!, 'SIGKILL');
    } catch {}
  }
  await execa('ip', ['link', 'del', HOST_IF], { reject: false });
  await execa('ip', ['addr', 'del', `${GATEWAY}/32`, 'dev', 'lo'], { reject: false });
});

describe('host link set-up lock', () => {
  it('waits for a held lock without polling and goes on once it is let go', async () => {
    const pid = await sandboxNetns();
    const { holder } = await holdLock(30);
    const t = performance.now();
    const s = setup(pid);
    await new Promise((r) => setTimeout(r, 1000));
    expect(s.exitCode, 'the set-up went on while the lock was held').toBeNull();
    // Blocked in flock and woken every 50 ms to look at its deadline: ~20 switches in a second.
    // Polling every 200 us was ~5000.
    expect(await voluntarySwitches(s.pid!)).toBeLessThan(200);
    holder.kill('SIGKILL');
    const r = await s;
    expect(performance.now() - t, 'it went on past its bound, not when the lock was let go').toBeLessThan(1900);
    expect(r.exitCode, String(r.stderr)).toBe(0);
    expect((await execa('ip', ['-o', 'link', 'show', HOST_IF])).stdout).toContain('state UP');
  });

  it('goes on without the lock past its bound', async () => {
    const pid = await sandboxNetns();
    const { holder } = await holdLock(30);
    const t = performance.now();
    const r = await setup(pid);
    expect(r.exitCode, String(r.stderr)).toBe(0);
    expect(performance.now() - t).toBeGreaterThanOrEqual(1900);
    expect(holder.exitCode, 'the holder was still holding').toBeNull();
  });

  it('makes each end of the pair with one queue each way (not one per CPU, cut once registered: a grace period each under rtnl)', async () => {
    const pid = await sandboxNetns();
    const r = await setup(pid);
    expect(r.exitCode, String(r.stderr)).toBe(0);
    const queues = async (cmd: string[]) => {
      const links = JSON.parse((await execa(cmd[0]!, [...cmd.slice(1), '-d', '-j', 'link', 'show', 'dev', cmd === host ? HOST_IF : 'eth0'])).stdout) as { num_tx_queues: number; num_rx_queues: number }[];
      return links.map((l) => [l.num_tx_queues, l.num_rx_queues]);
    };
    const host = ['ip'];
    expect(await queues(host)).toEqual([[1, 1]]);
    expect(await queues(['nsenter', '-t', String(pid), '-n', 'ip'])).toEqual([[1, 1]]);
  });
});
