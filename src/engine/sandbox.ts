import { lstatSync } from 'node:fs';
import { AgentClient, AgentClosedError, AgentError, type ProcessListener } from './agent/client.js';
import type { AgentProcessInfo, SpawnRequest } from './agent/protocol.js';
import { EngineError } from './errors.js';

/** A process the engine waits on: its listener survives reconnects, and it is re-attached
 * from the byte offsets it has seen, so a dump in the middle loses no output. */
interface Tracked {
  listener: ProcessListener;
  offsets: [number, number];
  /** False until the agent confirmed the spawn: a spawn waiting at the gate is not re-attached. */
  spawned: boolean;
}

/** The live side of one running sandbox: its PID 1 and the connection to its agent. During a
 * pause (checkpoint, rollback) the connection is closed, callers wait at the gate, and running
 * commands go on inside the sandbox to be picked up again after the restore. */
export class Sandbox {
  private client: AgentClient | undefined;
  private gate: Promise<void> | undefined;
  /** Held between a checkpoint request and its pause: calls that come after the request wait,
   * so that the checkpoint is of the state as it was when asked for. */
  private held: { gate: Promise<void>; open: () => void; count: number } | undefined;
  private readonly tracked = new Map<number, Tracked>();
  private readonly sideClients = new Set<AgentClient>();
  /** Requests sent and not yet answered: a pause lets them finish before it closes the socket. */
  private readonly inflight = new Set<Promise<unknown>>();

  constructor(
    readonly id: string,
    public pid: number,
    public startTime: string,
  ) {}

  get socketPath(): string {
    return `/proc/${this.pid}/root/.fp/agent.sock`;
  }

  /**
   * Paths through /proc/<pid>/root resolve absolute symlinks against the host's root, so a
   * sandbox could point one at a host socket. Every other file access goes through the agent;
   * for the socket itself, the directory and the socket must be what the agent made.
   */
  private checkSocketPath(): void {
    const dir = lstatSync(`/proc/${this.pid}/root/.fp`);
    const sock = lstatSync(this.socketPath);
    if (!dir.isDirectory() || !sock.isSocket()) {
      throw new EngineError('AGENT_UNREACHABLE', `agent socket of ${this.id} was replaced inside the sandbox`);
    }
  }

