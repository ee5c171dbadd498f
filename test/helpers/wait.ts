export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits until `fn` holds, polling every 25 ms; fails after `timeoutMs`. */
export async function until(what: string, fn: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}
