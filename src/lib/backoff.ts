/** The one retry policy of forkpoint's background work (uploads, idle hibernation): the delay
 * doubles from `firstMs` with each failure in a row, up to `lastMs`, with up to a tenth of
 * jitter so that many failures of one cause do not come back in step. */
export interface BackoffPolicy {
  firstMs: number;
  lastMs: number;
}

export function backoffDelay(policy: BackoffPolicy, failures: number, random: () => number = Math.random): number {
  const base = Math.min(policy.firstMs * 2 ** Math.max(0, failures - 1), policy.lastMs);
  return Math.round(base * (1 + random() / 10));
}

/** Failures in a row of keyed work, and when each key may be tried again. */
export class Backoff<K> {
  private readonly failing = new Map<K, { failures: number; notBefore: number }>();

  constructor(private readonly policy: BackoffPolicy) {}

  /** Whether the key may be tried now. */
  ready(key: K, now = Date.now()): boolean {
    const f = this.failing.get(key);
    return !f || now >= f.notBefore;
  }

  /** Records a failure; answers the delay before the next try and the failures in a row. */
  failed(key: K, now = Date.now()): { delayMs: number; failures: number } {
    const failures = (this.failing.get(key)?.failures ?? 0) + 1;
    const delayMs = backoffDelay(this.policy, failures);
    this.failing.set(key, { failures, notBefore: now + delayMs });
    return { delayMs, failures };
  }

  succeeded(key: K): void {
    this.failing.delete(key);
  }
}

/** Tries `attempt` until it succeeds, waiting by the policy between tries, for at most
 * `deadlineMs` (then the last error is thrown). `retryable` says which failures are worth
 * waiting out (default: all); `onRetry` is told of each (a log line). */
export async function retryUntil<T>(
  attempt: () => Promise<T>,
  opts: { policy: BackoffPolicy; deadlineMs: number; retryable?: (err: unknown) => boolean; onRetry?: (err: unknown, delayMs: number, failures: number) => void },
): Promise<T> {
  const deadline = Date.now() + opts.deadlineMs;
  for (let failures = 1; ; failures++) {
    try {
      return await attempt();
    } catch (err) {
      const delayMs = backoffDelay(opts.policy, failures);
      if ((opts.retryable && !opts.retryable(err)) || Date.now() + delayMs > deadline) throw err;
      opts.onRetry?.(err, delayMs, failures);
      await new Promise((r) => setTimeout(r, delayMs));
    }
  }
}
