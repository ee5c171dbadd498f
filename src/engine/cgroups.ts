import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rmdir, writeFile } from 'node:fs/promises';
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

/** Per-sandbox cgroups on the unified hierarchy (v2) or the v1 controllers of a hybrid host. */
export class Cgroups {
  readonly version: 1 | 2;

  constructor(private readonly group = 'forkpoint') {
    this.version = existsSync(join(ROOT, 'cgroup.controllers')) ? 2 : 1;
  }

  /** Whether the process is in the instance's groups (or below them): a pid read from a file
   * names that sandbox's process only while this holds, not a host process that took the pid. */
  async holds(id: string, pid: number): Promise<boolean> {
    const text = await readFile(`/proc/${pid}/cgroup`, 'utf8').catch(() => '');
    const mine = `/${this.group}/${id}`;
    return text.split('\n').some((line) => {
      const path = line.slice(line.indexOf(':', line.indexOf(':') + 1) + 1);
      return path === mine || path.startsWith(`${mine}/`);
    });
  }

  private v1Dir(controller: string, id: string): string {
    return join(ROOT, controller, this.group, id);
  }

  private v2Dir(id: string): string {
    return join(ROOT, this.group, id);
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
      const procs = this.version === 2 ? [await this.createV2(id, limits)] : await this.createV1(id, limits);
      this.made.set(id, { key, procs });
      return procs;
    } catch (err) {
      throw new EngineError('CGROUP_FAILED', `cgroup for ${id}: ${(err as Error).message}`);
    }
  }

  private async createV1(id: string, limits: ResourceLimits): Promise<string[]> {
    const procs: string[] = [];
    const memory = this.v1Dir('memory', id);
    await mkdir(memory, { recursive: true });
    // Memory and swap together no more than memory alone: no swap, as memory.swap.max 0 on v2.
    // The kernel keeps memsw >= memory at every step, so memsw is written on both sides of the
    // memory limit (the first write fails when the limit goes down); a kernel without swap
    // accounting has no memsw file, and nothing to bound.
    const bytes = String(limits.memoryMb * 1024 * 1024);
    const memsw = (tolerate: string[]) => writeFile(join(memory, 'memory.memsw.limit_in_bytes'), bytes).catch((err: NodeJS.ErrnoException) => {
      if (!tolerate.includes(err.code ?? '')) throw err;
    });
    await memsw(['ENOENT', 'EINVAL']);
    await writeFile(join(memory, 'memory.limit_in_bytes'), bytes);
    await memsw(['ENOENT']);
    procs.push(join(memory, 'cgroup.procs'));
    const pids = this.v1Dir('pids', id);
    await mkdir(pids, { recursive: true });
    await writeFile(join(pids, 'pids.max'), String(limits.pids));
    procs.push(join(pids, 'cgroup.procs'));
    const cpu = this.v1Dir('cpu', id);
    if (existsSync(join(ROOT, 'cpu'))) {
      await mkdir(cpu, { recursive: true });
      await writeFile(join(cpu, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
      await writeFile(join(cpu, 'cpu.cfs_quota_us'), String(Math.round((CPU_PERIOD_US * limits.cpuPercent) / 100)));
      procs.push(join(cpu, 'cgroup.procs'));
    }
    const devices = this.v1Dir('devices', id);
    if (existsSync(join(ROOT, 'devices'))) {
      await mkdir(devices, { recursive: true });
      await writeFile(join(devices, 'devices.deny'), 'a');
      for (const rule of ALLOWED_DEVICES) await writeFile(join(devices, 'devices.allow'), rule);
      procs.push(join(devices, 'cgroup.procs'));
    }
    return procs;
  }

  private async createV2(id: string, limits: ResourceLimits): Promise<string> {
    const parent = join(ROOT, this.group);
    await mkdir(parent, { recursive: true });
    const wanted = ['memory', 'pids', 'cpu'];
    const available = readFileSync(join(ROOT, 'cgroup.controllers'), 'utf8').split(/\s+/);
    const enable = wanted.filter((c) => available.includes(c)).map((c) => `+${c}`).join(' ');
    await writeFile(join(ROOT, 'cgroup.subtree_control'), enable).catch(() => {});
    await writeFile(join(parent, 'cgroup.subtree_control'), enable);
    const dir = this.v2Dir(id);
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'memory.max'), String(limits.memoryMb * 1024 * 1024));
    await writeFile(join(dir, 'memory.swap.max'), '0').catch(() => {});
    await writeFile(join(dir, 'pids.max'), String(limits.pids));
    await writeFile(join(dir, 'cpu.max'), `${Math.round((CPU_PERIOD_US * limits.cpuPercent) / 100)} ${CPU_PERIOD_US}`);
    return join(dir, 'cgroup.procs');
  }

  /** Memory the sandbox uses now (what a memory dump of it will about take), in bytes. */
  async memoryBytes(id: string): Promise<number> {
    const file = this.version === 2 ? join(this.v2Dir(id), 'memory.current') : join(this.v1Dir('memory', id), 'memory.usage_in_bytes');
    const n = Number((await readFile(file, 'utf8').catch(() => '0')).trim());
    return Number.isFinite(n) ? n : 0;
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

  /** Removes the sandbox's groups, and any group made below them (a sandbox cannot make one,
   * but a host tool or an older forkpoint might have). */
  async remove(id: string): Promise<void> {
    this.made.delete(id);
    const dirs =
      this.version === 2 ? [this.v2Dir(id)] : ['memory', 'pids', 'cpu', 'devices'].map((c) => this.v1Dir(c, id));
    for (const dir of dirs) await removeGroup(dir, 0);
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
