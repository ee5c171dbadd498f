import type { CriuWorker } from './criu-worker.js';

/** A CRIU worker started ahead of a restore, under the shim that will parent the sandbox. */
export interface Restorer {
  worker: CriuWorker;
  /** Settles when CRIU is up and answering. */
  ready: Promise<void>;
}

interface Spare {
  restorer: Restorer;
  failed: boolean;
}

/** How long a refill waits for the engine to be quiet before it starts anyway. */
const MAX_REFILL_DEFER_MS = 1000;

/**
 * Keeps a few restorers warm, so that a fork or a rollback finds CRIU already started (its
 * start-up is ~10-15 ms of a restore otherwise). Two, so that operations back to back do not
 * wait for the replacement of the one just used; an idle one costs ~8 MB. Restorers belong to
 * no instance until taken: the shim parents whatever its CRIU restores, and CRIU joins the
 * instance's cgroups just before it forks the restored tree.
 *
 * A refill waits until no pause or restore is under way (`quietWhile`, `take` .. `finished`):
 * two CRIUs starting up beside a restore took the CPU from it (a fork right after a rollback:
 * CRIU's restore 31 ms against 14 ms alone).
 */
export class RestorerPool {
  private readonly spares: Spare[] = [];
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  /** Operations under way that a CRIU starting up would slow down. */
  private busy = 0;
  private deferredSince: number | undefined;

  constructor(
    private readonly start: () => Restorer,
    private readonly size = 2,
  ) {}

  /** The oldest warm restorer, or a fresh one, for one operation; the caller calls
   * `finished()` once that operation is over, whether it used the restorer or not. */
  take(): Restorer {
    this.busy++;
    for (let spare = this.spares.shift(); spare; spare = this.spares.shift()) {
      if (!spare.failed) return spare.restorer;
      spare.restorer.worker.end();
    }
    return this.start();
  }

  /** The operation that took a restorer is over: the pool refills once the engine is quiet. */
  finished(): void {
    this.busy = Math.max(0, this.busy - 1);
    this.refillSoon();
  }

  /** Runs `work` (a pause) with refills held back until it is done. */
  async quietWhile<T>(work: () => Promise<T>): Promise<T> {
    this.busy++;
    try {
      return await work();
    } finally {
      this.busy = Math.max(0, this.busy - 1);
    }
  }

  /** Refills a moment later, and then only when no operation is under way (at the latest
   * MAX_REFILL_DEFER_MS on): spawning costs the event loop a few milliseconds and CRIU's
   * start-up a core's worth of CPU. */
  private refillSoon(delayMs = 25): void {
    if (this.timer || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      const now = performance.now();
      if (this.busy > 0 && now - (this.deferredSince ??= now) < MAX_REFILL_DEFER_MS) {
        this.refillSoon(delayMs);
        return;
      }
      this.deferredSince = undefined;
      this.refill();
    }, delayMs);
    this.timer.unref();
  }

  refill(): void {
    while (!this.closed && this.spares.length < this.size) {
      const spare: Spare = { restorer: this.start(), failed: false };
      spare.restorer.ready.catch(() => {
        spare.failed = true;
      });
      this.spares.push(spare);
    }
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    for (const spare of this.spares.splice(0)) spare.restorer.worker.end();
  }
}
