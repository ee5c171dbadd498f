import { spawn } from 'node:child_process';
import { createReadStream } from 'node:fs';
import { open } from 'node:fs/promises';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { extract, type Header } from 'tar-stream';

/** What an archive may unpack to. */
export interface ArchiveBounds {
  /** Bytes of the tar stream once decompressed: what unpacking it writes, at most. */
  maxBytes: number;
  maxEntries: number;
  /** Member kinds allowed (a build context has no devices or fifos). */
  types: readonly MemberType[];
}

export type MemberType = 'file' | 'directory' | 'symlink' | 'link' | 'character-device' | 'block-device' | 'fifo';

export type ArchiveRefusal = 'UNPACKED_TOO_LARGE' | 'TOO_MANY_ENTRIES' | 'SPARSE_MEMBER' | 'MEMBER_TYPE' | 'NOT_AN_ARCHIVE';

export class ArchiveRefusedError extends Error {
  override readonly name = 'ArchiveRefusedError';
  constructor(
    readonly reason: ArchiveRefusal,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** The decompressor tar would pick for these first bytes (none: a plain tar). */
function decompressorOf(magic: Buffer): string[] | 'gzip' | undefined {
  if (magic[0] === 0x1f && magic[1] === 0x8b) return 'gzip';
  if (magic.subarray(0, 6).equals(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]))) return ['xz', '-dc'];
  if (magic.subarray(0, 3).toString('latin1') === 'BZh') return ['bzip2', '-dc'];
  if (magic.subarray(0, 4).equals(Buffer.from([0x28, 0xb5, 0x2f, 0xfd]))) return ['zstd', '-dc'];
  return undefined;
}

/** The tar stream of an archive file, decompressed as tar itself would. */
async function tarStreamOf(file: string, signal: AbortSignal): Promise<{ stream: Readable; done: Promise<void> }> {
  const fh = await open(file, 'r');
  const magic = Buffer.alloc(6);
  try {
    await fh.read(magic, 0, 6, 0);
  } finally {
    await fh.close();
  }
  const how = decompressorOf(magic);
  if (how === undefined) return { stream: createReadStream(file, { signal }), done: Promise.resolve() };
  if (how === 'gzip') return { stream: createReadStream(file, { signal }).pipe(createGunzip()), done: Promise.resolve() };
  const [cmd, ...args] = how;
  const child = spawn(cmd!, args, { stdio: ['pipe', 'pipe', 'ignore'], signal });
  createReadStream(file).pipe(child.stdin).on('error', () => {});
  const done = new Promise<void>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, sig) => (code === 0 || sig === 'SIGTERM' ? resolve() : reject(new Error(`${cmd} exited with ${code ?? sig}`))));
  });
  done.catch(() => {});
  return { stream: child.stdout, done };
}

/**
 * Reads an archive as tar will unpack it and refuses it, before anything is unpacked, if it
 * would write more than the bounds allow: its decompressed stream is counted as it is read (a
 * gzip bomb stops at the bound, not at its end), every member is counted and its kind checked,
 * and sparse members are refused (their stored size says nothing of what they unpack to).
 * Bytes of the stream bound what regular members write; links write none.
 */
export async function checkArchive(file: string, bounds: ArchiveBounds, signal = AbortSignal.timeout(10 * 60_000)): Promise<{ bytes: number; entries: number }> {
  const stop = new AbortController();
  const both = AbortSignal.any([signal, stop.signal]);
  let bytes = 0;
  let entries = 0;
  // The first refusal is the answer, whatever the streams' teardown reports after it.
  let refusal: ArchiveRefusedError | undefined;
  const refuse = (e: ArchiveRefusedError): never => {
    refusal ??= e;
    throw e;
  };
  const counted = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      bytes += chunk.length;
      if (bytes <= bounds.maxBytes) return cb(null, chunk);
      refusal ??= new ArchiveRefusedError('UNPACKED_TOO_LARGE', `the archive unpacks to more than ${bounds.maxBytes} bytes`);
      cb(refusal);
    },
  });
  const { stream, done } = await tarStreamOf(file, both).catch((err: unknown) => {
    throw new ArchiveRefusedError('NOT_AN_ARCHIVE', `not a readable archive: ${(err as Error).message}`, { cause: err });
  });
  const parser = extract();
  const check = (h: Header): void => {
    entries++;
    if (entries > bounds.maxEntries) refuse(new ArchiveRefusedError('TOO_MANY_ENTRIES', `the archive has more than ${bounds.maxEntries} members`));
    const pax = (h.pax ?? {}) as Record<string, string>;
    // GNU's old sparse members have a type of their own ('S', which the parser does not name),
    // its PAX ones GNU.sparse.* keys.
    if ((h.type as string | null) === null || Object.keys(pax).some((k) => k.startsWith('GNU.sparse'))) refuse(new ArchiveRefusedError('SPARSE_MEMBER', `${h.name}: sparse members are not accepted`));
    if (!(bounds.types as readonly string[]).includes(h.type)) refuse(new ArchiveRefusedError('MEMBER_TYPE', `${h.name}: a ${h.type} is not accepted here`));
  };
  const reading = (async () => {
    for await (const entry of parser) {
      check(entry.header);
      entry.resume();
    }
  })();
  try {
    await Promise.all([pipeline(stream, counted, parser), reading, done]);
  } catch (err) {
    stop.abort();
    if (refusal) throw refusal;
    if (err instanceof ArchiveRefusedError || signal.aborted) throw err;
    throw new ArchiveRefusedError('NOT_AN_ARCHIVE', `not a readable archive: ${(err as Error).message}`, { cause: err });
  } finally {
    stop.abort();
  }
  return { bytes, entries };
}
