import { PassThrough, Readable } from 'node:stream';
import { text } from 'node:stream/consumers';
import {
  AgentClosedError,
  AgentError,
  EMPTY_IMAGE_CONFIG,
  ENOENT,
  EngineError,
  type AgentPort,
  type AgentProcessInfo,
  type DirEntry,
  type FileStat,
  type FirewallEntry,
  type FreezeResult,
  type ImageConfig,
  type NetworkCounters,
  type NetworkRuntime,
  type NodeDisk,
  type ProcessListener,
  type SandboxEnd,
  type WatchListener,
  type WatchOp,
  type RuntimeHealth,
  type SandboxHandle,
  type SandboxUsage,
  type SandboxNetwork,
  type SandboxRuntime,
  type SandboxSpec,
  type SpawnRequest,
  type SubscribeOptions,
  type Subscription,
  type SystemImages,
  type ImagePuller,
  type VolumeDisks,
  PullError,
} from '../../src/seam/index.js';

/**
 * An engine in memory, behind the same seam as the real one: sandboxes are tables of files and
 * processes, layers and memory images are copies of them. It keeps the real engine's contract
 * (a checkpoint freezes the upper into a layer and snapshots memory; a restore starts from the
 * snapshot on a fresh upper; a fresh boot has none of the memory) so that the core's logic can
 * be tested without root. Its state lives in a FakeHost, which outlives a server the way a
 * host's processes outlive a kill -9.
 */

/** A path's contents in an upper or layer; null is a whiteout (deleted above a lower layer). */
type Tree = Map<string, Buffer | null>;

/** What a fake process is: the memory a command sees (`set`/`get`) and what it wrote. */
interface FakeProcess {
  id: number;
  pid: number;
  argv: string[];
  running: boolean;
  exitCode: number;
  signal: number;
  out: [Buffer[], Buffer[]];
}

/** A sandbox's memory and processes: what a memory image holds. */
interface MemoryState {
  vars: Map<string, string>;
  procs: Map<number, FakeProcess>;
}

const cloneMemory = (m: MemoryState): MemoryState => ({
  vars: new Map(m.vars),
  procs: new Map([...m.procs].map(([k, p]) => [k, { ...p, argv: [...p.argv], out: [[...p.out[0]], [...p.out[1]]] as [Buffer[], Buffer[]] }])),
});

/** The places a test can make the engine fail, once each. */
export type FaultPoint = 'boot' | 'restore' | 'dump' | 'replace' | 'hibernate';

/** A sandbox process on the "host": survives the server that started it. */
interface HostSandbox {
  pid: number;
  startTime: string;
  memory: MemoryState;
}

/** The machine the fake engines run on: its disks, its memory images, its live sandboxes. */
export class FakeHost {
  readonly layers = new Map<string, Tree>();
  readonly memoryImages = new Map<string, MemoryState>();
  readonly uppers = new Map<string, Tree>();
  readonly mounted = new Set<string>();
  readonly running = new Map<string, HostSandbox>();
  /** Sandboxes whose processes are frozen (a fenced node's). */
  readonly frozen = new Set<string>();
  /** Sandboxes whose PID 1 died (endSandbox): their calls fail as an unreachable agent's. */
  readonly ended = new Set<string>();
  /** The most entries an upper may hold for a files-only checkpoint to copy it (the real
   * engine's COPY_LIMITS); beyond, it is frozen by rename. */
  upperCopyLimit = Infinity;
  /** The agent build this machine's servers have, and the agent layers on its disk. */
  agentBuild = 'agent-fake';
  readonly agentLayers = new Set<string>();
  /** Every engine call, in order: what the tests read to see what the core asked. */
  readonly calls: string[] = [];
  private readonly faults = new Map<FaultPoint, number>();
  private nextPid = 1000;

  /** The `n`th next call at `point` (1: the next) fails. */
  failAt(point: FaultPoint, n = 1): void {
    this.faults.set(point, n);
  }

  checkFault(point: FaultPoint): void {
    const n = this.faults.get(point);
    if (n === undefined) return;
    if (n > 1) {
      this.faults.set(point, n - 1);
      return;
    }
    this.faults.delete(point);
    const code = point === 'dump' || point === 'hibernate' ? 'DUMP_FAILED' : point === 'boot' ? 'BOOT_FAILED' : 'RESTORE_FAILED';
    throw new EngineError(code, `injected fault at ${point}`);
  }

