import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { CriuWorker } from '../../src/engine/criu-worker.js';
import { RestorerPool, type Restorer } from '../../src/engine/restorers.js';

/** A pool over fake restorers: what it started, and which of those were ended. */
function pool() {
  const started: Restorer[] = [];
  const ended = new Set<Restorer>();
  const p = new RestorerPool(() => {
    const r: Restorer = { worker: { end: () => ended.add(r) } as unknown as CriuWorker, ready: Promise.resolve() };
    started.push(r);
    return r;
  });
  return { p, started, ended };
}

describe('the warm restorer pool', () => {
  beforeEach(() => vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] }));
  afterEach(() => vi.useRealTimers());

  it('refills shortly after an operation, from the spares it keeps', () => {
    const { p, started } = pool();
    p.refill();
    expect(started).toHaveLength(2);
    const taken = p.take();
    expect(taken).toBe(started[0]);
    p.finished();
    vi.advanceTimersByTime(30);
    expect(started).toHaveLength(3);
  });

  it('starts no CRIU while a pause or another restore is under way, and refills once it is over', async () => {
    const { p, started } = pool();
    p.refill();
    p.take();
    p.take(); // a second operation right behind the first: a fork after a rollback
    p.finished();
    vi.advanceTimersByTime(200);
    expect(started).toHaveLength(2); // the fork's restore runs alone
    p.finished();
    vi.advanceTimersByTime(30);
    expect(started).toHaveLength(4);

    let endPause!: () => void;
    p.take();
    p.finished();
    const paused = p.quietWhile(() => new Promise<void>((r) => (endPause = r)));
    vi.advanceTimersByTime(200);
    expect(started).toHaveLength(4);
    endPause();
    await paused;
    vi.advanceTimersByTime(30);
    expect(started).toHaveLength(5);
  });

  it('does not wait for quiet forever: a busy engine gets its refill within a second', () => {
    const { p, started } = pool();
    p.take(); // never finished: a long restore
    p.take();
    p.finished();
    vi.advanceTimersByTime(900);
    expect(started).toHaveLength(2);
    vi.advanceTimersByTime(200);
    expect(started).toHaveLength(4);
  });

  it('ends a spare whose CRIU failed to start instead of handing it out, and every spare on close', async () => {
    const { p, started, ended } = pool();
    p.refill();
    const failed = started[0]!;
    // What refill() saw fail: a restorer whose readiness rejected.
    (p as unknown as { spares: { restorer: Restorer; failed: boolean }[] }).spares[0]!.failed = true;
    expect(p.take()).toBe(started[1]);
    expect(ended.has(failed)).toBe(true);
    p.finished();
    vi.advanceTimersByTime(30);
    p.close();
    for (const r of started.slice(2)) expect(ended.has(r)).toBe(true);
  });
});
