import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { readdir, readFile, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { EngineError } from '../seam/errors.js';
import type { ResourceLimits } from '../seam/runtime.js';

export type { ResourceLimits } from '../seam/runtime.js';

const ROOT = '/sys/fs/cgroup';
const CPU_PERIOD_US = 100_000;

/** The devices a sandbox may open, as Docker allows them: null, zero, full, random, urandom,
 * tty, ptmx and its own ptys. The sandbox cannot mknod, but an image can carry device nodes
 * (and the agent layer does): on cgroup v1 the devices controller keeps it to these. */
const ALLOWED_DEVICES = ['c 1:3 rwm', 'c 1:5 rwm', 'c 1:7 rwm', 'c 1:8 rwm', 'c 1:9 rwm', 'c 5:0 rwm', 'c 5:2 rwm', 'c 136:* rwm'];

/** The v1 controllers a sandbox's groups are in. */
const V1_CONTROLLERS = ['memory', 'pids', 'cpu', 'cpuacct', 'devices', 'freezer'];
/** Before groups were per node, a sandbox's were `forkpoint/<id>`: what an older server left
 * running is still found (and removed) there. */
const LEGACY_GROUP = 'forkpoint';
/** How long a freeze may take to reach every process of the sandbox. */
const FREEZE_DEADLINE_MS = 5000;

/**
 * Per-sandbox cgroups on the unified hierarchy (v2) or the v1 controllers of a hybrid host,
 * under `forkpoint/<node>/`: two nodes on one host (a test, a node taking over an instance
 * another still holds frozen) never share a sandbox's groups.
 */
export class Cgroups {
  readonly version: 1 | 2;

  constructor(private readonly group: string) {
    this.version = existsSync(join(ROOT, 'cgroup.controllers')) ? 2 : 1;
  }

  /** Whether the process is in the instance's groups (or below them): a pid read from a file
   * names that sandbox's process only while this holds, not a host process that took the pid. */
  async holds(id: string, pid: number): Promise<boolean> {
    const text = await readFile(`/proc/${pid}/cgroup`, 'utf8').catch(() => '');
    const ours = [`/${this.group}/${id}`, `/${LEGACY_GROUP}/${id}`];
    return text.split('\n').some((line) => {
      const path = line.slice(line.indexOf(':', line.indexOf(':') + 1) + 1);
      return ours.some((mine) => path === mine || path.startsWith(`${mine}/`));
    });
  }

  /** The sandbox's processes: its pids group holds every one, whatever they forked. */
  async pids(id: string): Promise<number[]> {
    const file = this.version === 2 ? join(this.v2Dir(id), 'cgroup.procs') : join(this.v1Dir('pids', id), 'cgroup.procs');
    return (await readFile(file, 'utf8').catch(() => '')).split('\n').filter(Boolean).map(Number);
  }

  private v1Dir(controller: string, id: string, group = this.group): string {
    return join(ROOT, controller, group, id);
  }

  private v2Dir(id: string, group = this.group): string {
    return join(ROOT, group, id);
  }

  /**
   * Stops every process of the sandbox where it stands (the cgroup freezer), until `thaw`:
   * what a node does with its sandboxes once it can no longer be sure they are its own, and
   * what a checkpoint's pause is made of. The control files are read and written synchronously:
   * each is a few microseconds, where a round trip through libuv's thread pool is 0.3-0.6 ms,
   * and a v1 freeze takes seven of them, all inside the pause.
   */
  async freeze(id: string): Promise<void> {
    try {
      if (this.version === 2) {
        writeFileSync(join(this.v2Dir(id), 'cgroup.freeze'), '1');
        await this.waitFor(join(this.v2Dir(id), 'cgroup.events'), (t) => /^frozen 1$/m.test(t));
        return;
      }
      // v1: the sandbox's processes are born in its freezer group; any outside it (a sandbox an
      // older server started) are moved in until none is left outside, then the group is frozen.
      const freezer = this.v1Dir('freezer', id);
      mkdirSync(freezer, { recursive: true });
      const procs = join(this.v1Dir('pids', id), 'cgroup.procs');
      const list = (file: string) => readFileSync(file, 'utf8').split('\n').filter(Boolean);
      for (let round = 0; round < 20; round++) {
        const inside = new Set(list(join(freezer, 'cgroup.procs')));
        const missing = list(procs).filter((p) => !inside.has(p));
        if (missing.length === 0 && round > 0) break;
        for (const pid of missing) {
          try {
            writeFileSync(join(freezer, 'cgroup.procs'), pid);
          } catch {
            // gone meanwhile
          }
        }
        writeFileSync(join(freezer, 'freezer.state'), 'FROZEN');
        // Moved in before the write: none was outside, so none can be now but its new children.
        if (missing.length === 0) break;
      }
      await this.waitFor(join(freezer, 'freezer.state'), (t) => t.trim() === 'FROZEN');
    } catch (err) {
      throw new EngineError('CGROUP_FAILED', `freezing ${id}: ${(err as Error).message}`, undefined, { cause: err });
    }
  }

  async thaw(id: string): Promise<void> {
    try {
      if (this.version === 2) writeFileSync(join(this.v2Dir(id), 'cgroup.freeze'), '0');
      else if (existsSync(this.v1Dir('freezer', id))) writeFileSync(join(this.v1Dir('freezer', id), 'freezer.state'), 'THAWED');
    } catch (err) {
      throw new EngineError('CGROUP_FAILED', `thawing ${id}: ${(err as Error).message}`, undefined, { cause: err });
    }
  }

  /** The sandbox's freezer group, as CRIU's `freeze_cgroup` names it (a dump of a sandbox this
   * engine froze first: CRIU seizes it frozen and leaves it frozen). */
  freezerDir(id: string): string {
    return this.version === 2 ? this.v2Dir(id) : this.v1Dir('freezer', id);
  }

  /** Thaws the freezer group the process is in, if it is in one (by its own /proc entry). */
  async thawHolderOf(pid: number): Promise<void> {
    const lines = (await readFile(`/proc/${pid}/cgroup`, 'utf8')).split('\n');
    for (const line of lines) {
      const [, controllers, path] = line.split(':');
      if (path === undefined || !path.startsWith(`/${this.group}/`) && !path.startsWith(`/${LEGACY_GROUP}/`)) continue;
      if (this.version === 2 && controllers === '') await writeFile(join(ROOT, path, 'cgroup.freeze'), '0');
      if (this.version === 1 && controllers?.split(',').includes('freezer')) await writeFile(join(ROOT, 'freezer', path, 'freezer.state'), 'THAWED');
    }
  }

  private async waitFor(file: string, done: (text: string) => boolean): Promise<void> {
    const deadline = Date.now() + FREEZE_DEADLINE_MS;
    // Most freezes settle well within a millisecond, while the shortest timer is one: look again
    // at once for the first millisecond (a read is a few microseconds), then every millisecond.
    // (It backed off to 10 ms once: on CPUs busy with other sandboxes a freeze takes a few ms,
    // and a look at 1, 2, 4, 8, 16 ms saw one done at 9 ms at 16; bench/under-load.ts.)
    const eager = performance.now() + 1;
    while (!done(readFileSync(file, 'utf8'))) {
      if (Date.now() > deadline) throw new Error(`${file} did not settle within ${FREEZE_DEADLINE_MS} ms`);
      if (performance.now() < eager) {
        await new Promise(setImmediate);
        continue;
      }
      await new Promise((r) => setTimeout(r, 1));
    }
  }

  /** cgroup.procs files of the groups this process made and set, by instance and limits: a
   * checkpoint's restore goes back into the same groups without writing them again. */
  private readonly made = new Map<string, { key: string; procs: string[] }>();

  /** Creates the sandbox's cgroups and returns the `cgroup.procs` files to join. */
  async create(id: string, limits: ResourceLimits): Promise<string[]> {
    const key = `${limits.memoryMb}/${limits.pids}/${limits.cpuPercent}`;
    const known = this.made.get(id);
    if (known?.key === key && known.procs.every((p) => existsSync(p))) return known.procs;
    try {
      const procs = this.version === 2 ? [this.createV2(id, limits)] : this.createV1(id, limits);
      this.made.set(id, { key, procs });
      return procs;
    } catch (err) {
      throw new EngineError('CGROUP_FAILED', `cgroup for ${id}: ${(err as Error).message}`);
    }
  }

  /* The groups are made and set with synchronous calls: each is tens of microseconds, where a
   * round trip through libuv's thread pool is 0.3-0.6 ms, and a sandbox's groups take about
   * twenty of them, on the way of every create, fork and restore (measured: 9-33 ms of a fork). */
  private createV1(id: string, limits: ResourceLimits): string[] {
    const procs: string[] = [];
    const memory = this.v1Dir('memory', id);
    mkdirSync(memory, { recursive: true });
    // Memory and swap together no more than memory alone: no swap, as memory.swap.max 0 on v2.
    // The kernel keeps memsw >= memory at every step, so memsw is written on both sides of the
    // memory limit (the first write fails when the limit goes down); a kernel without swap
    // accounting has no memsw file, and nothing to bound.
    const bytes = String(limits.memoryMb * 1024 * 1024);
    const memsw = (tolerate: string[]) => {
      try {
        writeFileSync(join(memory, 'memory.memsw.limit_in_bytes'), bytes);
      } catch (err) {
        if (!tolerate.includes((err as NodeJS.ErrnoException).code ?? '')) throw err;
      }
    };
    memsw(['ENOENT', 'EINVAL']);
    writeFileSync(join(memory, 'memory.limit_in_bytes'), bytes);
    memsw(['ENOENT']);
    procs.push(join(memory, 'cgroup.procs'));
    const pids = this.v1Dir('pids', id);
    mkdirSync(pids, { recursive: true });
    writeFileSync(join(pids, 'pids.max'), String(limits.pids));
    procs.push(join(pids, 'cgroup.procs'));
    const cpu = this.v1Dir('cpu', id);
    if (existsSync(join(ROOT, 'cpu'))) {
      mkdirSync(cpu, { recursive: true });
      writeFileSync(join(cpu, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
      writeFileSync(join(cpu, 'cpu.cfs_quota_us'), String(Math.round((CPU_PERIOD_US * limits.cpuPercent) / 100)));
      procs.push(join(cpu, 'cgroup.procs'));
    }
    // Where its CPU time is counted (usage): its own hierarchy on some hosts, cpu's on others.
    const cpuacct = this.v1Dir('cpuacct', id);
    if (existsSync(join(ROOT, 'cpuacct'))) {
      mkdirSync(cpuacct, { recursive: true });
      procs.push(join(cpuacct, 'cgroup.procs'));
    }
    // Born in its freezer group, a sandbox freezes with one write (a files-only checkpoint's
    // freeze; moving 40 processes in one by one took ~20 ms). Thawed, the group costs nothing.
    const freezer = this.v1Dir('freezer', id);
    if (existsSync(join(ROOT, 'freezer'))) {
      mkdirSync(freezer, { recursive: true });
      procs.push(join(freezer, 'cgroup.procs'));
    }
    const devices = this.v1Dir('devices', id);
    if (existsSync(join(ROOT, 'devices'))) {
      mkdirSync(devices, { recursive: true });
      writeFileSync(join(devices, 'devices.deny'), 'a');
      for (const rule of ALLOWED_DEVICES) writeFileSync(join(devices, 'devices.allow'), rule);
      procs.push(join(devices, 'cgroup.procs'));
    }
    return procs;
  }

  private createV2(id: string, limits: ResourceLimits): string {
    mkdirSync(join(ROOT, this.group), { recursive: true });
    const wanted = ['memory', 'pids', 'cpu'];
    const available = readFileSync(join(ROOT, 'cgroup.controllers'), 'utf8').split(/\s+/);
    const enable = wanted.filter((c) => available.includes(c)).map((c) => `+${c}`).join(' ');
    try {
      writeFileSync(join(ROOT, 'cgroup.subtree_control'), enable);
    } catch {
      // the root's may be the host's to set (a container's cgroup namespace)
    }
    // Each level down to the node's group hands the controllers on.
    const levels = this.group.split('/');
    for (let i = 1; i <= levels.length; i++) writeFileSync(join(ROOT, ...levels.slice(0, i), 'cgroup.subtree_control'), enable);
    const dir = this.v2Dir(id);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'memory.max'), String(limits.memoryMb * 1024 * 1024));
    try {
      writeFileSync(join(dir, 'memory.swap.max'), '0');
    } catch {
      // a kernel without swap accounting has nothing to bound
    }
    writeFileSync(join(dir, 'pids.max'), String(limits.pids));
    writeFileSync(join(dir, 'cpu.max'), `${Math.round((CPU_PERIOD_US * limits.cpuPercent) / 100)} ${CPU_PERIOD_US}`);
    return join(dir, 'cgroup.procs');
  }

  /**
   * Weighs the sandbox's CPU group ten times another's while CRIU works in it (the restorer runs
   * in its groups, the dump's parasite in its tasks), so that other tenants' busy sandboxes do
   * not stretch its pause; `false` puts the default weight back. Its quota stays: a boost never
   * gives it more CPU than its limit, only sooner. Best effort: a host without the file has no
   * CPU groups to weigh. One synchronous write: it is on the way of every restore, twice.
   */
  async boost(id: string, on: boolean): Promise<void> {
    const [file, value] = this.version === 2
      ? [join(this.v2Dir(id), 'cpu.weight'), on ? '1000' : '100']
      : [join(this.v1Dir('cpu', id), 'cpu.shares'), on ? '10240' : '1024'];
    try {
      writeFileSync(file, value);
    } catch {
      // no such group or file: nothing to weigh
    }
  }

  /** Memory the sandbox uses now (what a memory dump of it will about take), in bytes. */
  async memoryBytes(id: string): Promise<number> {
    const file = this.version === 2 ? join(this.v2Dir(id), 'memory.current') : join(this.v1Dir('memory', id), 'memory.usage_in_bytes');
    const n = Number((await readFile(file, 'utf8').catch(() => '0')).trim());
    return Number.isFinite(n) ? n : 0;
  }

  /** CPU time the sandbox's processes used so far, in microseconds. */
  async cpuMicros(id: string): Promise<number> {
    if (this.version === 2) return num(await readFile(join(this.v2Dir(id), 'cpu.stat'), 'utf8').catch(() => ''), 'usage_usec');
    const ns = Number((await readFile(join(this.v1Dir('cpuacct', id), 'cpuacct.usage'), 'utf8').catch(() => '0')).trim());
    return Number.isFinite(ns) ? Math.floor(ns / 1000) : 0;
  }

  /** Whether the limits stopped something: OOM kills and refused forks so far. */
  async events(id: string): Promise<{ oomKills: number; pidsRefused: number }> {
    const read = (p: string) => readFile(p, 'utf8').catch(() => '');
    if (this.version === 2) {
      const mem = await read(join(this.v2Dir(id), 'memory.events'));
      const pids = await read(join(this.v2Dir(id), 'pids.events'));
      return { oomKills: num(mem, 'oom_kill'), pidsRefused: num(pids, 'max') };
    }
    const mem = await read(join(this.v1Dir('memory', id), 'memory.oom_control'));
    const pids = await read(join(this.v1Dir('pids', id), 'pids.events'));
    return { oomKills: num(mem, 'oom_kill'), pidsRefused: num(pids, 'max') };
  }

  /** `from`'s groups are `to`'s from now on (a rollback's standby taking its instance's place;
   * the replaced sandbox's put aside first). v1 only: the unified hierarchy refuses renames.
   * Synchronous: a rename per controller, inside a pause. */
  rename(from: string, to: string): void {
    if (this.version !== 1) throw new EngineError('CGROUP_FAILED', 'cgroup v2 does not rename groups');
    for (const c of V1_CONTROLLERS) {
      try {
        renameSync(this.v1Dir(c, from), this.v1Dir(c, to));
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    }
    // Their procs files are named by the old names: made again when next asked for.
    this.made.delete(from);
    this.made.delete(to);
  }

  /** Removes the sandbox's groups, and any group made below them (a sandbox cannot make one,
   * but a host tool or an older forkpoint might have). */
  async remove(id: string): Promise<void> {
    this.made.delete(id);
    const dirs = [this.group, LEGACY_GROUP].flatMap((g) => (this.version === 2 ? [this.v2Dir(id, g)] : V1_CONTROLLERS.map((c) => this.v1Dir(c, id, g))));
    for (const dir of dirs) await removeGroup(dir, 0);
  }

  /** Removes the node's own group once no sandbox's is left in it (a server that stops with
   * none running leaves nothing of itself). */
  async removeNodeGroup(): Promise<void> {
    const dirs = this.version === 2 ? [join(ROOT, this.group)] : V1_CONTROLLERS.map((c) => join(ROOT, c, this.group));
    for (const dir of dirs) await rmdir(dir).catch(() => {}); // busy: sandboxes still in it
  }
}

const MAX_DEPTH = 32;

async function removeGroup(dir: string, depth: number): Promise<void> {
  let children: string[];
  try {
    children = (await readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => join(dir, e.name));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  if (depth < MAX_DEPTH) for (const child of children) await removeGroup(child, depth + 1);
  for (let attempt = 0; attempt < 50; attempt++) {
    try {
      await rmdir(dir);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      await new Promise((r) => setTimeout(r, 20)); // EBUSY while the last tasks exit
    }
  }
}

function num(text: string, key: string): number {
  const m = new RegExp(`^${key} (\\d+)`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}
