/**
 * Issue 25: incremental memory checkpoints. A memory checkpoint of a sandbox left running copies
 * only the pages written since the one before (engine/memory-tracking.ts, deploy/criu/0009-*:
 * userfaultfd write-protection in place of the soft-dirty bits this kernel lacks), and is made
 * whole after the thaw. What must hold: a checkpoint taken after such a "pre-dump" restores the
 * pages written after it (by the program and by the kernel on its behalf) and every page not
 * written since; it stands on its own once its parent is deleted; a rollback starts the tracking
 * afresh; nothing of it is visible in the sandbox.
 */
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildAttackKit, installKit, type AttackKit } from './helpers/attack-kit.js';
import { memfill } from './helpers/memfill.js';
import { bothOrUndo, eventually, startServer, type TestServer } from './helpers/server.js';

const MIB = 256;
let s: TestServer;
let kit: AttackKit;
beforeAll(async () => {
  [s, kit] = await bothOrUndo(startServer({ warmForks: 0 }), buildAttackKit(), (x) => x.close(), (k) => k.cleanup());
});
afterAll(async () => {
  await s?.close();
  await kit?.cleanup();
});

const sh = (id: string, command: string, session?: string) => memfill(s).sh(id, command, session);
const sumOf = (id: string) => memfill(s).sumOf(id);
/** A small working set rewritten, and 16 pages given back: they must come back as zeros, not as
 * the parent image has them. */
const touch = (id: string) => memfill(s).touch(id);

async function checkpoint(id: string): Promise<string> {
  const ck = (await s.api('POST', `/instances/${id}/checkpoints?wait=true`, { memory: true })).body;
  expect(ck.status, JSON.stringify(ck)).toBe('ready');
  return ck.id;
}

async function fork(id: string, checkpointId: string): Promise<string> {
  const f = await s.api('POST', `/instances/${id}/fork`, { checkpoint_id: checkpointId });
  expect(f.status, JSON.stringify(f.body)).toBe(201);
  return f.body.id;
}

/** A sandbox whose filler holds `mib` MiB, checkpointed twice: by rename (the kit is past what
 * a memory checkpoint copies in its freeze), then left running, its tracking armed. */
async function trackedSandbox(body: Record<string, unknown>, mib = 128): Promise<string> {
  const inst = await s.instance({ limits: { memory_mb: 1024 }, ...body });
  await installKit(s, inst.id, kit);
  await memfill(s).start(inst.id, mib);
  await checkpoint(inst.id);
  await checkpoint(inst.id);
  return inst.id;
}

/** A working set written, then a checkpoint that copies only it, and a fork of that checkpoint
 * that reads back every page as the sandbox had it. */
async function incrementalRoundTrip(id: string): Promise<void> {
  const n = s.engine.incrementalDumpCount;
  await touch(id);
  const sum = await sumOf(id);
  const ck = await checkpoint(id);
  expect(s.engine.incrementalDumpCount, 'the checkpoint copied only what was written since the last').toBe(n + 1);
  const forked = await fork(id, ck);
  expect(await sumOf(forked)).toBe(sum);
  await s.api('DELETE', `/instances/${forked}`);
}

