import { untilAborted } from '../lib/deadline.js';

/** The lock under which an owner's instance records are made, and under which anything that a
 * new record depends on (its quota, its volumes) is taken away. */
export const ownerRecordsLock = (owner: string): string => `owner:${owner}`;

/** Serialises work per key (an instance) and bounds how much heavy work runs at once. */
export class KeyedLock {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => {});
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }

  busy(key: string): boolean {
    return this.tails.has(key);
  }
}

export class Semaphore {
  private active = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(private readonly limit: number) {}

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.limit) await new Promise<void>((r) => this.waiting.push(r));
    this.active++;
    try {
      return await fn();
    } finally {
      this.active--;
      this.waiting.shift()?.();
    }
  }
}

/** The in-process job queue: jobs of one instance run one after another, at most
 * `concurrency` jobs run at once overall, and every job can be awaited by id. */
export class JobQueue {
  private readonly sem: Semaphore;
  private readonly running = new Map<string, Promise<void>>();

  constructor(
    private readonly locks: KeyedLock,
    concurrency: number,
  ) {
    this.sem = new Semaphore(concurrency);
  }

  enqueue(jobId: string, key: string, fn: () => Promise<void>): Promise<void> {
    const p = this.locks.run(key, () => this.sem.run(fn)).finally(() => this.running.delete(jobId));
    this.running.set(jobId, p.catch(() => {}));
    return p;
  }

  /** Jobs queued or running. */
  get depth(): number {
    return this.running.size;
  }

  /** Whether the job is queued or running. */
  has(jobId: string): boolean {
    return this.running.has(jobId);
  }

  /** Resolves when the job is over (or at once if it is not queued), or once `signal` aborts
   * (its deadline, or the client that waited gone). */
  async wait(jobId: string, signal: AbortSignal): Promise<void> {
    const p = this.running.get(jobId);
    if (!p) return;
    await untilAborted(p, signal, () => undefined);
  }

  async drain(): Promise<void> {
    await Promise.all([...this.running.values()]);
  }
}