  launch(id: string, memory: MemoryState): HostSandbox {
    const h = { pid: this.nextPid++, startTime: String(Date.now()), memory };
    this.running.set(id, h);
    this.mounted.add(id);
    return h;
  }

  kill(id: string): void {
    this.frozen.delete(id);
    this.ended.delete(id);
    const h = this.running.get(id);
    if (h) for (const p of h.memory.procs.values()) p.running = false;
    this.running.delete(id);
    this.mounted.delete(id);
  }
}

/** The files a sandbox sees: its upper over its layers, newest first. */
class FileView {
  constructor(
    private readonly host: FakeHost,
    private readonly id: string,
    private readonly layers: () => string[],
  ) {}

  private get upper(): Tree {
    let u = this.host.uppers.get(this.id);
    if (!u) this.host.uppers.set(this.id, (u = new Map()));
    return u;
  }

  read(path: string): Buffer | undefined {
    if (this.upper.has(path)) return this.upper.get(path) ?? undefined;
    for (const l of this.layers()) {
      const t = this.host.layers.get(l);
      if (t?.has(path)) return t.get(path) ?? undefined;
    }
    return undefined;
  }

  write(path: string, data: Buffer): void {
    this.upper.set(path, data);
  }

  remove(path: string): void {
    this.upper.set(path, null);
  }

  list(dir: string): DirEntry[] {
    const prefix = dir.endsWith('/') ? dir : `${dir}/`;
    const names = new Map<string, DirEntry>();
    for (const t of [...this.layers().map((l) => this.host.layers.get(l) ?? new Map()), this.upper].reverse()) {
      for (const [p] of t) {
        if (!p.startsWith(prefix) || names.has(p.slice(prefix.length).split('/')[0]!)) continue;
        const rest = p.slice(prefix.length).split('/');
        const data = this.read(p);
        if (rest.length === 1 && data === undefined) continue;
        names.set(rest[0]!, rest.length > 1 ? { name: rest[0]!, type: 'dir', size: 0 } : { name: rest[0]!, type: 'file', size: data!.length });
      }
    }
    return [...names.values()];
  }
}

/** A sandbox's agent, in memory. Commands are a little shell: `echo`, `exit N`, `set K V`,
 * `get K` (memory), `cat P` (files), `sleep` (runs until signalled). */
class FakeAgent implements AgentPort {
  private readonly listeners = new Map<number, ProcessListener>();
  private readonly watchers = new Map<number, { dir: string; recursive: boolean; listener: WatchListener }>();
  isOpen = true;

  constructor(
    private readonly box: FakeSandbox,
  ) {}

  private get memory(): MemoryState {
    return this.box.memory();
  }

  async spawn(id: number, req: SpawnRequest, listener: ProcessListener): Promise<number> {
    const p: FakeProcess = { id, pid: 2 + this.memory.procs.size, argv: req.argv, running: true, exitCode: 0, signal: 0, out: [[], []] };
    this.memory.procs.set(id, p);
    this.listeners.set(id, listener);
    const script = req.argv[0] === '/bin/sh' && req.argv[1] === '-c' ? (req.argv[2] ?? '') : req.argv.join(' ');
    setImmediate(() => this.run(p, script.trim().split(/\s+/)));
    return p.pid;
  }

  private emit(p: FakeProcess, stream: 1 | 2, s: string): void {
    const data = Buffer.from(s);
    const offset = p.out[stream - 1].reduce((n, b) => n + b.length, 0);
    p.out[stream - 1].push(data);
    this.listeners.get(p.id)?.onOutput(stream, offset, data);
  }

  private exit(p: FakeProcess, code: number, signal = 0): void {
    if (!p.running) return;
    p.running = false;
    p.exitCode = code;
    p.signal = signal;
    const l = this.listeners.get(p.id);
    this.listeners.delete(p.id);
    l?.onExit(code, signal);
  }

  private run(p: FakeProcess, [cmd, ...args]: string[]): void {
    const files = this.box.files;
    switch (cmd) {
      case 'echo':
        this.emit(p, 1, `${args.join(' ')}\n`);
        return this.exit(p, 0);
      case 'exit':
        return this.exit(p, Number(args[0] ?? 0));
      case 'set':
        this.memory.vars.set(args[0] ?? '', args.slice(1).join(' '));
        return this.exit(p, 0);
      case 'get':
        this.emit(p, 1, `${this.memory.vars.get(args[0] ?? '') ?? ''}\n`);
        return this.exit(p, 0);
      case 'cat': {
        const data = files.read(args[0] ?? '');
        if (data === undefined) {
          this.emit(p, 2, `cat: ${args[0]}: No such file or directory\n`);
          return this.exit(p, 1);
        }
        this.emit(p, 1, data.toString());
        return this.exit(p, 0);
      }
      case 'sleep':
        return;
      default:
        this.emit(p, 2, `sh: ${cmd}: not found\n`);
        return this.exit(p, 127);
    }
  }

