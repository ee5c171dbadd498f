import type { Logger } from 'pino';
import type { SandboxHandle } from '../seam/sandbox.js';
import type { Store } from '../store/index.js';
import type { InstanceRecord } from '../store/instances.js';
import { Backoff } from '../lib/backoff.js';
import { engineFailure } from './engine-failure.js';
import { ConflictError, UnavailableError } from './errors.js';
import type { InstanceService } from './instances.js';

/** How often the idle monitor looks. */
const IDLE_TICK_MS = 250;
/** An instance whose hibernation failed is tried again after this, doubling to an hour. */
const HIBERNATE_RETRY = { firstMs: 30_000, lastMs: 3_600_000 };

/**
 * The way the core's services reach an instance's sandbox: a hibernated instance is woken
 * first (transparently, for any call that needs it running), and every use counts as activity.
 * An instance with an idle timeout hibernates by itself once nothing has used it for that long:
 * no call in flight, no client attached, no call since.
 */
export class SandboxAccess {
  private readonly lastUse = new Map<string, number>();
  private readonly inUse = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private sweeping = false;
  private readonly failedHibernations = new Backoff<string>(HIBERNATE_RETRY);

  constructor(
    private readonly instances: InstanceService,
    private readonly store: Store,
    private readonly log: Logger,
    /** Whether this node's sandboxes are frozen, its lease in doubt. */
    private readonly fenced: () => boolean = () => false,
  ) {}

  /** The running sandbox, waking the instance if it hibernates. */
  async sandbox(owner: string, id: string): Promise<{ sb: SandboxHandle; rec: InstanceRecord }> {
    if (this.fenced()) throw new UnavailableError('this node cannot renew its lease: its sandboxes are frozen until it can', { reason: 'NODE_FENCED' });
    let rec = await this.instances.get(owner, id);
    if (rec.status === 'hibernated') rec = await this.instances.wake(owner, id);
    const sb = this.instances.live(id);
    if (rec.status !== 'running' || !sb) throw new ConflictError(`instance ${id} is ${rec.status}, not running${rec.error ? ` (${rec.error})` : ''}`, { status: rec.status });
    this.touch(id);
    return { sb, rec };
  }

  /** Whether `sb` is still the instance's running sandbox (not stopped, hibernated or deleted
   * since it was had), without waking anything. */
  stillLive(id: string, sb: SandboxHandle): boolean {
    return this.instances.live(id) === sb;
  }

  /** Runs `fn` on the running sandbox, as activity for as long as it takes; engine and agent
   * failures come out as API errors. */
  async use<T>(owner: string, id: string, fn: (sb: SandboxHandle, rec: InstanceRecord) => Promise<T>): Promise<T> {
    const release = this.lease(id);
    try {
      const { sb, rec } = await this.sandbox(owner, id);
      return await fn(sb, rec);
    } catch (err) {
      throw engineFailure(err);
    } finally {
      release();
    }
  }

  /** Holds the instance as active (an attached client) until the returned release. */
  lease(id: string): () => void {
    this.inUse.set(id, (this.inUse.get(id) ?? 0) + 1);
    this.touch(id);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const n = (this.inUse.get(id) ?? 1) - 1;
      if (n > 0) this.inUse.set(id, n);
      else this.inUse.delete(id);
      this.touch(id);
    };
  }

  touch(id: string): void {
    this.lastUse.set(id, Date.now());
  }

  startIdleMonitor(): void {
    // A sweep that fails (the store away a moment) is tried again at the next tick.
    this.timer ??= setInterval(() => void this.sweep().catch((err: unknown) => this.log.warn({ err }, 'idle sweep failed')), IDLE_TICK_MS);
    this.timer.unref();
  }

  stopIdleMonitor(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  private async sweep(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      const now = Date.now();
      for (const rec of await this.store.instances.idleCandidates()) {
        if (!this.instances.isLocal(rec)) continue;
        const last = this.lastUse.get(rec.id);
        if (last === undefined) {
          this.lastUse.set(rec.id, now); // first seen (a restart): idle from now on
          continue;
        }
        if (this.inUse.has(rec.id) || now - last < rec.idleTimeoutS! * 1000 || !this.failedHibernations.ready(rec.id, now)) continue;
        await this.instances.hibernate(rec.owner, rec.id, { ifIdle: () => !this.inUse.has(rec.id) && Date.now() - (this.lastUse.get(rec.id) ?? 0) >= rec.idleTimeoutS! * 1000 }).then(
          () => {
            this.failedHibernations.succeeded(rec.id);
            this.log.info({ instance: rec.id, idleTimeoutS: rec.idleTimeoutS }, 'hibernated after its idle timeout');
          },
          (err: unknown) => {
            // Not again at its next idle timeout: one that cannot be checkpointed would be
            // dumped every few seconds for ever.
            const { delayMs, failures } = this.failedHibernations.failed(rec.id);
            this.log.warn({ err, instance: rec.id, failures, retryInMs: delayMs }, 'idle hibernation failed; tried again later');
          },
        );
      }
    } finally {
      this.sweeping = false;
    }
  }
}
