/**
 * The one way forkpoint bounds a wait: settles as `work` does, or, once `ms` have passed first,
 * as `onLate` does (its value, or what it throws). The timer never outlives the race.
 */
export async function untilDeadline<T, L = never>(work: Promise<T>, ms: number, onLate: () => L): Promise<T | L> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<L>((resolve, reject) => {
    timer = setTimeout(() => {
      try {
        resolve(onLate());
      } catch (err) {
        reject(err);
      }
    }, ms);
  });
  try {
    return await Promise.race([work, late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The same bound as a signal: settles as `work` does, or, once `signal` aborts first (its
 * deadline, or the client that waited gone), as `onAbort` does. The listener never outlives the
 * race.
 */
export async function untilAborted<T, L = never>(work: Promise<T>, signal: AbortSignal, onAbort: () => L): Promise<T | L> {
  if (signal.aborted) return onAbort();
  let listener: (() => void) | undefined;
  const aborted = new Promise<L>((resolve, reject) => {
    listener = () => {
      try {
        resolve(onAbort());
      } catch (err) {
        reject(err);
      }
    };
    signal.addEventListener('abort', listener, { once: true });
  });
  try {
    return await Promise.race([work, aborted]);
  } finally {
    signal.removeEventListener('abort', listener!);
  }
}

/** Waits `ms`, or less if `signal` aborts first; answers whether it did. */
export function delayUnlessAborted(ms: number, signal: AbortSignal): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  return untilAborted(new Promise<boolean>((r) => (timer = setTimeout(r, ms, false))), signal, () => true).finally(() => clearTimeout(timer));
}