  attach(id: number, stdoutOffset: number, stderrOffset: number, listener: ProcessListener): void {
    const p = this.memory.procs.get(id);
    if (!p) {
      setImmediate(() => listener.onLost(new AgentError(ENOENT, `no process ${id}`)));
      return;
    }
    const replay = (stream: 1 | 2, from: number) => {
      let at = 0;
      for (const b of p.out[stream - 1]) {
        if (at + b.length > from) listener.onOutput(stream, Math.max(at, from), b.subarray(Math.max(0, from - at)));
        at += b.length;
      }
    };
    replay(1, stdoutOffset);
    replay(2, stderrOffset);
    if (p.running) this.listeners.set(id, listener);
    else listener.onExit(p.exitCode, p.signal);
  }

  detach(id: number): void {
    this.listeners.delete(id);
  }

  /** Whether a client follows the process's output and end. */
  followed(id: number): boolean {
    return this.listeners.has(id);
  }

  stdin(): void {}
  closeStdin(): void {}
  resize(): void {}

  signal(id: number, signo: number): void {
    const p = this.memory.procs.get(id);
    if (p?.running) this.exit(p, 128 + signo, signo);
  }

  forget(id: number): void {
    this.memory.procs.delete(id);
    this.listeners.delete(id);
  }

  /** Every follower of this connection is told its processes are gone. */
  loseAll(err: Error): void {
    for (const l of this.listeners.values()) l.onLost(err);
    this.listeners.clear();
    // The real agent's connection closes under its watches (a pause, a stop).
    for (const w of this.watchers.values()) w.listener.onEnd(new AgentClosedError());
    this.watchers.clear();
    this.isOpen = false;
  }

  async list(): Promise<AgentProcessInfo[]> {
    return [...this.memory.procs.values()].map((p) => ({
      id: p.id, pid: p.pid, running: p.running, exitCode: p.exitCode, signal: p.signal, pty: false,
      stdoutBytes: p.out[0].reduce((n, b) => n + b.length, 0), stderrBytes: p.out[1].reduce((n, b) => n + b.length, 0), command: p.argv.join(' '),
    }));
  }

  ping(): Promise<void> {
    return new Promise((r) => setImmediate(r));
  }

  /** What inotify would tell the watches of `path`'s directories. */
  private changed(path: string, ...ops: WatchOp[]): void {
    for (const w of this.watchers.values()) {
      const name = path.startsWith(`${w.dir}/`) ? path.slice(w.dir.length + 1) : undefined;
      if (!name || (!w.recursive && name.includes('/'))) continue;
      const tell = () => ops.forEach((op) => w.listener.onEvent({ op, name }));
      if (this.box.watchDelayMs) setTimeout(tell, this.box.watchDelayMs);
      else tell();
    }
  }

  async writeFile(path: string, data: Buffer | string): Promise<void> {
    const created = this.box.files.read(path) === undefined;
    this.box.files.write(path, Buffer.from(data));
    this.changed(path, ...(created ? (['create', 'write'] as const) : (['write'] as const)));
  }

  async watch(id: number, path: string, recursive: boolean, listener: WatchListener): Promise<void> {
    if (!(await this.stat(path))) throw new AgentError(ENOENT, `${path}: no such directory`);
    this.watchers.set(id, { dir: path.replace(/\/+$/, ''), recursive, listener });
  }

  unwatch(id: number): void {
    this.watchers.delete(id);
  }

  async readFile(path: string, max: number, offset = 0): Promise<{ data: Buffer; truncated: boolean } | undefined> {
    const d = this.box.files.read(path);
    if (d === undefined) return undefined;
    const rest = d.subarray(offset);
    return { data: rest.subarray(0, max), truncated: rest.length > max };
  }

