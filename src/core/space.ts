import type { SandboxRuntime } from '../seam/runtime.js';
import { InsufficientStorageError } from './errors.js';

/** Room kept free under the data directory for the store, logs and the first writes of new
 * uppers: below it, new instances, forks and checkpoints are refused rather than left to fail
 * half-way. */
export const MIN_FREE_BYTES = 32 << 20;

const mib = (n: number) => `${Math.round(n / 1048576)} MiB`;

/** Why `extra` bytes (plus the reserve) cannot be written now, if they cannot. */
export async function shortOfRoom(engine: SandboxRuntime, extra = 0): Promise<string | undefined> {
  const free = await engine.freeBytes().catch(() => Infinity);
  const needed = MIN_FREE_BYTES + extra;
  if (free >= needed) return undefined;
  return `not enough free space under the data directory: ${mib(free)} free, ${mib(needed)} needed (No space left on device)`;
}

export async function requireRoom(engine: SandboxRuntime, extra = 0): Promise<void> {
  const short = await shortOfRoom(engine, extra);
  if (short) throw new InsufficientStorageError(short);
}
