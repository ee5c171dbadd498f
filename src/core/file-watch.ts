import { newProcessId, type AgentPort, type WatchEvent } from '../seam/agent.js';
import { AgentClosedError, AgentError } from '../seam/errors.js';
import type { SandboxHandle } from '../seam/sandbox.js';
import { untilDeadline } from '../lib/deadline.js';
import { EventQueue } from '../lib/event-queue.js';
import { ConflictError, QuotaExceededError } from './errors.js';
import { uploadTargetOf, type UploadTarget } from './upload-names.js';

/** Events waiting for a reader that is slow: past this the watch ends rather than grow. */
const MAX_QUEUED_BYTES = 1 << 20;
/** Watches taken up again after pauses (checkpoints, rollbacks) in one minute: more is an agent
 * closing connections on purpose, and the watch ends rather than spin. */
const MAX_REWATCHES_PER_MINUTE = 30;
const EINTR = 4;
const EMFILE = 24;
const ENOSPC = 28;
const EOVERFLOW = 75;

/** How long a rollback or a checkpoint waits for its sandbox's watches to be back. */
const RESUME_DEADLINE_MS = 2000;
/** How long a write through the API waits for its sandbox's watches to tell it. */
const TOLD_DEADLINE_MS = 100;

/** The watches open on each sandbox, by sandbox: a side table, as `resuming` is. */
const open = new WeakMap<object, Set<DirectoryWatch>>();

/**
 * Makes `rename` (of `tmp`, a file's absolute temporary name in FileService.writeStream, onto
 * the file's own) and resolves once every watch open on `sb` that reports `tmp` has told it, at
 * most TOLD_DEADLINE_MS after the rename. A write through the API then answers after the
 * events it caused are in its watches, so that a client polling a watch the moment its write
 * answers (E2B's sync Python SDK does) finds them: the events come from the agent on each
 * watch's own connection, not on the one the write's answer came on.
 */
export async function watchesTold(sb: object, tmp: string, rename: () => Promise<unknown>): Promise<void> {
  const watches = [...(open.get(sb) ?? [])];
  const told = watches.flatMap((w) => w.toldOf(tmp) ?? []);
  try {
    await rename();
    if (told.length) await untilDeadline(Promise.all(told), TOLD_DEADLINE_MS, () => undefined);
  } finally {
    for (const w of watches) w.forgetTold(tmp);
  }
}

/** Watches being taken up again after a pause, by sandbox: a side table, so that the pause's
 * caller can wait for them without the sandbox knowing of watches. */
const resuming = new WeakMap<SandboxHandle, Set<Promise<void>>>();

/**
 * Resolves once the watches a pause of `sb` cut off are in place again (or have ended), at most
 * RESUME_DEADLINE_MS from now. A rollback or a checkpoint answers after it: a change its caller
 * makes next is then told, not lost in the moment between the gate opening and the watch.
 */
export async function watchesResumed(sb: SandboxHandle): Promise<void> {
  const pending = resuming.get(sb);
  if (!pending?.size) return;
  await untilDeadline(Promise.allSettled([...pending]), RESUME_DEADLINE_MS, () => undefined);
}

export interface WatchTarget {
  sb: SandboxHandle;
  /** Whether `sb` still runs the instance (not stopped, hibernated or deleted since). */
  stillLive(): boolean;
  /** An agent's failure as the API error it is. */
  failed(err: unknown): Error;
}

/**
 * A directory watched inside a sandbox, on a connection of its own to the agent (the main one's
 * subscriptions never wait behind it). A pause closes that connection; the watch is taken up
 * again after it, on the sandbox as restored (nothing changes inside while it is paused). It
 * ends when closed, when the sandbox stops, or with an error the reader gets.
 */
export class DirectoryWatch implements AsyncIterable<WatchEvent> {
  private readonly queue = new EventQueue<WatchEvent>((e) => e.name.length + 32, MAX_QUEUED_BYTES);
  private readonly id = newProcessId();
  private agent: AgentPort | undefined;
  private closed = false;
  private rewatches: number[] = [];
  /** The upload whose temporary name (`temp`, as reported) was just renamed away from, onto its own name. */
  private uploaded: (UploadTarget & { temp: string }) | undefined;
  /** Writes waiting for this watch to tell their rename, by temporary name as reported. */
  private readonly awaited = new Map<string, () => void>();

  private constructor(
    private readonly target: WatchTarget,
    private readonly path: string,
    private readonly recursive: boolean,
  ) {}

  /** Resolves once the watch is in place (events from then on are reported). */
  static async open(target: WatchTarget, path: string, opts: { recursive: boolean; signal?: AbortSignal }): Promise<DirectoryWatch> {
    const w = new DirectoryWatch(target, path, opts.recursive);
    await w.attach();
    if (!w.closed) {
      const watches = open.get(target.sb) ?? new Set();
      open.set(target.sb, watches);
      watches.add(w);
    }
    if (opts.signal) {
      if (opts.signal.aborted) w.close();
      else opts.signal.addEventListener('abort', () => w.close(), { once: true });
    }
    return w;
  }

