import { untilDeadline } from '../lib/deadline.js';
import { closeSync } from 'node:fs';
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { AgentClient, AgentClosedError, AgentError, AgentProtocolError, AgentTimeoutError, type ProcessListener } from './agent/client.js';
import type { AgentProcessInfo } from './agent/frames.js';
import type { SpawnRequest } from './agent/protocol.js';
import { openAgentSocket, viaDescriptor } from './agent/socket.js';
import { EngineError } from '../seam/errors.js';
import type { SandboxHandle, SubscribeOptions, Subscription } from '../seam/sandbox.js';
import { isAliveSync } from './launcher.js';

/** One follower of a process: it gets each byte once, from its own offsets on. */
interface Subscriber {
  listener: ProcessListener;
  offsets: [number, number];
  /** Carried over a rollback when the restored tree has the process (an attached terminal or
   * exec session); otherwise the rollback loses it (a command waited on for its result). */
  survivesRollback: boolean;
  /** Joined a process already followed and has not had its replay yet: an exit that comes
   * first (already on its way) must not end it before its replay. */
  replaying: boolean;
  /** Output that came while replaying, held until the replay is in: the others' live frames
   * sent before the agent took this attach run ahead of its replay, and delivered first they
   * would make the replay's earlier bytes look seen (a command's first line lost). */
  held?: { stream: 1 | 2; offset: number; data: Buffer }[];
}

type OutputStream = 1 | 2;

/** Hands a follower the part of a frame it has not seen, and moves its offsets on. */
function deliver(x: Subscriber, stream: OutputStream, offset: number, data: Buffer): void {
  const seen = x.offsets[stream - 1]!;
  if (offset + data.length <= seen) return;
  const fresh = offset < seen ? data.subarray(seen - offset) : data;
  x.offsets[stream - 1] = offset + data.length;
  x.listener.onOutput(stream, offset < seen ? seen : offset, fresh);
}

/** What a replaying follower held, in each stream's offset order (the streams' interleaving as
 * it came), delivered once its replay is in. */
function release(x: Subscriber): void {
  const held = x.held ?? [];
  x.held = undefined;
  const sorted = new Map<OutputStream, typeof held>();
  for (const h of held) {
    const frames = sorted.get(h.stream) ?? [];
    frames.push(h);
    sorted.set(h.stream, frames);
  }
  for (const frames of sorted.values()) frames.sort((a, b) => a.offset - b.offset);
  for (const h of held) {
    const next = sorted.get(h.stream)!.shift()!;
    deliver(x, next.stream, next.offset, next.data);
  }
}

/** A process the engine follows, for one or more subscribers: re-attached after a pause or a
 * dropped connection from the lowest offset any of them has seen, so nothing is lost. */
interface Tracked {
  subs: Set<Subscriber>;
  /** False until the agent confirmed the spawn: a spawn waiting at the gate is not re-attached. */
  spawned: boolean;
  fan: ProcessListener;
}

export type { Subscription, SubscribeOptions } from '../seam/sandbox.js';

/** How long a checkpoint may hold callers back before its pause starts (its job may be queued
 * behind other instances' jobs); after that they go on, and the checkpoint is of a later moment. */
const HOLD_MAX_MS = 60_000;
/** The whole pause, dump to reconnect; every step inside has a deadline of its own. */
export const PAUSE_DEADLINE_MS = 15 * 60_000;
const CONNECT_TIMEOUT_MS = 3000;

/** The live side of one running sandbox: its PID 1 and the connection to its agent. During a
 * pause (checkpoint, rollback) the connection is closed, callers wait at the gate, and running
 * commands go on inside the sandbox to be picked up again after the restore. */
