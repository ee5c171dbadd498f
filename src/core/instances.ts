import { readFile } from 'node:fs/promises';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import type { Engine, SandboxSpec } from '../engine/engine.js';
import { EngineError } from '../engine/errors.js';
import { execOnce, type ExecResult } from '../engine/exec.js';
import { Output } from '../engine/output.js';
import type { Images } from '../engine/images.js';
import { forgetProcess, listProcesses, readOutput, signalProcess, startBackground, type OutputChunk } from '../engine/processes.js';
import type { Sandbox } from '../engine/sandbox.js';
import { processStartTime } from '../engine/launcher.js';
import { SessionRegistry, ShellSession } from '../engine/session.js';
import type { Store } from '../store/index.js';
import { newId } from '../store/ids.js';
import type { InstanceRecord, Limits, Page } from '../store/instances.js';
import type { AgentProcessInfo } from '../engine/agent/frames.js';
import { engineFailure } from './engine-failure.js';
import { requireRoom } from './space.js';
import { ConflictError, InsufficientStorageError, InvalidRequestError, NotFoundError } from './errors.js';
import type { KeyedLock } from './jobs.js';

export interface CreateInstance {
  name?: string | undefined;
  image?: string | undefined;
  env?: Record<string, string> | undefined;
  limits?: Partial<Limits> | undefined;
  metadata?: Record<string, string> | undefined;
  maxCheckpoints?: number | undefined;
}

export interface ExecInput {
  command: string | string[];
  cwd?: string | undefined;
  env?: Record<string, string> | undefined;
  timeoutMs?: number | undefined;
  stdin?: string | undefined;
  session?: string | undefined;
  maxOutputBytes?: number | undefined;
}

export interface BackgroundInput {
  command: string | string[];
  cwd?: string | undefined;
  env?: Record<string, string> | undefined;
  pty?: { rows: number; cols: number } | undefined;
}

export interface ProcessView extends AgentProcessInfo {
  session: string | null;
}

export const DEFAULT_TIMEOUT_MS = 60_000;
export const DEFAULT_MAX_OUTPUT = 1 << 20;
const BASE_ENV: Record<string, string> = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  HOME: '/root',
  TERM: 'xterm-256color',
  LANG: 'C.UTF-8',
};
export const INSTANCE_NAME = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/** Instances: their records, their sandboxes, and the commands run in them. */
export class InstanceService {
  private readonly sessions = new Map<string, Map<string, ShellSession>>();
  /** Instances whose deletion is under way: no new checkpoint job may queue behind it. */
  private readonly deleting = new Set<string>();

  constructor(
    private readonly store: Store,
    private readonly engine: Engine,
    private readonly images: Images,
    private readonly locks: KeyedLock,
    private readonly config: Config,
    private readonly log: Logger,
  ) {}

  isBeingDeleted(id: string): boolean {
    return this.deleting.has(id);
  }

  get(owner: string, id: string): InstanceRecord {
    const rec = this.store.instances.get(id);
    if (!rec || rec.owner !== owner) throw new NotFoundError('instance', id);
    return rec;
  }

  list(owner: string, limit: number, cursor?: string): Page<InstanceRecord> {
    if (cursor && this.store.instances.get(cursor)?.owner !== owner) throw new InvalidRequestError('unknown cursor');
    return this.store.instances.page(owner, limit, cursor);
  }

  spec(rec: InstanceRecord): SandboxSpec {
    return {
      id: rec.id,
      hostname: rec.name,
      image: rec.image,
      layers: rec.layers,
      baseLayer: rec.baseLayer,
      agentLayer: rec.agentLayer,
      limits: rec.limits,
      diskMb: rec.limits.diskMb ?? null,
    };
  }

  limitsFrom(input: Partial<Limits> | undefined): Limits {
    return {
      memoryMb: input?.memoryMb ?? this.config.defaultMemoryMb,
      pids: input?.pids ?? this.config.defaultPids,
      cpuPercent: input?.cpuPercent ?? this.config.defaultCpuPercent,
      diskMb: input?.diskMb ?? (this.config.defaultDiskMb || null),
    };
  }

  /** Renames an instance or replaces its metadata. A new name is its hostname from its next
   * boot or fork on (a running sandbox keeps the one it has). */
  update(owner: string, id: string, patch: { name?: string | undefined; metadata?: Record<string, string> | undefined }): InstanceRecord {
    this.get(owner, id);
    if (patch.name !== undefined && !INSTANCE_NAME.test(patch.name)) {
      throw new InvalidRequestError('name must be 1-63 lowercase letters, digits or hyphens, not starting or ending with a hyphen', { name: patch.name });
    }
    return this.store.instances.update(id, {
      ...(patch.name !== undefined ? { name: patch.name } : {}),
      ...(patch.metadata !== undefined ? { metadata: patch.metadata } : {}),
    });
  }