  async writeAt(path: string, offset: number, data: Buffer, opts: { truncate: boolean }): Promise<void> {
    const old = opts.truncate ? Buffer.alloc(0) : (this.box.files.read(path) ?? Buffer.alloc(0));
    const next = Buffer.alloc(Math.max(old.length, offset + data.length));
    old.copy(next);
    data.copy(next, offset);
    const created = this.box.files.read(path) === undefined;
    this.box.files.write(path, next);
    this.changed(path, ...(created ? (['create', 'write'] as const) : (['write'] as const)));
  }

  async rename(from: string, to: string): Promise<void> {
    const d = this.box.files.read(from);
    if (d === undefined) throw new AgentError(ENOENT, `${from}: no such file`);
    this.box.files.write(to, d);
    this.box.files.remove(from);
    this.changed(from, 'rename');
    this.changed(to, 'create');
  }

  async stat(path: string): Promise<FileStat | undefined> {
    if (this.box.statDelayMs) await new Promise((r) => setTimeout(r, this.box.statDelayMs));
    const d = this.box.files.read(path);
    if (d !== undefined) return { type: 'file', size: d.length, mode: 0o644, mtimeMs: 0, target: null };
    return path === '/' || this.box.files.list(path).length ? { type: 'dir', size: 0, mode: 0o755, mtimeMs: 0, target: null } : undefined;
  }

  async removeFile(path: string): Promise<void> {
    if (this.box.files.read(path) === undefined) throw new AgentError(ENOENT, `${path}: no such file`);
    this.box.files.remove(path);
  }

  async listDir(path: string): Promise<DirEntry[]> {
    return this.box.files.list(path);
  }

  async mkdir(): Promise<void> {}

  async setMetadata(): Promise<void> {}
  async setOwnerMode(): Promise<void> {}
}

export class FakeSandbox implements SandboxHandle {
  private agentPort: FakeAgent;
  readonly files: FileView;
  stopped = false;
  /** How long the agent takes to answer a stat (a busy sandbox's), for tests of what waits on one. */
  statDelayMs = 0;
  /** How long a watch's events take to come (they come on a connection of their own). */
  watchDelayMs = 0;

  constructor(
    private readonly host: FakeHost,
    readonly id: string,
    public spec: SandboxSpec,
  ) {
    this.files = new FileView(host, id, () => this.spec.layers);
    this.agentPort = new FakeAgent(this);
  }

  private get hosted(): HostSandbox {
    const h = this.host.running.get(this.id);
    if (!h || this.stopped) throw new EngineError('NOT_RUNNING', `sandbox ${this.id} stopped`);
    if (this.host.frozen.has(this.id)) throw new EngineError('AGENT_UNREACHABLE', `sandbox ${this.id} is frozen`);
    if (this.host.ended.has(this.id)) throw new EngineError('AGENT_UNREACHABLE', `the agent of ${this.id} is gone`);
    return h;
  }

  memory(): MemoryState {
    return this.hosted.memory;
  }

  get pid(): number {
    return this.host.running.get(this.id)?.pid ?? 0;
  }

  get startTime(): string {
    return this.host.running.get(this.id)?.startTime ?? '';
  }

  /** A new PID 1 (a rollback): the old one's followers are told their processes are gone. */
  renew(spec: SandboxSpec): void {
    this.spec = spec;
    const old = this.agentPort;
    this.agentPort = new FakeAgent(this); // in place before the old one's followers hear of it
    old.loseAll(new AgentError(0, 'the sandbox was replaced'));
  }

  stop(): void {
    this.stopped = true;
    this.agentPort.loseAll(new AgentError(0, 'the sandbox stopped'));
  }

  hold(): () => void {
    return () => {};
  }

  async agent(): Promise<AgentPort> {
    this.hosted;
    return this.agentPort;
  }

  async call<T>(request: (agent: AgentPort) => Promise<T>): Promise<T> {
    return request(await this.agent());
  }

  sideAgent(): Promise<AgentPort> {
    return this.agent();
  }

  releaseSide(): void {}

  async start(id: number, req: SpawnRequest, listener: ProcessListener): Promise<number> {
    return (await this.agent()).spawn(id, req, listener);
  }

  async follow(id: number, offsets: [number, number], listener: ProcessListener): Promise<void> {
    await this.subscribe(id, offsets, listener);
  }

  async subscribe(id: number, offsets: [number, number], listener: ProcessListener, opts: SubscribeOptions = {}): Promise<Subscription> {
    const a = await this.agent();
    a.attach(id, offsets[0], offsets[1], listener);
    setImmediate(() => opts.onReplayed?.());
    return { close: () => a.detach(id) };
  }

