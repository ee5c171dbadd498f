import type { Readable } from 'node:stream';

/**
 * Keeps a stream's early failure for its reader. A stream that fails before anything listens
 * (tar of a directory deleted meanwhile, a file that vanished) would otherwise raise an error
 * nobody hears, which ends the process. The failure is not lost: the stream stays errored, and
 * `pipeline`, `for await` and `finished` report it to whoever reads it later.
 */
export function heldErrors<T extends Readable>(stream: T): T {
  stream.on('error', () => {});
  return stream;
}
