import type { CriuWorker } from './criu-worker.js';

/** A CRIU worker started ahead of a restore, under the shim that will parent the sandbox. */
export interface Restorer {
  worker: CriuWorker;
  /** Settles when CRIU is up and answering. */
  ready: Promise<void>;
}

/**
 * Keeps one restorer warm, so that a fork or a rollback finds CRIU already started (its
 * start-up is ~10 ms of each restore otherwise). Restorers belong to no instance until
 * taken: the shim parents whatever its CRIU restores, and CRIU joins the instance's cgroups
 * just before it forks the restored tree.
 */
export class RestorerPool {
  private spare: { restorer: Restorer; failed: boolean } | undefined;
  private closed = false;

  constructor(private readonly start: () => Restorer) {}

  /** A warm restorer if there is one, a fresh one otherwise. The caller calls `refill()` when
   * its own work is done: a CRIU starting meanwhile would compete with it for the CPU. */
  take(): Restorer {
    const spare = this.spare;
    this.spare = undefined;
    if (spare && !spare.failed) return spare.restorer;
    spare?.restorer.worker.end();
    return this.start();
  }

  refill(): void {
    if (this.closed || this.spare) return;
    const entry = { restorer: this.start(), failed: false };
    entry.restorer.ready.catch(() => {
      entry.failed = true;
    });
    this.spare = entry;
  }

  close(): void {
    this.closed = true;
    this.spare?.restorer.worker.end();
    this.spare = undefined;
  }
}