  /** A new record in `starting`, with its disk and layer references; not yet booted. */
  newRecord(owner: string, input: CreateInstance, from?: Partial<InstanceRecord>): InstanceRecord {
    const image = input.image ?? this.config.defaultImage;
    if (!this.images.exists(image)) throw new InvalidRequestError(`unknown image ${image}`, { image });
    const id = newId('inst');
    const name = input.name ?? id.replace('_', '-');
    if (!INSTANCE_NAME.test(name)) {
      throw new InvalidRequestError('name must be 1-63 lowercase letters, digits or hyphens, not starting or ending with a hyphen', { name });
    }
    const now = new Date().toISOString();
    const rec: InstanceRecord = {
      id,
      owner,
      name,
      image,
      status: 'starting',
      layers: [],
      baseLayer: false,
      agentLayer: this.engine.currentAgentLayer,
      env: input.env ?? {},
      limits: this.limitsFrom(input.limits),
      metadata: input.metadata ?? {},
      pid: null,
      pidStart: null,
      sourceInstanceId: null,
      sourceCheckpointId: null,
      maxCheckpoints: input.maxCheckpoints ?? null,
      headCheckpointId: null,
      error: null,
      createdAt: now,
      updatedAt: now,
      ...from,
    };
    this.store.db.transaction(() => {
      this.store.instances.insert(rec);
      this.store.layers.setRefs(`instance:${rec.id}`, rec.layers);
    })();
    return rec;
  }

  async create(owner: string, input: CreateInstance): Promise<InstanceRecord> {
    await requireRoom(this.engine);
    const rec = this.newRecord(owner, input);
    try {
      return await this.locks.run(rec.id, () => this.bootRecord(rec, { freshUpper: true }));
    } catch (err) {
      // Out of space is not the instance's fault: nothing of it stays for a retry to trip on.
      if (err instanceof InsufficientStorageError) await this.discard(rec.id);
      throw err;
    }
  }

  /** Removes an instance a failed call made (never one a caller has seen running): its sandbox,
   * disk and record. Each step on its own, so that a full disk stops none of the others. */
  async discard(id: string): Promise<void> {
    await this.locks.run(id, async () => {
      await this.engine.destroy(id).catch((err: unknown) => this.log.warn({ err, instance: id }, 'could not remove a failed instance\'s sandbox'));
      try {
        this.store.db.transaction(() => {
          this.store.layers.dropHolder(`instance:${id}`);
          this.store.instances.delete(id);
        })();
      } catch (err) {
        this.log.warn({ err, instance: id }, 'could not remove a failed instance\'s record; it stays in error');
      }
    });
    await this.collectLayers().catch(() => {});
  }

  private async bootRecord(rec: InstanceRecord, opts: { freshUpper: boolean }): Promise<InstanceRecord> {
    try {
      const sb = await this.engine.boot(this.spec(rec), opts);
      return this.store.instances.update(rec.id, { status: 'running', pid: sb.pid, pidStart: sb.startTime, error: null });
    } catch (err) {
      this.log.error({ err, instance: rec.id }, 'boot failed');
      this.store.instances.update(rec.id, { status: 'error', pid: null, pidStart: null, error: (err as Error).message });
      throw this.engineFailure(err);
    }
  }

  /** Marks the record as running on the given sandbox. */
  running(id: string, sb: Sandbox, patch: Partial<InstanceRecord> = {}): InstanceRecord {
    this.sessions.delete(id);
    return this.store.instances.update(id, { ...patch, status: 'running', pid: sb.pid, pidStart: sb.startTime, error: null });
  }

  async stop(owner: string, id: string): Promise<InstanceRecord> {
    this.get(owner, id);
    return this.locks.run(id, async () => {
      await this.engine.stop(id);
      this.sessions.delete(id);
      return this.store.instances.update(id, { status: 'stopped', pid: null, pidStart: null });
    });
  }

  async start(owner: string, id: string): Promise<InstanceRecord> {
    this.get(owner, id);
    return this.locks.run(id, async () => {
      let rec = this.store.instances.get(id)!;
      if (rec.status === 'running') return rec;
      // A fresh boot maps no file of the old agent: it gets the newest one.
      if (rec.agentLayer !== this.engine.currentAgentLayer) rec = this.store.instances.update(id, { agentLayer: this.engine.currentAgentLayer });
      return this.bootRecord(rec, { freshUpper: false });
    });
  }