  untrack(): void {}

  async list(): Promise<AgentProcessInfo[]> {
    return (await this.agent()).list();
  }

  /** Whether the server follows the process (its output comes to the server as it is made). */
  followed(id: number): boolean {
    return this.agentPort.followed(id);
  }
}

class FakeNetwork implements NetworkRuntime {
  private next = 2;
  readonly policies = new Map<string, FirewallEntry>();

  async init(entries: FirewallEntry[]): Promise<void> {
    for (const e of entries) this.policies.set(e.id, e);
  }

  allocate(used: Set<string>): SandboxNetwork | undefined {
    for (let i = 0; i < 250; i++, this.next = (this.next % 250) + 2) {
      const address = `10.213.0.${this.next}`;
      if (!used.has(address)) return { address, mac: '02:00:00:00:00:01' };
    }
    return undefined;
  }

  async setPolicy(id: string, address: string, policy: FirewallEntry['policy']): Promise<void> {
    this.policies.set(id, { id, address, policy });
  }

  async release(id: string): Promise<void> {
    this.policies.delete(id);
  }

  async forget(id: string): Promise<void> {
    this.policies.delete(id);
  }

  counters(): NetworkCounters {
    return { sentBytes: 0, receivedBytes: 0 };
  }

  async destroy(): Promise<void> {
    this.policies.clear();
  }
}

class FakeImages implements SystemImages {
  constructor(private readonly names: string[]) {}
  exists(name: string): boolean {
    return this.names.includes(name);
  }
  present(name: string): boolean {
    return this.exists(name);
  }
  identity(name: string): string {
    return `fake-${name}`;
  }
  createdAt(): string {
    return '2026-01-01T00:00:00.000Z';
  }
  config(name: string): ImageConfig | undefined {
    return this.exists(name) ? EMPTY_IMAGE_CONFIG : undefined;
  }
  async list(): Promise<{ name: string; createdAt: string }[]> {
    return this.names.map((name) => ({ name, createdAt: this.createdAt() }));
  }
  async materialize(): Promise<void> {}
  /** No registry here: nothing is ever pulled. */
  async pulled(): Promise<string[]> {
    return [];
  }
  async removePulled(): Promise<void> {}
}

class FakeDisk implements NodeDisk {
  constructor(private readonly host: FakeHost) {}
  recoverFrozenLayer(layerId: string): boolean {
    return this.host.layers.has(layerId);
  }
  async syncLayer(): Promise<void> {}
  async removeLayer(layerId: string): Promise<void> {
    this.host.layers.delete(layerId);
  }
  async layerBytes(layerId: string): Promise<number> {
    return [...(this.host.layers.get(layerId)?.values() ?? [])].reduce((n, b) => n + (b?.length ?? 0), 0);
  }
  async removeCheckpointImages(imagesId: string): Promise<void> {
    this.host.memoryImages.delete(imagesId);
  }
  async checkpointImageBytes(imagesId: string): Promise<number> {
    return this.host.memoryImages.has(imagesId) ? 4096 : 0;
  }
  hasCheckpointImages(imagesId: string): boolean {
    return this.host.memoryImages.has(imagesId);
  }
  dumpComplete(imagesId: string): boolean {
    return this.host.memoryImages.has(imagesId);
  }
  exportLayer(layerId: string): Readable {
    const t = this.host.layers.get(layerId);
    // As the real disk's tar does for a layer deleted meanwhile: a stream that fails a moment later.
    if (!t) {
      const failing = new PassThrough();
      process.nextTick(() => failing.destroy(new Error(`tar of layer ${layerId} failed: no such layer`)));
      return failing;
    }
    return Readable.from([JSON.stringify([...t].map(([p, b]) => [p, b?.toString('base64') ?? null]))]);
  }
  exportCheckpointImages(imagesId: string): Readable {
    const m = this.host.memoryImages.get(imagesId);
    return Readable.from([JSON.stringify(m ? [...m.vars] : [])]);
  }
  hasLayer(layerId: string): boolean {
    return this.host.layers.has(layerId);
  }
  async localLayers(): Promise<string[]> {
    return [...this.host.layers.keys()];
  }
  async localCheckpointImages(): Promise<string[]> {
    return [...this.host.memoryImages.keys()];
  }
  async importLayer(layerId: string, tar: Readable): Promise<void> {
    const entries = JSON.parse(await text(tar)) as [string, string | null][];
    this.host.layers.set(layerId, new Map(entries.map(([p, b]) => [p, b === null ? null : Buffer.from(b, 'base64')])));
  }
  async importCheckpointImages(imagesId: string, tar: Readable): Promise<void> {
    this.host.memoryImages.set(imagesId, { vars: new Map(JSON.parse(await text(tar)) as [string, string][]), procs: new Map() });
  }
}

