import type { Logger } from 'pino';
import { newProcessId, type ProcessListener } from '../seam/agent.js';
import type { AgentProcessInfo } from '../seam/agent.js';
import { Output } from '../lib/output.js';
import { untilAborted } from '../lib/deadline.js';
import { readOutput, type OutputChunk } from './process/scrollback.js';
import type { SandboxHandle } from '../seam/sandbox.js';
import type { Store } from '../store/index.js';
import type { ExecutionKind, ExecutionRecord } from '../store/executions.js';
import type { InstanceRecord, Page } from '../store/instances.js';
import type { SandboxAccess } from './access.js';
import { engineFailure } from './engine-failure.js';
import { InvalidRequestError, NotFoundError } from './errors.js';
import type { EventBus } from './events.js';
import type { InstanceService } from './instances.js';
import { processUser, type SandboxUser } from './users.js';

export interface StartExecution {
  kind: ExecutionKind;
  argv: string[];
  env?: Record<string, string> | undefined;
  cwd?: string | undefined;
  /** A terminal of this size (kind `pty`). */
  pty?: { rows: number; cols: number } | undefined;
  /** Runs as this user of the sandbox (a name or a uid): its ids, its login variables, and its
   * home as the directory it starts in unless `cwd` or `startIn` says; root when absent. */
  user?: string | SandboxUser | undefined;
  /** Where it starts without a `cwd`: the user's home (E2B's and OpenComputer's way, the
   * default), or the image's working directory whoever runs it (Docker's `exec --user`). */
  startIn?: 'home' | 'workdir' | undefined;
  /** Written to stdin, which is then closed (unless `keepStdinOpen`). */
  stdin?: Buffer | undefined;
  /** Stdin stays open for attached clients to write to (sessions, shells, terminals). */
  keepStdinOpen?: boolean | undefined;
  /** The command's whole process group is killed after this long. */
  timeoutMs?: number | undefined;
  /** Nobody follows it (a background process): its output waits in the sandbox's bounded
   * scrollback and never for the server, its end is learned when someone asks, and no
   * `exec.ended` event is sent. Takes no timeout, collection or output callback. */
  detached?: boolean | undefined;
  /** Killed once no client has been attached for this long. */
  maxRunAfterDisconnectMs?: number | undefined;
  /** Keeps the whole output (up to this many bytes per stream) for `result`, instead of
   * what the sandbox's scrollback still holds. */
  collectBytes?: number | undefined;
  /** Everything the command prints, as it comes, from its first byte on (an attach made after
   * the start may find the scrollback's beginning gone already). */
  onOutput?: ((stream: 1 | 2, data: Uint8Array) => void) | undefined;
}

/** An execution as callers see it: the record, with the agent's word on its state. */
export interface ExecutionState {
  record: ExecutionRecord;
  running: boolean;
  pid: number | null;
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  durationMs: number | null;
  stdoutBytes: number;
  stderrBytes: number;
  /** Clients attached right now. */
  attached: number;
}

export interface ExecutionOutput {
  state: ExecutionState;
  stdout: Buffer;
  stderr: Buffer;
  /** Output that fell out of the sandbox's scrollback (256 KiB per stream) or past the
   * collected maximum before it could be read. */
  truncated: boolean;
}

export interface ExecListener {
  output(stream: 1 | 2, offset: number, data: Buffer): void;
  /** The scrollback asked for has been delivered; output is live from here. */
  replayed(): void;
  exit(exitCode: number, signal: number | null): void;
  /** The stream ended without an exit: the instance was rolled back past the command, stopped,
   * hibernated or deleted. */
  lost(reason: string): void;
}

export interface Attachment {
  record: ExecutionRecord;
  write(data: Buffer): void;
  closeStdin(): void;
  resize(rows: number, cols: number): void;
  /** Lets go (the command runs on). */
  detach(): void;
}