export class Sandbox implements SandboxHandle {
  private client: AgentClient | undefined;
  private connecting: Promise<AgentClient> | undefined;
  private gate: Promise<void> | undefined;
  /** Held between a checkpoint request and its pause: calls that come after the request wait,
   * so that the checkpoint is of the state as it was when asked for. */
  private held: { gate: Promise<void>; open: () => void; count: number; timer: NodeJS.Timeout } | undefined;
  private readonly tracked = new Map<number, Tracked>();
  private readonly sideClients = new Set<AgentClient>();
  /** Side connections let go of and not yet closed by the agent too: a pause waits for them. */
  private readonly closingSides = new Set<Promise<void>>();
  /** Side connections being made (sideAgent). */
  private readonly opening = new Set<Promise<AgentClient>>();
  /** Requests sent and not yet answered: a pause lets them finish before it closes the socket. */
  private readonly inflight = new Set<Promise<unknown>>();
  /** Set when the agent broke the protocol, or the sandbox's memory was lost: calls fail at once
   * until the next PID 1. */
  private broken: EngineError | undefined;
  private stopped = false;

  constructor(
    readonly id: string,
    public pid: number,
    public startTime: string,
    private readonly log?: Logger,
  ) {}

  /** A new connection to the agent, through a path the sandbox cannot redirect; or `made`, one
   * made to it already (connectToAgent), if it is still open. */
  private async open(events: { onClose?(expected: boolean): void } = {}, made?: Socket): Promise<AgentClient> {
    const client = { ...events, onFailure: (err: Error) => this.onFailure(err) };
    if (made && !made.destroyed && made.readable && made.writable) return AgentClient.over(made, client);
    made?.destroy();
    return AgentClient.over(await connectToAgent(this.pid, this.startTime), client);
  }

  /** Whether a pause (a checkpoint, a rollback) or a stop is under way or done: its PID 1 may be
   * gone for a reason of the engine's own. */
  get busyOrStopped(): boolean {
    return this.gate !== undefined || this.stopped;
  }

  /** Why the engine killed the sandbox's processes itself (`lose`), if it did. */
  get lostBecause(): string | undefined {
    return this.broken?.code === 'MEMORY_LOST' ? this.broken.message : undefined;
  }

  /** The sandbox's processes were killed for `why` (its memory could not all be restored): every
   * call fails with it from now on, and what waits on a process is told. */
  lose(why: EngineError): void {
    this.broken ??= why;
    this.loseAll(new AgentError(0, why.message));
  }

  private onFailure(err: Error): void {
    if (err instanceof AgentProtocolError) {
      this.broken = new EngineError('AGENT_BROKEN', `the agent of ${this.id} broke the protocol (${err.message}); roll the instance back or stop and start it`, undefined, { cause: err });
      this.log?.warn({ instance: this.id, err }, 'agent broke the protocol; its connection was closed');
      this.loseAll(new AgentError(0, this.broken.message));
    } else if (!(err instanceof AgentTimeoutError)) {
      this.log?.error({ instance: this.id, err }, 'unexpected error on an agent connection; it was closed');
    }
  }