/** One server's engine over a FakeHost. */
export class FakeEngine implements SandboxRuntime {
  readonly network = new FakeNetwork();
  readonly images: SystemImages;
  /** No registry here: a pull says so (the real one is in test/registry.test.ts). */
  readonly puller: ImagePuller = {
    pull: async (req) => {
      throw new PullError('UNREACHABLE', `the fake engine reaches no registry (${req.image.registry})`);
    },
    trimCache: async () => ({ removedBytes: 0 }),
  };
  readonly disk: NodeDisk;
  /** Volumes as sizes only: no fake sandbox sees their files (test/volumes.test.ts runs real ones). */
  readonly volumes: VolumeDisks = (() => {
    const made = new Map<string, number>();
    return {
      create: async (id: string, sizeMb: number) => void made.set(id, sizeMb),
      remove: async (id: string) => void made.delete(id),
      has: (id: string) => made.has(id),
      usedBytes: async () => 0,
      withFiles: async (id: string) => {
        throw new EngineError('VOLUME_NOT_HERE', `the fake engine serves no volume's files (${id})`);
      },
    };
  })();
  private readonly live = new Map<string, FakeSandbox>();

  constructor(
    readonly host: FakeHost = new FakeHost(),
    images: string[] = ['default'],
  ) {
    this.images = new FakeImages(images);
    this.disk = new FakeDisk(host);
  }

  private note(call: string): void {
    this.host.calls.push(call);
  }

  get currentAgentLayer(): string {
    return this.host.agentBuild;
  }
  hasAgentLayer(id: string): boolean {
    return this.host.agentLayers.has(id);
  }

  async init(): Promise<void> {
    this.host.agentLayers.add(this.host.agentBuild);
  }
  async shutdown(): Promise<void> {
    this.live.clear();
  }
  async health(): Promise<RuntimeHealth> {
    return { criu: { version: 'fake', ok: true }, cgroups: 2, overlay: true, root: true, agent: true, lazyRestores: 'off', incrementalCheckpoints: 'off' };
  }

  sandbox(id: string): FakeSandbox | undefined {
    return this.live.get(id);
  }

  private readonly endListeners = new Set<(end: SandboxEnd) => void>();
  onSandboxEnded(listener: (end: SandboxEnd) => void): () => void {
    this.endListeners.add(listener);
    return () => this.endListeners.delete(listener);
  }

  /** The sandbox's PID 1 dies (a kill from the host, say), and the engine tells of it as the
   * real one's EndWatch would. */
  endSandbox(id: string, reason = 'its PID 1 was killed'): void {
    const sb = this.live.get(id);
    if (!sb) throw new Error(`no live sandbox ${id}`);
    const end: SandboxEnd = { id, sandbox: sb, pid: sb.pid, startTime: sb.startTime, reason };
    this.host.ended.add(id);
    for (const listener of this.endListeners) listener(end);
  }

  liveIds(): string[] {
    return [...this.live.keys()];
  }

  async freeze(id: string): Promise<void> {
    this.note(`freeze ${id}`);
    this.host.frozen.add(id);
  }

  async thaw(id: string): Promise<void> {
    this.note(`thaw ${id}`);
    this.host.frozen.delete(id);
  }

  private attach(spec: SandboxSpec): FakeSandbox {
    const sb = new FakeSandbox(this.host, spec.id, spec);
    this.live.set(spec.id, sb);
    return sb;
  }

  /** The real engine's overlay mount fails on a lower that is not on the disk. */
  private requireAgentLayer(spec: SandboxSpec): void {
    if (!this.host.agentLayers.has(spec.agentLayer)) throw new EngineError('BOOT_FAILED', `mount: agent layer ${spec.agentLayer} not found`);
  }

  async boot(spec: SandboxSpec, opts: { freshUpper: boolean }): Promise<SandboxHandle> {
    this.note(`boot ${spec.id}`);
    this.requireAgentLayer(spec);
    if (opts.freshUpper) this.host.uppers.set(spec.id, new Map());
    this.host.launch(spec.id, { vars: new Map(), procs: new Map() });
    try {
      this.host.checkFault('boot');
    } catch (err) {
      this.host.kill(spec.id); // what a failed launch started does not outlive it
      throw err;
    }
    return this.attach(spec);
  }