/** What the service follows of an execution it started, while the server runs. */
interface Watch {
  instanceId: string;
  record: ExecutionRecord;
  timedOut: boolean;
  timers: NodeJS.Timeout[];
  orphanTimer: NodeJS.Timeout | undefined;
  maxRunAfterDisconnectMs: number | undefined;
  collected: { stdout: Output; stderr: Output } | undefined;
  onOutput: ((stream: 1 | 2, data: Uint8Array) => void) | undefined;
  ended: boolean;
  expiry: NodeJS.Timeout | undefined;
  /** exec.started was emitted; an exit seen before (a quick command) waits for it. */
  announced: boolean;
  endEvent: (() => void) | undefined;
}

const SIGKILL = 9;
const UNFOLLOWED: ProcessListener = { onOutput: () => {}, onExit: () => {}, onLost: () => {} };
/** Records kept per instance (running ones are always kept). */
export const MAX_EXECUTION_RECORDS = 1000;
/** How long a finished execution's collected output is kept for `result`. */
const RESULT_KEPT_MS = 10 * 60_000;
const EXEC_ID = /^exec_[0-9a-f]{8}$/;

export const execIdOf = (processId: number): string => `exec_${processId.toString(16).padStart(8, '0')}`;

/**
 * Commands that are streamed, attached to and waited for: exec sessions, streamed execs, async
 * runs and terminals. Each is a process of the sandbox's agent, which keeps its scrollback and
 * carries it through checkpoints, rollbacks, forks and hibernation; the service keeps a record
 * of it, follows its end for events and timeouts, and lets any number of clients attach.
 */
export class ExecutionService {
  private readonly watches = new Map<string, Watch>();
  private readonly attached = new Map<string, number>();

  constructor(
    private readonly store: Store,
    private readonly instances: InstanceService,
    private readonly access: SandboxAccess,
    private readonly spillDir: string,
    private readonly events: EventBus,
    private readonly log: Logger,
  ) {}

  async start(owner: string, id: string, input: StartExecution): Promise<ExecutionState & { pid: number }> {
    if (input.argv.length === 0 || !input.argv[0]) throw new InvalidRequestError('the command is empty');
    if (input.pty) checkTerminalSize(input.pty.rows, input.pty.cols);
    if (input.detached && (input.timeoutMs !== undefined || input.collectBytes !== undefined || input.onOutput || input.maxRunAfterDisconnectMs !== undefined)) {
      throw new InvalidRequestError('a detached execution is followed by nobody: it takes no timeout and keeps no output but its scrollback');
    }
    return this.access.use(owner, id, async (sb, rec) => {
      const user = await processUser(sb, input.user ?? rec.defaultUser ?? undefined);
      const processId = newProcessId();
      const record: ExecutionRecord = {
        instanceId: id,
        id: execIdOf(processId),
        processId,
        kind: input.kind,
        argv: input.argv,
        cwd: input.cwd ?? (input.startIn === 'workdir' ? undefined : user.home) ?? (input.kind === 'pty' ? '/root' : rec.workdir ?? '/'),
        startedAt: new Date().toISOString(),
        endedAt: null,
        exitCode: null,
        signal: null,
        timedOut: false,
      };
      const watch: Watch = {
        instanceId: id,
        record,
        timedOut: false,
        timers: [],
        orphanTimer: undefined,
        maxRunAfterDisconnectMs: input.maxRunAfterDisconnectMs,
        collected: input.collectBytes ? { stdout: new Output(input.collectBytes, this.spillDir), stderr: new Output(input.collectBytes, this.spillDir) } : undefined,
        onOutput: input.onOutput,
        ended: false,
        expiry: undefined,
        announced: false,
        endEvent: undefined,
      };
      await this.store.executions.insert(record);
      await this.store.executions.prune(id, MAX_EXECUTION_RECORDS);
      if (!input.detached) this.watches.set(key(id, record.id), watch);
      let pid: number;
      try {
        pid = await sb.start(
          processId,
          { argv: input.argv, env: this.instances.envOf(rec, input.env, user.env), cwd: record.cwd, pty: input.pty && { ...input.pty, echo: true }, user: user.ids },
          input.detached ? UNFOLLOWED : this.watcher(watch),
          { survivesRollback: !input.detached },
        );
      } catch (err) {
        this.watches.delete(key(id, record.id));
        await this.store.executions.remove(id, record.id);
        this.dispose(watch);
        throw err;
      }
      const agent = await sb.agent();
      if (input.detached) {
        // The agent keeps the output; the server takes none of it until asked.
        sb.untrack(processId);
        agent.detach(processId);
      }
      if (input.stdin?.length) agent.stdin(processId, input.stdin);
      if (!input.keepStdinOpen && !input.pty) agent.closeStdin(processId);
      if (input.timeoutMs && !watch.ended) {
        watch.timers.push(setTimeout(() => {
          watch.timedOut = true;
          void this.kill(sb, processId);
        }, input.timeoutMs));
      }
      this.armOrphanTimer(watch, sb);
      this.events.emit(id, 'exec.started', { exec_id: record.id, kind: record.kind, argv: record.argv, pid });
      watch.announced = true;
      watch.endEvent?.();
      return { ...this.view(record, { pid, running: true }), pid };
    });
  }

