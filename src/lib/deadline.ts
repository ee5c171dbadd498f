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