  /** Connects the main connection (retrying while the agent starts) and re-attaches every
   * process followed, from the offsets already seen. */
  async connect(timeoutMs = CONNECT_TIMEOUT_MS, made?: Socket): Promise<AgentClient> {
    if (this.broken) {
      made?.destroy();
      throw this.broken;
    }
    if (this.connecting) made?.destroy();
    else this.connecting = this.connectNow(timeoutMs, made).finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async connectNow(timeoutMs: number, made?: Socket): Promise<AgentClient> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      // Offered once: open() takes it or destroys it.
      const offered = made;
      made = undefined;
      try {
        const client = await this.open({ onClose: (expected) => this.onMainClosed(client, expected) }, offered);
        this.client = client;
        for (const [id, t] of this.tracked) {
          if (!t.spawned) continue;
          const [out, err] = lowest(t);
          client.attach(id, out, err, t.fan);
        }
        return client;
      } catch (err) {
        if (this.broken) throw this.broken;
        // A PID 1 that is gone will not start listening: said at once, not at the deadline.
        if (Date.now() > deadline || !isAliveSync(this.pid, this.startTime)) {
          throw new EngineError('AGENT_UNREACHABLE', `agent of ${this.id}: ${(err as Error).message}`, undefined, { cause: err });
        }
        await new Promise((r) => setTimeout(r, 2));
      }
    }
  }

  /** The main connection went away without a pause asking for it (the agent closed it, or it
   * was given up on a timeout): reconnect and pick the followed processes up again, or, if the
   * agent cannot be reached, tell their waiters. */
  private onMainClosed(client: AgentClient, expected: boolean): void {
    if (this.client !== client) return;
    this.client = undefined;
    if (expected || this.gate || this.stopped || this.tracked.size === 0) return;
    this.connect().catch((err: Error) => {
      this.log?.warn({ instance: this.id, err }, 'agent connection lost; the processes followed are given up');
      this.loseAll(new AgentError(0, err.message));
    });
  }

  /** Holds new callers back until the returned release is called (or a pause takes over). */
  hold(): () => void {
    if (!this.held) {
      let open!: () => void;
      const gate = new Promise<void>((r) => (open = r));
      const timer = setTimeout(() => {
        this.log?.warn({ instance: this.id }, 'a checkpoint held calls back too long; they go on');
        if (this.held?.gate === gate) this.held = undefined;
        open();
      }, HOLD_MAX_MS);
      timer.unref();
      this.held = { gate, open, count: 0, timer };
    }
    const h = this.held;
    h.count++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      if (--h.count === 0 && this.held === h) {
        this.held = undefined;
        clearTimeout(h.timer);
        h.open();
      }
    };
  }

  /** The connection, once no pause is under way. */
  async agent(): Promise<AgentClient> {
    while (this.gate || this.held) await (this.gate ?? this.held!.gate);
    if (this.broken) throw this.broken;
    if (this.stopped) throw new EngineError('NOT_RUNNING', `sandbox ${this.id} stopped`);
    if (!this.client?.isOpen) return this.connect();
    return this.client;
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
    for (;;) {
      while (this.gate || this.held) await (this.gate ?? this.held!.gate);
      if (this.broken) throw this.broken;
      // Known to a pause from the moment it is asked for: one that begins while this connects
      // waits for it and closes it too (a connection left open is to a socket outside the
      // sandbox, which fails the dump: "Unix socket ... not found").
      const opened = this.open().then((c) => {
        this.sideClients.add(c);
        return c;
      });
      this.opening.add(opened);
      let c: AgentClient;
      try {
        c = await opened;
      } catch (err) {
        if (err instanceof EngineError) throw err;
        throw new EngineError('AGENT_UNREACHABLE', `agent of ${this.id}: ${(err as Error).message}`, undefined, { cause: err });
      } finally {
        this.opening.delete(opened);
      }
      // A pause that began while it connected closes it: another once the pause is over. (One
      // the agent closed by itself is handed on: its first call says so.)
      if (!this.gate) return c;
    }
  }

  releaseSide(c: AgentClient): void {
    this.sideClients.delete(c);
    // A dump right after must not find the agent's end still open to a peer that is gone
    // ("Unix socket N not found"): the next pause waits for the close (bounded by close's grace).
    const closing: Promise<void> = c.close().finally(() => this.closingSides.delete(closing));
    this.closingSides.add(closing);
  }

  get paused(): boolean {
    return this.gate !== undefined;
  }

  /** Runs `work` with every connection to the agent closed (CRIU cannot dump them) and new
   * callers held at the gate. `work` returns the new PID 1 and start time, or undefined when the
   * sandbox is gone for good. Followed processes are re-attached afterwards. */
  async pause<T>(
    work: () => Promise<{ pid: number; startTime: string; result: T; agent?: Socket } | undefined>,
    release?: () => void,
    opts: { rollback?: boolean; dump?: boolean } = {},
  ): Promise<T | undefined> {
    while (this.gate) await this.gate;
    let open!: () => void;
    this.gate = new Promise((r) => (open = r));
    release?.(); // the gate holds callers from here on
    try {
      await Promise.allSettled([...this.inflight]);
      await this.connecting?.catch(() => {}); // a reconnect under way lands before it is closed
      // An agent that does not answer is dumped all the same: CRIU's own check then says why.
      if (opts.dump) await this.client?.ping({ dumpFollows: true }).catch(() => {});
      // A rollback kills this agent: its connections are dropped, not closed with it (waiting
      // for its side of the close: 0.29 ms p50 of a warm rollback's pause; dropped, 0.16).
      const graceMs = opts.rollback ? 0 : undefined;
      await this.client?.close(graceMs);
      this.client = undefined;
      await Promise.allSettled([...this.opening]);
      await Promise.all([...this.sideClients].map((c) => c.close(graceMs)));
      this.sideClients.clear();
      await Promise.allSettled([...this.closingSides]);
      let out: { pid: number; startTime: string; result: T; agent?: Socket } | undefined;
      try {
        out = await withDeadline(work(), PAUSE_DEADLINE_MS, `the pause of ${this.id}`);
      } catch (err) {
        this.loseAll(new AgentError(0, `the sandbox did not come back: ${(err as Error).message}`));
        throw err;
      }
      if (!out) {
        this.loseAll(new AgentError(0, 'the sandbox stopped'));
        return undefined;
      }
      if (out.pid !== this.pid) this.broken = undefined; // a new PID 1 gets a new chance
      this.pid = out.pid;
      this.startTime = out.startTime;
      // `agent`: a connection the work made to the new PID 1's agent already (a warm standby's).
      if (opts.rollback) await this.rebase(out.agent);
      else await this.connect(undefined, out.agent);
      return out.result;
    } finally {
      this.gate = undefined;
      open();
    }
  }

  /** Every waiter fails: the sandbox was stopped or deleted, or its agent broke. */
  loseAll(err: AgentError): void {
    for (const t of [...this.tracked.values()]) t.fan.onLost(err);
    this.tracked.clear();
  }

  /**
   * After a rollback the processes are those of the checkpoint. A follower that survives
   * rollbacks goes on with the restored process of the same id, from its output as restored
   * (no replay of what it already had); the others, and followers of a process the checkpoint
   * does not have, are told it is lost.
   */
  private async rebase(made?: Socket): Promise<void> {
    const lost = new AgentError(0, 'the instance was rolled back');
    const followed = [...this.tracked];
    this.tracked.clear();
    const client = await this.connect(undefined, made);
    const procs = followed.length ? await client.list() : [];
    for (const [id, t] of followed) {
      const now = procs.find((p) => p.id === id);
      for (const sub of t.subs) {
        if (!now || !sub.survivesRollback) {
          sub.listener.onLost(lost);
          continue;
        }
        sub.offsets = [now.stdoutBytes, now.stderrBytes];
        this.add(id, sub, true);
      }
      const kept = this.tracked.get(id);
      if (kept) client.attach(id, now!.stdoutBytes, now!.stderrBytes, kept.fan);
    }
  }

  async close(): Promise<void> {
    this.stopped = true;
    const c = this.client;
    this.client = undefined;
    await c?.close();
    await Promise.allSettled([...this.opening]);
    await Promise.all([...this.sideClients].map((s) => s.close()));
    this.sideClients.clear();
  }

  /** Adds a follower of process `id`, making the fan-out for it on first use. */
  private add(id: number, sub: Subscriber, spawned: boolean): Tracked {
    let t = this.tracked.get(id);
    if (!t) {
      const subs = new Set<Subscriber>();
      const end = (each: (l: ProcessListener) => void) => {
        if (this.tracked.get(id) === t) this.tracked.delete(id);
        for (const x of [...subs]) each(x.listener);
        subs.clear();
      };
      t = {
        subs,
        spawned,
        fan: {
          onOutput: (stream, offset, data) => {
            for (const x of [...subs]) {
              if (x.replaying) (x.held ??= []).push({ stream, offset, data });
              else deliver(x, stream, offset, data);
            }
          },
          onExit: (code, sig) => {
            const waiting = [...subs].filter((x) => x.replaying);
            for (const x of waiting) subs.delete(x);
            end((l) => l.onExit(code, sig));
            // Their replay (and the exit after it) is still on its way: they go on following.
            for (const x of waiting) this.add(id, x, true);
            const again = this.tracked.get(id);
            if (again && this.client?.isOpen) this.client.attach(id, ...lowest(again), again.fan);
          },
          onLost: (err) => end((l) => l.onLost(err)),
        },
      };
      this.tracked.set(id, t);
    }
    t.subs.add(sub);
    return t;
  }

  private remove(id: number, sub: Subscriber): void {
    const t = this.tracked.get(id);
    if (!t || !t.subs.delete(sub) || t.subs.size) return;
    this.tracked.delete(id);
    if (this.client?.isOpen) this.client.detach(id);
  }

  /** Starts a process and follows it until it exits or is lost. */
  async start(id: number, req: SpawnRequest, listener: ProcessListener, opts: { survivesRollback?: boolean } = {}): Promise<number> {
    const sub: Subscriber = { listener, offsets: [0, 0], survivesRollback: opts.survivesRollback ?? false, replaying: false };
    const t = this.add(id, sub, false);
    try {
      const pid = await this.track((await this.agent()).spawn(id, req, t.fan));
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
    await this.subscribe(id, offsets, listener);
  }

  /**
   * Follows a process from `offsets` on, alongside any other followers: the agent replays its
   * scrollback from there, then output is live. Each follower sees every byte once.
   */
  async subscribe(id: number, offsets: [number, number], listener: ProcessListener, opts: SubscribeOptions = {}): Promise<Subscription> {
    const agent = await this.agent();
    const sub: Subscriber = { listener, offsets: [...offsets], survivesRollback: opts.survivesRollback ?? false, replaying: this.tracked.has(id) };
    const t = this.add(id, sub, true);
    agent.attach(id, offsets[0], offsets[1], t.fan);
    // Frames come in order: once the ping is answered, the replay is in, and the follower is
    // told so before any live output that comes after it.
    agent.barrier(() => {
      sub.replaying = false;
      release(sub);
      opts.onReplayed?.();
    });
    return { close: () => this.remove(id, sub) };
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

/** Rejects with a TIMEOUT engine error if `p` has not settled within `ms`. */
export function withDeadline<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  return untilDeadline(p, ms, () => {
    throw new EngineError('TIMEOUT', `${what} did not finish within ${Math.round(ms / 1000)} s`);
  });
}

/** The lowest offsets any follower has seen: where a re-attach replays from. */
function lowest(t: Tracked): [number, number] {
  let out = Infinity;
  let err = Infinity;
  for (const x of t.subs) {
    out = Math.min(out, x.offsets[0]);
    err = Math.min(err, x.offsets[1]);
  }
  return [out === Infinity ? 0 : out, err === Infinity ? 0 : err];
}

/** A connection to the agent of the sandbox whose PID 1 is `pid`, through a path the sandbox
 * cannot redirect (agent/socket.ts), with no client on it yet: Sandbox.open takes it, or a
 * warm standby holds it until it is swapped in (its agent had it accepted before it froze). */
export async function connectToAgent(pid: number, startTime: string): Promise<Socket> {
  const fd = openAgentSocket(pid, () => isAliveSync(pid, startTime));
  try {
    return await AgentClient.connectSocket(viaDescriptor(fd));
  } finally {
    closeSync(fd);
  }
}