describe('incremental memory checkpoints', () => {
  it('a checkpoint after a pre-dump restores the pages written since it and all the others, on its own once its parent is gone', async () => {
    expect((await s.api('GET', '/healthz')).body.engine.incremental_checkpoints).toBe('on');
    const inst = await s.instance({ limits: { memory_mb: 1024 } });
    await installKit(s, inst.id, kit);
    await memfill(s).start(inst.id, MIB);
    await sh(inst.id, 'COUNTER=1', 'main');
    // A process that will exec after the pre-dump: same pid, another memory (its userfaultfd of
    // the pre-dump is then of a memory gone, and a new one is made).
    await sh(inst.id, "sh -c 'while [ ! -e /tmp/go ]; do sleep 0.05; done; exec sleep 1001' > /dev/null 2>&1 & echo $! > /tmp/execer.pid", 'main');
    // The kit is more than a memory checkpoint copies in its freeze: this first one freezes the
    // upper by rename (dump and restore). The upper is small from then on, and the sandbox left
    // running by each checkpoint: the tracking's case.
    await checkpoint(inst.id);
    const n0 = s.engine.incrementalDumpCount;
    const preDump = await checkpoint(inst.id);
    expect(s.engine.incrementalDumpCount, 'the first dump of a tree has no parent').toBe(n0);
    const sumBefore = await sumOf(inst.id);

    await touch(inst.id);
    await sh(inst.id, 'COUNTER=$((COUNTER + 1)); sleep 1000 & echo $! > /tmp/late.pid', 'main');
    await sh(inst.id, 'touch /tmp/go');
    await eventually(async () => (await sh(inst.id, 'cat /proc/$(cat /tmp/execer.pid)/cmdline | tr "\\0" " "')).startsWith('sleep 1001'));
    const sumAfter = await sumOf(inst.id);
    expect(sumAfter).not.toBe(sumBefore);
    const incremental = await checkpoint(inst.id);
    expect(s.engine.incrementalDumpCount, 'the checkpoint copied only what was written since the pre-dump').toBe(n0 + 1);

    // The parent goes; its child's image is whole.
    expect((await s.api('DELETE', `/instances/${inst.id}/checkpoints/${preDump}`)).status).toBe(204);
    const forked = await fork(inst.id, incremental);
    expect(await sumOf(forked)).toBe(sumAfter);
    expect(await sh(forked, 'echo $COUNTER', 'main')).toBe('2');
    expect(await sh(forked, 'kill -0 $(cat /tmp/late.pid) && echo alive')).toBe('alive');
    expect(await sh(forked, 'cat /proc/$(cat /tmp/execer.pid)/cmdline | tr "\\0" " "')).toBe('sleep 1001');
    // Nothing of the tracking reaches the sandbox's processes.
    expect(await sh(forked, 'ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c -e userfaultfd || true')).toBe('0');
    expect(await sh(inst.id, 'ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c -e userfaultfd || true')).toBe('0');

    // The source writes on; a rollback brings back the incremental checkpoint's memory exactly.
    await touch(inst.id);
    expect(await sumOf(inst.id)).not.toBe(sumAfter);
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: incremental })).status).toBe(200);
    expect(await sumOf(inst.id)).toBe(sumAfter);

    // A restored tree is tracked afresh: its first checkpoint copies everything, the next one
    // only what changed, and both restore right.
    const n1 = s.engine.incrementalDumpCount;
    const afresh = await checkpoint(inst.id);
    expect(s.engine.incrementalDumpCount, 'a restored tree has no parent image').toBe(n1);
    await touch(inst.id);
    const sumLast = await sumOf(inst.id);
    const last = await checkpoint(inst.id);
    expect(s.engine.incrementalDumpCount).toBe(n1 + 1);
    const again = await fork(inst.id, last);
    expect(await sumOf(again)).toBe(sumLast);
    const older = await fork(inst.id, afresh);
    expect(await sumOf(older)).toBe(sumAfter);
    for (const i of [again, older, forked, inst.id]) await s.api('DELETE', `/instances/${i}`);
    // The holders of the tracking's userfaultfds go with their sandboxes.
    await eventually(async () => (await holders(s.dataDir)) === 0);
  });

  it("on the host's ids too (user_namespace: false): the incremental checkpoint restores every page right", async () => {
    const id = await trackedSandbox({ user_namespace: false });
    try {
      await incrementalRoundTrip(id);
    } finally {
      // Its tracking's holder goes with it, whatever failed: the next test counts holders.
      await s.api('DELETE', `/instances/${id}`);
    }
  });

  it('a sandbox hibernated and woken is tracked afresh, and its memory comes back whole', async () => {
    const id = await trackedSandbox({});
    try {
      await touch(id);
      const sum = await sumOf(id);
      // Hibernated after its tracking was armed: the dump is whole, the holder goes with the tree.
      expect((await s.api('POST', `/instances/${id}/hibernate`)).status).toBe(200);
      await eventually(async () => (await holders(s.dataDir)) === 0);
      expect((await s.api('POST', `/instances/${id}/wake`)).status).toBe(200);
      expect(await sumOf(id)).toBe(sum);
      const n = s.engine.incrementalDumpCount;
      await checkpoint(id);
      expect(s.engine.incrementalDumpCount, 'a woken tree has no parent image').toBe(n);
      await incrementalRoundTrip(id);
    } finally {
      await s.api('DELETE', `/instances/${id}`);
    }
  });

  it('a server that comes after another tracks afresh: its first checkpoint copies everything, the holder left behind goes', async () => {
    const first = await startServer({ warmForks: 0 });
    let second: TestServer | undefined;
    try {
      const m = memfill(first);
      const inst = await first.instance({ limits: { memory_mb: 1024 } });
      await installKit(first, inst.id, kit);
      await m.start(inst.id, 128);
      const checkpointOn = async (on: TestServer) => {
        const ck = (await on.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true })).body;
        expect(ck.status, JSON.stringify(ck)).toBe('ready');
        return ck.id as string;
      };
      await checkpointOn(first); // by rename: the kit is past the copy bound
      await checkpointOn(first);
      await m.touch(inst.id);
      await checkpointOn(first);
      expect(first.engine.incrementalDumpCount).toBe(1);
      expect(await holders(first.dataDir)).toBe(1);

      // The sandbox outlives its server, and so does the holder of its tracking.
      await first.close({ keepSandboxes: true, keepData: true });
      expect(await holders(first.dataDir)).toBe(1);
      second = await startServer({ warmForks: 0 }, first.dataDir);
      const n = memfill(second);
      await n.touch(inst.id);
      const sum = await n.sumOf(inst.id);
      const afresh = await checkpointOn(second);
      expect(second.engine.incrementalDumpCount, 'a new server knows no parent image').toBe(0);
      // Its holder told the one before to go, with what it held.
      await eventually(async () => (await holders(first.dataDir)) === 1);
      await n.touch(inst.id);
      const sumLast = await n.sumOf(inst.id);
      const last = await checkpointOn(second);
      expect(second.engine.incrementalDumpCount).toBe(1);
      for (const [ck, expected] of [[afresh, sum], [last, sumLast]] as const) {
        const f = await second.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck });
        expect(f.status, JSON.stringify(f.body)).toBe(201);
        expect(await n.sumOf(f.body.id)).toBe(expected);
        await second.api('DELETE', `/instances/${f.body.id}`);
      }
      await second.api('DELETE', `/instances/${inst.id}`);
      await eventually(async () => (await holders(first.dataDir)) === 0);
    } finally {
      await (second ?? first).close().catch(() => {});
    }
  });
});

/** `fp-agent wp-hold` processes of the server on `dataDir` (not the shims above them, whose
 * command lines name them too). */
async function holders(dataDir: string): Promise<number> {
  const r = await execa('pgrep', ['-c', '-f', `^\\S*fp-agent wp-hold ${dataDir}/`], { reject: false });
  return Number(r.stdout.trim() || 0);
}