  /** Standbys: restored, held frozen until activated. */
  readonly standing = new Set<string>();

  async activate(id: string, opts: { hostname?: string } = {}): Promise<void> {
    this.note(`activate ${id}${opts.hostname ? ` ${opts.hostname}` : ''}`);
    if (!this.standing.delete(id)) throw new EngineError('NOT_RUNNING', `sandbox ${id} is not held in standby`);
    this.host.frozen.delete(id);
  }

  async hold(id: string): Promise<void> {
    this.note(`hold ${id}`);
    if (!this.live.has(id)) throw new EngineError('NOT_RUNNING', `sandbox ${id} is not running`);
    this.standing.add(id);
    this.host.frozen.add(id);
  }

  async restore(spec: SandboxSpec, imagesId: string): Promise<SandboxHandle> {
    this.note(`restore ${spec.id} ${imagesId}`);
    const memory = this.host.memoryImages.get(imagesId);
    if (!memory) throw new EngineError('RESTORE_FAILED', `no memory image ${imagesId}`);
    this.requireAgentLayer(spec);
    this.host.uppers.set(spec.id, new Map());
    this.host.launch(spec.id, cloneMemory(memory));
    try {
      this.host.checkFault('restore');
    } catch (err) {
      this.host.kill(spec.id);
      throw err;
    }
    return this.attach(spec);
  }

  async adopt(spec: SandboxSpec, pid: number, startTime: string): Promise<SandboxHandle | undefined> {
    const h = this.host.running.get(spec.id);
    if (!h || h.pid !== pid || h.startTime !== startTime || !this.host.mounted.has(spec.id)) return undefined;
    if (this.host.frozen.has(spec.id)) return undefined; // its agent does not answer
    this.note(`adopt ${spec.id}`);
    return this.attach(spec);
  }

  /** Rollbacks' standbys: the images and spec each was held for. */
  readonly rollbackStandbys = new Map<string, { imagesId: string; fits: string }>();

  async holdRollback(spec: SandboxSpec, imagesId: string): Promise<{ memoryBytes: number } | undefined> {
    this.note(`holdRollback ${spec.id} ${imagesId}`);
    if (!this.live.has(spec.id) || !this.host.memoryImages.has(imagesId) || spec.volumes.length) return undefined;
    this.rollbackStandbys.set(spec.id, { imagesId, fits: JSON.stringify(spec) });
    return { memoryBytes: 1024 * 1024 };
  }

  async dropRollback(id: string, imagesId?: string): Promise<void> {
    const held = this.rollbackStandbys.get(id);
    if (!held || (imagesId !== undefined && held.imagesId !== imagesId)) return;
    this.rollbackStandbys.delete(id);
    this.note(`dropRollback ${id}`);
  }

  async replace(spec: SandboxSpec, imagesId: string | undefined): Promise<{ sandbox: SandboxHandle; warm: boolean }> {
    const held = this.rollbackStandbys.get(spec.id);
    const warm = held !== undefined && this.live.has(spec.id) && held.imagesId === imagesId && held.fits === JSON.stringify(spec);
    if (warm) this.rollbackStandbys.delete(spec.id);
    this.note(`replace ${spec.id} ${imagesId ?? 'boot'}${warm ? ' warm' : ''}`);
    return { sandbox: await this.replaced(spec, imagesId), warm };
  }

  private async replaced(spec: SandboxSpec, imagesId: string | undefined): Promise<SandboxHandle> {
    const memory = imagesId === undefined ? { vars: new Map<string, string>(), procs: new Map() } : this.host.memoryImages.get(imagesId);
    if (!memory) throw new EngineError('RESTORE_FAILED', `no memory image ${imagesId}`);
    const sb = this.live.get(spec.id);
    this.host.kill(spec.id);
    this.host.uppers.set(spec.id, new Map());
    this.host.launch(spec.id, cloneMemory(memory));
    try {
      this.host.checkFault('replace');
    } catch (err) {
      this.host.kill(spec.id);
      this.live.get(spec.id)?.stop();
      this.live.delete(spec.id);
      throw err;
    }
    if (!sb) return this.attach(spec);
    sb.renew(spec);
    return sb;
  }

