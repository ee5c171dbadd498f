import { closeSync, openSync, readSync, unlinkSync, writeSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';

/** Bytes kept in memory per stream; the rest of a command's output waits in a file. */
export const IN_MEMORY_BYTES = 1 << 20;
const READ_CHUNK = 64 << 10;

/**
 * One stream of a command's output, up to a limit: the first MiB in memory, anything beyond
 * it in a file of its own under `spillDir`, so that a command printing 64 MiB costs the server
 * a MiB per stream. Read it back with `chunks()` (in order, a piece at a time) and `dispose()`
 * it once done. A spill that fails (a full disk) keeps what it has and counts as truncated.
 */
export class Output {
  private readonly head: Buffer[] = [];
  private headBytes = 0;
  private fd: number | undefined;
  private file: string | undefined;
  private spilled = 0;
  truncated = false;

  constructor(
    private readonly limit: number,
    private readonly spillDir: string,
  ) {}

  /** An output that holds just `data`. */
  static of(data: Buffer | string, spillDir: string): Output {
    const o = new Output(Number.MAX_SAFE_INTEGER, spillDir);
    o.push(Buffer.from(data));
    return o;
  }

  get size(): number {
    return this.headBytes + this.spilled;
  }

  push(data: Buffer): void {
    const room = this.limit - this.size;
    if (data.length > room) this.truncated = true;
    if (room <= 0) return;
    let part = data.length > room ? data.subarray(0, room) : data;
    const headRoom = IN_MEMORY_BYTES - this.headBytes;
    if (headRoom > 0) {
      const now = part.length > headRoom ? part.subarray(0, headRoom) : part;
      this.head.push(Buffer.from(now));
      this.headBytes += now.length;
      part = part.subarray(now.length);
    }
    if (part.length) this.spill(part);
  }

  private spill(data: Buffer): void {
    try {
      if (this.fd === undefined) {
        this.file = join(this.spillDir, `out-${randomBytes(8).toString('hex')}`);
        this.fd = openSync(this.file, 'wx+', 0o600);
      }
      for (let off = 0; off < data.length; ) off += writeSync(this.fd, data, off, data.length - off);
      this.spilled += data.length;
    } catch {
      this.truncated = true;
    }
  }

  /** Whether it all fits in memory (no file was needed). */
  get small(): boolean {
    return this.fd === undefined;
  }

  /** The whole output as one buffer: only for small outputs. */
  toBuffer(): Buffer {
    if (!this.small) throw new Error('output spilled to disk: read it with chunks()');
    return Buffer.concat(this.head, this.headBytes);
  }

  *chunks(): Generator<Buffer> {
    yield* this.head;
    if (this.fd === undefined) return;
    const buf = Buffer.allocUnsafe(READ_CHUNK);
    for (let pos = 0; pos < this.spilled; ) {
      const n = readSync(this.fd, buf, 0, Math.min(READ_CHUNK, this.spilled - pos), pos);
      if (n <= 0) return;
      pos += n;
      yield Buffer.from(buf.subarray(0, n));
    }
  }

  dispose(): void {
    if (this.fd === undefined) return;
    try {
      closeSync(this.fd);
      unlinkSync(this.file!);
    } catch {
      // already gone
    }
    this.fd = undefined;
  }
}
