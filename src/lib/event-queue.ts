/**
 * Events from callbacks as an async iterable, for a server stream. Bounded: a client that
 * reads nothing while more than `maxBytes` wait is cut off (the producer never blocks).
 */
export class EventQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private waiter: (() => void) | undefined;
  private ended = false;
  private failure: Error | undefined;
  private bytes = 0;

  constructor(
    private readonly sizeOf: (t: T) => number,
    private readonly maxBytes: number,
  ) {}

  push(item: T): void {
    if (this.ended) return;
    this.bytes += this.sizeOf(item);
    if (this.bytes > this.maxBytes) return this.fail(new Error('the client fell too far behind'));
    this.items.push(item);
    this.wake();
  }

  end(): void {
    this.ended = true;
    this.wake();
  }

  fail(err: Error): void {
    this.failure ??= err;
    this.end();
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }

  /** Resolves when an item or the end comes, or after `ms` (a keep-alive is due). */
  private async next(ms: number): Promise<void> {
    if (this.items.length || this.ended) return;
    let timer: NodeJS.Timeout | undefined;
    await new Promise<void>((resolve) => {
      this.waiter = resolve;
      timer = setTimeout(resolve, ms);
    });
    clearTimeout(timer);
  }

  /** Items as they come; `idle()` is yielded when nothing came for `idleMs`. */
  async *withKeepAlive<K = T>(idleMs: number, idle: () => K): AsyncGenerator<T | K> {
    for (;;) {
      await this.next(idleMs);
      if (this.items.length) {
        const item = this.items.shift()!;
        this.bytes -= this.sizeOf(item);
        yield item;
        continue;
      }
      if (this.ended) {
        if (this.failure) throw this.failure;
        return;
      }
      yield idle();
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return this.withKeepAlive<never>(2 ** 31 - 1, () => {
      throw new Error('unreachable');
    });
  }
}