  /** The listener the service itself keeps on an execution it started: the end recorded and
   * announced, the output collected when asked for. It survives rollbacks to a checkpoint that
   * has the process. */
  private watcher(w: Watch): ProcessListener {
    return {
      onOutput: (stream, _offset, data) => {
        if (w.collected) (stream === 1 ? w.collected.stdout : w.collected.stderr).push(data);
        w.onOutput?.(stream === 1 ? 1 : 2, data);
      },
      onExit: (code, signal) => {
        const end = { exitCode: signal ? 128 + signal : code, signal: signal || null, timedOut: w.timedOut, endedAt: new Date().toISOString() };
        this.recordEnd(w.instanceId, w.record.id, end);
        w.record = { ...w.record, ...end };
        w.endEvent = () =>
          this.events.emit(w.instanceId, 'exec.ended', {
            exec_id: w.record.id,
            exit_code: end.exitCode,
            signal: end.signal,
            timed_out: end.timedOut,
            duration_ms: Date.parse(end.endedAt) - Date.parse(w.record.startedAt),
          });
        if (w.announced) w.endEvent();
        this.ended(w);
      },
      onLost: () => this.ended(w),
    };
  }

  /** Stops the timers of an execution that ended (or that the server lost sight of); its
   * collected output stays a while for `result`. */
  private ended(w: Watch): void {
    w.ended = true;
    for (const t of w.timers) clearTimeout(t);
    clearTimeout(w.orphanTimer);
    if (!w.collected) {
      this.watches.delete(key(w.instanceId, w.record.id));
      return;
    }
    w.expiry = setTimeout(() => {
      if (this.watches.get(key(w.instanceId, w.record.id)) === w) this.watches.delete(key(w.instanceId, w.record.id));
      this.dispose(w);
    }, RESULT_KEPT_MS);
    w.expiry.unref();
  }

  private dispose(w: Watch): void {
    w.collected?.stdout.dispose();
    w.collected?.stderr.dispose();
  }

  private armOrphanTimer(w: Watch, sb: SandboxHandle): void {
    clearTimeout(w.orphanTimer);
    w.orphanTimer = undefined;
    if (w.ended || w.maxRunAfterDisconnectMs === undefined || (this.attached.get(key(w.instanceId, w.record.id)) ?? 0) > 0) return;
    w.orphanTimer = setTimeout(() => void this.kill(sb, w.record.processId), w.maxRunAfterDisconnectMs);
  }

  /** Kills a process from a timer: one gone already (its sandbox too) needs nothing more. */
  private async kill(sb: SandboxHandle, processId: number): Promise<void> {
    await sb.agent().then((a) => a.signal(processId, SIGKILL)).catch(() => {});
  }

  /** Records an end seen in a callback that cannot wait for the store: the end is known in
   * memory meanwhile, and the agent's word wins over the record anyway. */
  private recordEnd(instanceId: string, execId: string, end: { exitCode: number | null; signal: number | null; timedOut: boolean; endedAt: string }): void {
    this.store.executions.finish(instanceId, execId, end).catch((err: unknown) => this.log.warn({ err, instance: instanceId, exec: execId }, 'could not record the end of an execution'));
  }