  /** Removes the instance, its disk and its checkpoints. Forks keep running: each holds its
   * own references to the layers it stands on, which go when the last holder goes. */
  async delete(owner: string, id: string, onCheckpoints: (instanceId: string) => Promise<void>): Promise<void> {
    this.get(owner, id);
    this.deleting.add(id);
    await this.locks.run(id, async () => {
      // Checkpoints first: that may have to wait for forks reading from them, or refuse.
      await onCheckpoints(id);
      await this.engine.destroy(id);
      this.sessions.delete(id);
      this.store.db.transaction(() => {
        this.store.layers.dropHolder(`instance:${id}`);
        this.store.instances.delete(id);
      })();
    }).finally(() => this.deleting.delete(id));
    await this.collectLayers();
  }

  /** Deletes layers nothing stands on any more. */
  async collectLayers(): Promise<void> {
    for (const layer of this.store.layers.takeUnreferenced()) await this.engine.removeLayer(layer);
  }

  /** The live sandbox of a running instance. */
  sandbox(owner: string, id: string): Sandbox {
    const rec = this.get(owner, id);
    const sb = this.engine.sandbox(id);
    if (rec.status !== 'running' || !sb) throw new ConflictError(`instance ${id} is ${rec.status}, not running`, { status: rec.status });
    return sb;
  }

  private envOf(rec: InstanceRecord, extra?: Record<string, string>): string[] {
    const env = { ...BASE_ENV, HOSTNAME: rec.name, ...rec.env, ...extra };
    return Object.entries(env).map(([k, v]) => `${k}=${v}`);
  }

  async exec(owner: string, id: string, input: ExecInput): Promise<ExecResult> {
    const rec = this.get(owner, id);
    const sb = this.sandbox(owner, id);
    const timeoutMs = input.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const maxOutputBytes = input.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
    const stdin = input.stdin !== undefined ? Buffer.from(input.stdin) : undefined;
    const spillDir = this.engine.layout.spill;
    try {
      if (input.session) {
        const session = await this.session(rec, sb, input.session);
        let script = Array.isArray(input.command) ? input.command.map(quote).join(' ') : input.command;
        if (input.cwd) script = `cd ${quote(input.cwd)} && ${script}`;
        if (input.env) script = `${Object.entries(input.env).map(([k, v]) => `export ${k}=${quote(v)}`).join('; ')}; ${script}`;
        return await session.run(script, { stdin, timeoutMs, maxOutputBytes, spillDir });
      }
      const argv = Array.isArray(input.command) ? input.command : ['/bin/sh', '-c', input.command];
      return await execOnce(sb, { argv, env: this.envOf(rec, input.env), cwd: input.cwd ?? '/', stdin, timeoutMs, maxOutputBytes, spillDir });
    } catch (err) {
      if (err instanceof EngineError && err.code === 'SPAWN_FAILED') {
        return { exitCode: 127, signal: 0, stdout: Output.of('', spillDir), stderr: Output.of(`${err.message}\n`, spillDir), durationMs: 0, timedOut: false, truncated: false };
      }
      throw this.engineFailure(err);
    }
  }

  /** The named shell session, found again after a restore or a restart from the registry
   * the sandbox keeps in its own filesystem (so it travels with checkpoints and forks). */
  private async session(rec: InstanceRecord, sb: Sandbox, name: string): Promise<ShellSession> {
    let byName = this.sessions.get(rec.id);
    if (!byName) this.sessions.set(rec.id, (byName = new Map()));
    const known = byName.get(name);
    if (known?.alive) return known;
    const registry = new SessionRegistry(sb);
    const entries = await registry.read();
    const saved = entries.get(name);
    if (saved) {
      const info = (await sb.list()).find((p) => p.id === saved && p.running);
      if (info) {
        const s = await ShellSession.adopt(sb, name, saved, [info.stdoutBytes, info.stderrBytes]);
        byName.set(name, s);
        return s;
      }
    }
    const s = await ShellSession.open(sb, name, this.envOf(rec));
    entries.set(name, s.processId);
    await registry.write(entries);
    byName.set(name, s);
    return s;
  }

  /** Runs one operation on an instance's sandbox, with engine and agent failures as API errors. */
  private async onSandbox<T>(owner: string, id: string, op: (sb: Sandbox) => Promise<T>): Promise<T> {
    const sb = this.sandbox(owner, id);
    try {
      return await op(sb);
    } catch (err) {
      throw this.engineFailure(err);
    }
  }

  async listSessions(owner: string, id: string): Promise<{ name: string; processId: number; running: boolean }[]> {
    return this.onSandbox(owner, id, async (sb) => {
      const [entries, procs] = await Promise.all([new SessionRegistry(sb).read(), sb.list()]);
      return [...entries].map(([name, pid]) => ({ name, processId: pid, running: procs.some((p) => p.id === pid && p.running) }));
    });
  }