  private async attach(): Promise<void> {
    const sb = this.target.sb;
    let agent: AgentPort;
    try {
      agent = await sb.sideAgent();
    } catch (err) {
      throw this.target.failed(err);
    }
    if (this.closed) return sb.releaseSide(agent);
    this.agent = agent;
    try {
      await agent.watch(this.id, this.path, this.recursive, {
        onEvent: (e) => this.seen(e),
        onEnd: (err) => this.ended(agent, err),
      });
    } catch (err) {
      this.agent = undefined;
      sb.releaseSide(agent);
      throw this.refused(err);
    }
  }

  /** A file written through forkpoint is streamed into a temporary name and renamed over its
   * own (FileService.writeStream): the watch tells that as envd tells its write in place (open
   * with O_CREAT, chown, write), `create` (of a new file), `chmod` and `write` of the file, and
   * says nothing of the temporary name. */
  private seen(e: WatchEvent): void {
    const upload = uploadTargetOf(e.name);
    const renamedFrom = this.uploaded;
    this.uploaded = upload !== undefined && e.op === 'rename' ? { ...upload, temp: e.name } : undefined;
    if (upload !== undefined) return;
    if (e.op === 'create' && e.name === renamedFrom?.target) {
      if (renamedFrom.fresh) this.queue.push({ op: 'create', name: e.name });
      this.queue.push({ op: 'chmod', name: e.name });
      this.queue.push({ op: 'write', name: e.name });
      this.awaited.get(renamedFrom.temp)?.();
      this.awaited.delete(renamedFrom.temp);
      return;
    }
    this.queue.push(e);
  }

  /** Resolves once this watch has told the rename of `tmp` (absolute) onto its file; undefined
   * when this watch does not report that path. */
  toldOf(tmp: string): Promise<void> | undefined {
    const name = this.reported(tmp);
    return name === undefined || this.closed ? undefined : new Promise((resolve) => this.awaited.set(name, resolve));
  }

  /** Stops waiting for `tmp` (its rename failed, or was not told in time). */
  forgetTold(tmp: string): void {
    const name = this.reported(tmp);
    if (name !== undefined) this.awaited.delete(name);
  }

  /** `path` (absolute) as this watch reports it, if it does. */
  private reported(path: string): string | undefined {
    const prefix = this.path.endsWith('/') ? this.path : `${this.path}/`;
    const name = path.startsWith(prefix) ? path.slice(prefix.length) : undefined;
    return name !== undefined && (this.recursive || !name.includes('/')) ? name : undefined;
  }

  private ended(agent: AgentPort, err: Error): void {
    if (this.agent === agent) {
      this.agent = undefined;
      this.target.sb.releaseSide(agent);
    }
    if (this.closed) return;
    const now = Date.now();
    this.rewatches = this.rewatches.filter((t) => now - t < 60_000);
    const byPause = err instanceof AgentClosedError || (err instanceof AgentError && err.errno === EINTR);
    if (!byPause || !this.target.stillLive()) return this.queue.fail(this.endedBy(err));
    if (this.rewatches.length >= MAX_REWATCHES_PER_MINUTE) {
      return this.queue.fail(new ConflictError('the watch was cut off too often; watch again', { reason: 'WATCH_CUT_OFF' }));
    }
    this.rewatches.push(now);
    // A sandbox stopped meanwhile is said as such, not as the failure of the watch's retry.
    const sb = this.target.sb;
    const again = this.attach().catch((e: unknown) => this.queue.fail(this.target.stillLive() ? (e instanceof Error ? e : new Error(String(e))) : this.notRunning()));
    const pending = resuming.get(sb) ?? new Set();
    resuming.set(sb, pending);
    pending.add(again);
    void again.finally(() => pending.delete(again));
  }

  private refused(err: unknown): Error {
    if (err instanceof AgentError && err.errno === EMFILE) return new QuotaExceededError('this sandbox has as many directory watches as it may have open (16); close one', { reason: 'WATCH_LIMIT' });
    if (err instanceof AgentError && err.errno === ENOSPC) return new QuotaExceededError('more directories than one watch may hold (65536, the sandbox\'s inotify bound); watch a smaller tree', { reason: 'WATCH_TOO_MANY_DIRECTORIES' });
    return this.target.failed(err);
  }

  private endedBy(err: Error): Error {
    if (err instanceof AgentError && err.errno === EOVERFLOW) return new ConflictError('more changes came than the watch could hold; watch again', { reason: 'WATCH_OVERFLOW' });
    if (!this.target.stillLive()) return this.notRunning();
    return this.refused(err);
  }

  private notRunning(): Error {
    return new ConflictError('the instance stopped running; the watch ended', { reason: 'INSTANCE_NOT_RUNNING' });
  }

  /** Events as they come; `idle()` when none came for `idleMs` (a keep-alive is due). */
  events<K>(idleMs: number, idle: () => K): AsyncGenerator<WatchEvent | K> {
    return this.queue.withKeepAlive(idleMs, idle);
  }

  [Symbol.asyncIterator](): AsyncIterator<WatchEvent> {
    return this.queue[Symbol.asyncIterator]();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    open.get(this.target.sb)?.delete(this);
    for (const resolve of this.awaited.values()) resolve();
    this.awaited.clear();
    const agent = this.agent;
    this.agent = undefined;
    if (agent) {
      agent.unwatch(this.id);
      this.target.sb.releaseSide(agent);
    }
    this.queue.end();
  }
}