  /** The record of an execution (404 if the instance or the execution is not there). */
  async find(owner: string, id: string, execId: string): Promise<ExecutionRecord> {
    await this.instances.get(owner, id);
    const r = EXEC_ID.test(execId) ? await this.store.executions.get(id, execId) : undefined;
    if (!r) throw new NotFoundError('execution', execId);
    return r;
  }

  private view(record: ExecutionRecord, live: { pid: number | null; running: boolean; info?: AgentProcessInfo | undefined }): ExecutionState {
    const info = live.info;
    const watch = this.watches.get(key(record.instanceId, record.id));
    let { exitCode, signal, endedAt } = record;
    if (info && !info.running) {
      exitCode = info.signal ? 128 + info.signal : info.exitCode;
      signal = info.signal || null;
      if (!endedAt) {
        // Ended while nobody watched (a fork's, or after a restart): recorded now.
        endedAt = new Date().toISOString();
        this.recordEnd(record.instanceId, record.id, { exitCode, signal, timedOut: record.timedOut, endedAt });
      }
    }
    const running = info ? info.running : live.running;
    return {
      record: { ...record, exitCode, signal, endedAt },
      running,
      pid: info?.pid ?? live.pid,
      exitCode: running ? null : exitCode,
      signal: running ? null : signal,
      timedOut: watch?.timedOut ?? record.timedOut,
      durationMs: !running && endedAt ? Date.parse(endedAt) - Date.parse(record.startedAt) : null,
      stdoutBytes: info?.stdoutBytes ?? 0,
      stderrBytes: info?.stderrBytes ?? 0,
      attached: this.attached.get(key(record.instanceId, record.id)) ?? 0,
    };
  }

  /** The state of records: the agent's word for the processes it knows, if the instance runs;
   * a hibernated instance's commands are suspended in its image, so as they were. */
  private async states(rec: InstanceRecord, records: ExecutionRecord[]): Promise<ExecutionState[]> {
    const sb = this.instances.live(rec.id);
    const procs = sb && rec.status === 'running' ? await sb.list().catch((err: unknown) => Promise.reject(engineFailure(err))) : undefined;
    return records.map((r) => {
      const info = procs?.find((p) => p.id === r.processId);
      return this.view(r, { pid: null, running: !procs && rec.status === 'hibernated' && r.endedAt === null, info });
    });
  }

  async list(owner: string, id: string, limit: number, cursor?: string): Promise<Page<ExecutionState>> {
    const rec = await this.instances.get(owner, id);
    if (cursor && !(await this.store.executions.get(id, cursor))) throw new InvalidRequestError('unknown cursor');
    const page = await this.store.executions.page(id, limit, cursor);
    return { items: await this.states(rec, page.items), nextCursor: page.nextCursor };
  }

  async get(owner: string, id: string, execId: string): Promise<ExecutionState> {
    const record = await this.find(owner, id, execId);
    const [state] = await this.states(await this.instances.get(owner, id), [record]);
    return state!;
  }

  /** The execution with its output: all of it if it was collected (the first time it is asked
   * for after the end), else what the sandbox's scrollback still holds (its last 256 KiB per
   * stream). */
  async output(owner: string, id: string, execId: string): Promise<ExecutionOutput> {
    const record = await this.find(owner, id, execId);
    const watch = this.watches.get(key(id, execId));
    if (watch?.collected && watch.ended) {
      // Handed over once, then let go: a client that asks again gets what the scrollback holds.
      const { stdout, stderr } = watch.collected;
      const out = { state: this.view(watch.record, { pid: null, running: false }), stdout: stdout.toBuffer(), stderr: stderr.toBuffer(), truncated: stdout.truncated || stderr.truncated };
      clearTimeout(watch.expiry);
      this.watches.delete(key(id, execId));
      this.dispose(watch);
      return out;
    }
    return this.access.use(owner, id, async (sb) => {
      const chunk = await readOutput(sb, record.processId, { stdout: 0, stderr: 0 });
      const info = (await sb.list()).find((p) => p.id === record.processId);
      const state = this.view(record, { pid: null, running: false, info });
      if (!chunk) return { state, stdout: Buffer.alloc(0), stderr: Buffer.alloc(0), truncated: state.stdoutBytes + state.stderrBytes > 0 };
      return { state, stdout: chunk.stdout, stderr: chunk.stderr, truncated: chunk.dropped > 0 };
    });
  }

