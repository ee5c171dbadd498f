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

/**
 * Keeps a few restorers warm, so that a fork or a rollback finds CRIU already started (its
 * start-up is ~10-15 ms of a restore otherwise). Two, so that operations back to back do not
 * wait for the replacement of the one just used; an idle one costs ~8 MB. Restorers belong to
 * no instance until taken: the shim parents whatever its CRIU restores, and CRIU joins the
 * instance's cgroups just before it forks the restored tree.
 */
export class RestorerPool {
  private readonly spares: Spare[] = [];
  private closed = false;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly start: () => Restorer,
    private readonly size = 2,
  ) {}

  /** The oldest warm restorer, or a fresh one. The caller calls `refillSoon()` once its own work
   * is done: a CRIU starting meanwhile would compete with it for the CPU. */
  take(): Restorer {
    for (let spare = this.spares.shift(); spare; spare = this.spares.shift()) {
      if (!spare.failed) return spare.restorer;
      spare.restorer.worker.end();
    }
    return this.start();
  }

  /** Refills a moment later: spawning costs the event loop a few milliseconds, which the
   * callers released by the operation just done should not wait for. */
  refillSoon(delayMs = 25): void {
    if (this.timer || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
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