  async connect(timeoutMs = 3000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        this.checkSocketPath();
        this.client = await AgentClient.connect(this.socketPath);
        return;
      } catch (err) {
        if (Date.now() > deadline) {
          throw new EngineError('AGENT_UNREACHABLE', `agent of ${this.id}: ${(err as Error).message}`);
        }
        await new Promise((r) => setTimeout(r, 2));
      }
    }
  }

  /** Holds new callers back until the returned release is called (or a pause takes over). */
  hold(): () => void {
    if (!this.held) {
      let open!: () => void;
      const gate = new Promise<void>((r) => (open = r));
      this.held = { gate, open, count: 0 };
    }
    const h = this.held;
    h.count++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      if (--h.count === 0 && this.held === h) {
        this.held = undefined;
        h.open();
      }
    };
  }

  /** The connection, once no pause is under way. */
  async agent(): Promise<AgentClient> {
    while (this.gate || this.held) await (this.gate ?? this.held!.gate);
    if (!this.client?.isOpen) await this.connect();
    return this.client!;
  }

  /**
   * Runs an idempotent request (files, listings) on the agent. One that meets a connection
   * closed by a pause is sent again on the next connection, after the pause.
   */
  async call<T>(request: (agent: AgentClient) => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await request(await this.agent());
      } catch (err) {
        if (!(err instanceof AgentClosedError) || attempt >= 3) throw err;
      }
    }
  }

  /** A connection of its own, for readers that must not share the main one's subscriptions.
   * Closed by the next pause like the main one. */
  async sideAgent(): Promise<AgentClient> {
    while (this.gate || this.held) await (this.gate ?? this.held!.gate);
    this.checkSocketPath();
    const c = await AgentClient.connect(this.socketPath);
    this.sideClients.add(c);
    return c;
  }

  releaseSide(c: AgentClient): void {
    this.sideClients.delete(c);
    void c.close();
  }

  get paused(): boolean {
    return this.gate !== undefined;
  }

  /** Runs `work` with every connection to the agent closed (CRIU cannot dump them) and new
   * callers held at the gate. `work` returns the new PID 1 and start time, or undefined when the
   * sandbox is gone for good. Tracked processes are re-attached afterwards. */
  async pause<T>(
    work: () => Promise<{ pid: number; startTime: string; result: T } | undefined>,
    release?: () => void,
  ): Promise<T | undefined> {
    while (this.gate) await this.gate;
    let open!: () => void;
    this.gate = new Promise((r) => (open = r));
    release?.(); // the gate holds callers from here on
    try {
      await Promise.allSettled([...this.inflight]);
      await this.client?.close();
      this.client = undefined;
      await Promise.all([...this.sideClients].map((c) => c.close()));
      this.sideClients.clear();
      const out = await work();
      if (!out) {
        this.loseAll(new AgentError(0, 'the sandbox stopped'));
        return undefined;
      }
      this.pid = out.pid;
      this.startTime = out.startTime;
      await this.connect();
      for (const [id, t] of this.tracked) if (t.spawned) this.client!.attach(id, t.offsets[0], t.offsets[1], t.listener);
      return out.result;
    } finally {
      this.gate = undefined;
      open();
    }
  }

  /** Every waiter fails: the sandbox was stopped or deleted. */
  loseAll(err: AgentError): void {
    for (const t of [...this.tracked.values()]) t.listener.onLost(err);
    this.tracked.clear();
  }

  async close(): Promise<void> {
    await this.client?.close();
    await Promise.all([...this.sideClients].map((c) => c.close()));
    this.client = undefined;
  }

  /** Registers a process to follow across reconnects. Output replayed below the offsets
   * already seen is dropped, so a re-attach after a pause delivers each byte once. */
  private register(id: number, offsets: [number, number], spawned: boolean, listener: ProcessListener): Tracked {
    const t: Tracked = {
      offsets: [...offsets],
      spawned,
      listener: {
        onOutput: (stream, offset, data) => {
          const seen = t.offsets[stream - 1]!;
          if (offset + data.length <= seen) return;
          const fresh = offset < seen ? data.subarray(seen - offset) : data;
          t.offsets[stream - 1] = offset + data.length;
          listener.onOutput(stream, offset, fresh);
        },
        onExit: (code, sig) => {
          this.tracked.delete(id);
          listener.onExit(code, sig);
        },
        onLost: (err) => {
          this.tracked.delete(id);
          listener.onLost(err);
        },
      },
    };
    this.tracked.set(id, t);
    return t;
  }

  /** Starts a process and follows it until it exits or is lost. */
  async start(id: number, req: SpawnRequest, listener: ProcessListener): Promise<number> {
    const t = this.register(id, [0, 0], false, listener);
    try {
      const pid = await this.track((await this.agent()).spawn(id, req, t.listener));
      t.spawned = true;
      return pid;
    } catch (err) {
      this.tracked.delete(id);
      if (err instanceof AgentError) throw new EngineError('SPAWN_FAILED', err.message);
      throw err;
    }
  }

  /** Follows a process that is already running (after a restart or a restore), from the
   * given offsets on. */
  async follow(id: number, offsets: [number, number], listener: ProcessListener): Promise<void> {
    const t = this.register(id, offsets, true, listener);
    (await this.agent()).attach(id, offsets[0], offsets[1], t.listener);
  }

  untrack(id: number): void {
    this.tracked.delete(id);
  }

  async list(): Promise<AgentProcessInfo[]> {
    return this.call((a) => a.list());
  }

  private track<T>(p: Promise<T>): Promise<T> {
    this.inflight.add(p);
    const done = () => this.inflight.delete(p);
    p.then(done, done);
    return p;
  }
}