  /** What the execution printed from the given offsets on, as far as the sandbox's scrollback
   * still holds it (what fell out before it was read is counted in `dropped`). */
  async read(owner: string, id: string, execId: string, from: { stdout: number; stderr: number }): Promise<OutputChunk> {
    const record = await this.find(owner, id, execId);
    const chunk = await this.access.use(owner, id, (sb) => readOutput(sb, record.processId, from));
    if (!chunk) throw new NotFoundError('execution', execId);
    return chunk;
  }

  /** Waits for the execution to end, or until `signal` aborts (its deadline, or the client that
   * waited gone); answers its state either way. */
  async wait(owner: string, id: string, execId: string, signal: AbortSignal): Promise<ExecutionState> {
    const record = await this.find(owner, id, execId);
    const state = await this.get(owner, id, execId);
    if (!state.running || signal.aborted) return state;
    await this.access.use(owner, id, async (sb) => {
      let sub: { close(): void } | undefined;
      let over = false;
      const ended = new Promise<void>((resolve) => {
        const done = () => resolve();
        sb.subscribe(record.processId, [state.stdoutBytes, state.stderrBytes], { onOutput: () => {}, onExit: done, onLost: done }).then(
          // A subscription that comes after the wait is over (its signal first) goes at once.
          (s) => (over ? s.close() : (sub = s)),
          done,
        );
      });
      await untilAborted(ended, signal, () => undefined);
      over = true;
      sub?.close();
    });
    return this.get(owner, id, execId);
  }

  /**
   * Attaches a client: the output from `from` on (the scrollback first, then live), the exit,
   * and stdin, resize and detach. While attached the instance counts as in use (no idle
   * hibernation), and a command with a `maxRunAfterDisconnect` is not killed.
   */
  async attach(owner: string, id: string, execId: string, from: [number, number], listener: ExecListener): Promise<Attachment> {
    const record = await this.find(owner, id, execId);
    const k = key(id, execId);
    const release = this.access.lease(id);
    let closed = false;
    let sub: { close(): void } | undefined;
    const finish = () => {
      if (closed) return false;
      closed = true;
      sub?.close();
      release();
      const n = (this.attached.get(k) ?? 1) - 1;
      if (n > 0) this.attached.set(k, n);
      else this.attached.delete(k);
      const w = this.watches.get(k);
      const live = this.instances.live(id);
      if (w && live) this.armOrphanTimer(w, live);
      return true;
    };
    this.attached.set(k, (this.attached.get(k) ?? 0) + 1);
    const w = this.watches.get(k);
    if (w) clearTimeout(w.orphanTimer);
    let sb: SandboxHandle;
    try {
      ({ sb } = await this.access.sandbox(owner, id));
      sub = await sb.subscribe(
        record.processId,
        from,
        {
          onOutput: (stream, offset, data) => !closed && listener.output(stream, offset, data),
          onExit: (code, signal) => finish() && listener.exit(signal ? 128 + signal : code, signal || null),
          onLost: (err) => finish() && listener.lost(err.message),
        },
        { survivesRollback: true, onReplayed: () => !closed && listener.replayed() },
      );
    } catch (err) {
      finish();
      throw engineFailure(err);
    }
    if (closed) sub.close();
    const agent = () => sb.agent();
    const pid = record.processId;
    return {
      record,
      // A client's keystrokes for a sandbox that is gone go nowhere; nothing to tell it.
      write: (data) => void agent().then((a) => a.stdin(pid, data)).catch(() => {}),
      closeStdin: () => void agent().then((a) => a.closeStdin(pid)).catch(() => {}),
      resize: (rows, cols) => void agent().then((a) => a.resize(pid, rows, cols)).catch(() => {}),
      detach: () => void finish(),
    };
  }