  async closeSession(owner: string, id: string, name: string): Promise<void> {
    await this.onSandbox(owner, id, async (sb) => {
      const registry = new SessionRegistry(sb);
      const entries = await registry.read();
      const pid = entries.get(name);
      if (!pid) throw new NotFoundError('session', name);
      await signalProcess(sb, pid, 9);
      entries.delete(name);
      await registry.write(entries);
      this.sessions.get(id)?.delete(name);
    });
  }

  async startProcess(owner: string, id: string, input: BackgroundInput): Promise<{ id: number; pid: number }> {
    const rec = this.get(owner, id);
    const argv = Array.isArray(input.command) ? input.command : ['/bin/sh', '-c', input.command];
    return this.onSandbox(owner, id, (sb) => startBackground(sb, { argv, env: this.envOf(rec, input.env), cwd: input.cwd ?? '/', pty: input.pty }));
  }

  async listProcesses(owner: string, id: string): Promise<AgentProcessInfo[]> {
    return this.onSandbox(owner, id, (sb) => listProcesses(sb));
  }

  async processInfo(owner: string, id: string, processId: number): Promise<AgentProcessInfo> {
    const p = (await this.listProcesses(owner, id)).find((x) => x.id === processId);
    if (!p) throw new NotFoundError('process', String(processId));
    return p;
  }

  async processOutput(owner: string, id: string, processId: number, from: { stdout: number; stderr: number }): Promise<OutputChunk> {
    const out = await this.onSandbox(owner, id, (sb) => readOutput(sb, processId, from));
    if (!out) throw new NotFoundError('process', String(processId));
    return out;
  }

  async signalProcess(owner: string, id: string, processId: number, signo: number): Promise<void> {
    await this.processInfo(owner, id, processId);
    await this.onSandbox(owner, id, (sb) => signalProcess(sb, processId, signo));
  }

  async forgetProcess(owner: string, id: string, processId: number): Promise<void> {
    const p = await this.processInfo(owner, id, processId);
    await this.onSandbox(owner, id, async (sb) => {
      if (p.running) await signalProcess(sb, processId, 9);
      await forgetProcess(sb, processId);
    });
  }

  /** After a server restart: re-adopt what still runs, mark the rest stopped, and leave
   * nothing mounted or running that the store does not know. An instance cut short while it was
   * being created or forked is adopted if its sandbox came up, and is an `error` otherwise. */
  async recover(): Promise<void> {
    const known = new Set<string>();
    for (const rec of this.store.instances.all()) {
      known.add(rec.id);
      if (rec.status !== 'running' && rec.status !== 'starting') continue;
      const launched = rec.status === 'starting' ? await this.leftoverPid(rec.id) : rec.pid && rec.pidStart ? { pid: rec.pid, startTime: rec.pidStart } : undefined;
      const sb = launched ? await this.engine.adopt(this.spec(rec), launched.pid, launched.startTime) : undefined;
      if (sb) {
        if (rec.status === 'starting') this.running(rec.id, sb);
        this.log.info({ instance: rec.id, pid: sb.pid }, 're-adopted running sandbox');
        continue;
      }
      await this.killLeftover(rec.id);
      await this.engine.stop(rec.id).catch((err: unknown) => this.log.warn({ err, instance: rec.id }, 'cleanup failed'));
      if (rec.status === 'starting') {
        const what = rec.sourceCheckpointId ? `forked from checkpoint ${rec.sourceCheckpointId}` : 'created';
        this.store.instances.update(rec.id, { status: 'error', pid: null, pidStart: null, error: `the server stopped while the instance was being ${what}` });
        this.log.warn({ instance: rec.id }, 'instance cut short by a server stop; marked error');
      } else {
        this.store.instances.update(rec.id, { status: 'stopped', pid: null, pidStart: null });
        this.log.info({ instance: rec.id }, 'sandbox did not survive; marked stopped');
      }
    }
    for (const id of await this.engine.mountedInstances()) {
      if (known.has(id)) continue;
      await this.killLeftover(id);
      await this.engine.destroy(id).catch(() => {});
    }
  }

  /** The PID 1 a boot or restore wrote to run/pid, with its start time, if it runs. */
  private async leftoverPid(id: string): Promise<{ pid: number; startTime: string } | undefined> {
    const pid = Number(await readFile(`${this.engine.layout.run(id)}/pid`, 'utf8').catch(() => '0'));
    if (!Number.isInteger(pid) || pid <= 0) return undefined;
    const startTime = await processStartTime(pid).catch(() => undefined);
    return startTime ? { pid, startTime } : undefined;
  }

  /** A sandbox booted or restored while the server went down has its pid only in run/pid. */
  private async killLeftover(id: string): Promise<void> {
    const leftover = await this.leftoverPid(id);
    if (leftover) await this.engine.killStray(leftover.pid, leftover.startTime);
  }

  engineFailure(err: unknown): Error {
    return engineFailure(err);
  }
}