  async stop(id: string): Promise<void> {
    this.note(`stop ${id}`);
    this.rollbackStandbys.delete(id);
    this.live.get(id)?.stop();
    this.live.delete(id);
    this.host.kill(id);
  }

  async destroy(id: string): Promise<void> {
    await this.stop(id);
    this.host.uppers.delete(id);
  }

  async mountedInstances(): Promise<string[]> {
    return [...this.host.mounted];
  }

  async isMounted(id: string): Promise<boolean> {
    return this.host.mounted.has(id);
  }

  async leftoverPid(id: string): Promise<{ pid: number; startTime: string } | undefined> {
    const h = this.host.running.get(id);
    return h && { pid: h.pid, startTime: h.startTime };
  }

  async killStray(pid: number): Promise<void> {
    for (const [id, h] of this.host.running) if (h.pid === pid) this.host.kill(id);
  }

  private freezeUpper(id: string, layerId: string): void {
    this.host.layers.set(layerId, this.host.uppers.get(id) ?? new Map());
    this.host.uppers.set(id, new Map());
  }

  async freezeRunning(spec: SandboxSpec, layerId: string, imagesId: string, release?: () => void): Promise<FreezeResult> {
    this.note(`checkpoint ${spec.id} ${layerId}`);
    release?.();
    const sb = this.live.get(spec.id);
    const h = this.host.running.get(spec.id);
    if (!sb || !h) throw new EngineError('NOT_RUNNING', `sandbox ${spec.id} is not running`);
    this.host.checkFault('dump');
    this.host.memoryImages.set(imagesId, cloneMemory(h.memory));
    this.freezeUpper(spec.id, layerId);
    sb.spec = { ...spec, layers: [layerId, ...spec.layers] };
    return { layerId, pauseMs: 1 };
  }

  async copyRunningUpper(spec: SandboxSpec, layerId: string, opts: { imagesId?: string; release?: () => void } = {}): Promise<FreezeResult> {
    this.note(`copy upper ${spec.id} ${layerId}${opts.imagesId ? ' with memory' : ''}`);
    const h = this.host.running.get(spec.id);
    if (!this.live.get(spec.id) || !h) throw new EngineError('NOT_RUNNING', `sandbox ${spec.id} is not running`);
    const upper = this.host.uppers.get(spec.id) ?? new Map();
    if (upper.size > this.host.upperCopyLimit) throw new EngineError('UPPER_NOT_COPIED', `the upper of ${spec.id} holds ${upper.size} entries`);
    opts.release?.();
    if (opts.imagesId) {
      this.host.checkFault('dump');
      this.host.memoryImages.set(opts.imagesId, cloneMemory(h.memory));
    }
    this.host.layers.set(layerId, new Map(upper));
    return { layerId, pauseMs: 1 };
  }

  async freezeStopped(id: string, layerId: string): Promise<void> {
    if (this.host.mounted.has(id)) throw new EngineError('NOT_RUNNING', `instance ${id} is mounted`);
    this.freezeUpper(id, layerId);
  }

  async hibernate(spec: SandboxSpec, layerId: string, imagesId: string): Promise<{ pauseMs: number }> {
    this.note(`hibernate ${spec.id}`);
    this.rollbackStandbys.delete(spec.id);
    const h = this.host.running.get(spec.id);
    if (!h) throw new EngineError('NOT_RUNNING', `sandbox ${spec.id} is not running`);
    this.host.checkFault('hibernate');
    this.host.memoryImages.set(imagesId, cloneMemory(h.memory));
    this.live.get(spec.id)?.stop();
    this.live.delete(spec.id);
    this.host.kill(spec.id);
    this.freezeUpper(spec.id, layerId);
    return { pauseMs: 1 };
  }

  async squash(layers: string[], _image: string | null, into: string): Promise<void> {
    const merged: Tree = new Map();
    for (const l of [...layers].reverse()) for (const [p, b] of this.host.layers.get(l) ?? []) merged.set(p, b);
    this.host.layers.set(into, merged);
  }

  async freeBytes(): Promise<number> {
    return 2 ** 40;
  }

  async memoryInUse(): Promise<number> {
    return 1 << 20;
  }

  async usage(id: string): Promise<SandboxUsage> {
    let diskBytes = 0;
    for (const b of this.host.uppers.get(id)?.values() ?? []) diskBytes += b?.length ?? 0;
    return { cpuUs: 0, memoryBytes: 1 << 20, diskBytes };
  }
}