  /** Writes to the execution's stdin (or its terminal). */
  async input(owner: string, id: string, execId: string, data: Buffer): Promise<void> {
    const record = await this.find(owner, id, execId);
    await this.access.use(owner, id, async (sb) => (await sb.agent()).stdin(record.processId, data));
  }

  /** Closes the execution's stdin: it reads end of file. */
  async closeInput(owner: string, id: string, execId: string): Promise<void> {
    const record = await this.find(owner, id, execId);
    await this.access.use(owner, id, async (sb) => (await sb.agent()).closeStdin(record.processId));
  }

  /** The execution whose process has this pid inside the sandbox, while it runs. */
  async byPid(owner: string, id: string, pid: number): Promise<ExecutionState> {
    const rec = await this.instances.get(owner, id);
    const found = (await this.states(rec, (await this.store.executions.page(id, MAX_EXECUTION_RECORDS)).items)).find((s) => s.pid === pid);
    if (!found) throw new NotFoundError('process', String(pid));
    return found;
  }

  async signal(owner: string, id: string, execId: string, signo: number): Promise<void> {
    const record = await this.find(owner, id, execId);
    await this.access.use(owner, id, async (sb) => (await sb.agent()).signal(record.processId, signo));
  }

  async resize(owner: string, id: string, execId: string, rows: number, cols: number): Promise<void> {
    const record = await this.find(owner, id, execId);
    if (record.kind !== 'pty') throw new InvalidRequestError(`${execId} is not a terminal`);
    checkTerminalSize(rows, cols);
    await this.access.use(owner, id, async (sb) => (await sb.agent()).resize(record.processId, rows, cols));
  }

  /** Kills the execution (its whole process group) if it runs, and forgets it. */
  async remove(owner: string, id: string, execId: string): Promise<void> {
    const record = await this.find(owner, id, execId);
    if (this.instances.live(id)) {
      await this.access.use(owner, id, async (sb) => {
        const agent = await sb.agent();
        agent.signal(record.processId, SIGKILL);
        agent.forget(record.processId);
      });
    }
    const w = this.watches.get(key(id, execId));
    if (w) {
      this.ended(w);
      clearTimeout(w.expiry);
      this.watches.delete(key(id, execId));
      this.dispose(w);
    }
    await this.store.executions.remove(id, execId);
  }

  /** A fork runs the processes of its checkpoint: it gets their records. */
  async adoptInFork(sourceId: string, forkId: string): Promise<void> {
    const sb = this.instances.live(forkId);
    if (!sb) return;
    const procs = await sb.list();
    await this.store.executions.copy(sourceId, forkId, procs.map((p) => p.id));
  }

  /** Lets go of what is kept of a deleted instance's executions (of all, without an id: the
   * server is closing; the commands run on in their sandboxes). */
  forget(instanceId?: string): void {
    for (const [k, w] of this.watches) {
      if (instanceId !== undefined && w.instanceId !== instanceId) continue;
      for (const t of w.timers) clearTimeout(t);
      clearTimeout(w.orphanTimer);
      clearTimeout(w.expiry);
      this.dispose(w);
      this.watches.delete(k);
    }
  }
}

const key = (instanceId: string, execId: string) => `${instanceId}/${execId}`;

/** Every face checks a terminal's size its own way (E2B's protobuf not at all): the agent's
 * frame has 16 bits for each, and a terminal of more than this is a mistake. */
const MAX_TERMINAL_SIDE = 1000;
function checkTerminalSize(rows: number, cols: number): void {
  const ok = (n: number) => Number.isInteger(n) && n >= 1 && n <= MAX_TERMINAL_SIDE;
  if (!ok(rows) || !ok(cols)) throw new InvalidRequestError(`a terminal is 1 to ${MAX_TERMINAL_SIDE} rows and columns, not ${rows}x${cols}`, { rows, cols });
}
