import type { Logger } from 'pino';
import type { Store } from '../store/index.js';
import type { InstanceRecord } from '../store/instances.js';

const SWEEP_MS = 1000;

/**
 * Instances with a lifetime (E2B's sandbox timeout) end when it is over: deleted, or hibernated
 * with their memory, as they asked. A sweep a second, so an instance outlives its end by at
 * most about that; one that fails to end is tried again at the next sweep.
 */
export class ExpiryService {
  private timer: NodeJS.Timeout | undefined;
  private sweeping = false;

  constructor(
    private readonly store: Store,
    private readonly end: (rec: InstanceRecord) => Promise<void>,
    private readonly log: Logger,
  ) {}

  start(): void {
    // A sweep that fails (the store away a moment) is tried again at the next tick.
    this.timer ??= setInterval(() => void this.sweep().catch((err: unknown) => this.log.warn({ err }, 'expiry sweep failed')), SWEEP_MS);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  async sweep(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      for (const rec of await this.store.instances.expired(new Date().toISOString())) {
        await this.end(rec).catch((err: unknown) => this.log.warn({ err, instance: rec.id }, 'an expired instance could not be ended; trying again'));
      }
    } finally {
      this.sweeping = false;
    }
  }
}
