import { randomUUID } from 'node:crypto';
import { open, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { substituteText, substitutingStream, type Substitution } from './secret-substitution.js';

/** A body up to this long (by its Content-Length) may be read whole, its placeholders replaced
 * and its length told anew. */
export const BODY_HELD_MAX = 1024 * 1024;
/** Bytes of bodies held whole at once for one sandbox, and for the whole server: 64 connections
 * a sandbox, times many sandboxes, must not hold 1 MiB each in the server's memory. */
export const BODIES_HELD_PER_SANDBOX = 8 * 1024 * 1024;
export const BODIES_HELD_TOTAL = 64 * 1024 * 1024;

/** A longer body, up to this (by its Content-Length), is written to the server's disk with its
 * placeholders replaced, and sent from there with its length told anew. */
export const BODY_SPOOLED_MAX = 256 * 1024 * 1024;
/** Bytes of bodies on disk at once for one sandbox, and for the whole server. */
export const BODIES_SPOOLED_PER_SANDBOX = 256 * 1024 * 1024;
export const BODIES_SPOOLED_TOTAL = 1024 * 1024 * 1024;
/** What a spooled body takes of its budget at a time past its stated length (the values it
 * gets are longer than their placeholders). */
const SPOOL_GROWTH_STEP = 1024 * 1024;

/** Bytes held whole, per sandbox and in all: a body that does not fit streams instead. */
export class BodyBudget {
  private total = 0;
  private readonly held = new Map<string, number>();

  constructor(private readonly perSandbox = BODIES_HELD_PER_SANDBOX, private readonly limit = BODIES_HELD_TOTAL) {}

  /** `bytes` taken for `id` if both bounds have room (its release, once), else undefined. */
  take(id: string, bytes: number): (() => void) | undefined {
    const mine = this.held.get(id) ?? 0;
    if (mine + bytes > this.perSandbox || this.total + bytes > this.limit) return undefined;
    this.held.set(id, mine + bytes);
    this.total += bytes;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.total -= bytes;
      const left = (this.held.get(id) ?? bytes) - bytes;
      if (left > 0) this.held.set(id, left);
      else this.held.delete(id);
    };
  }

  /** Bytes held now (for `id`, or in all). */
  holding(id?: string): number {
    return id === undefined ? this.total : this.held.get(id) ?? 0;
  }
}

/** Where bodies too long to hold in memory are written, within their own budget. */
export interface BodySpool {
  dir: string;
  budget: BodyBudget;
}

export interface BodyWithSecrets {
  body: Buffer | Readable;
  /** Gives back what the body took of the budget: call it once the request is done. */
  release: () => void;
}

/**
 * A request body with the placeholders replaced, and `headers`' framing made to match it. One of
 * a stated length keeps a stated length, told anew (some servers, object stores among them,
 * refuse chunked uploads): read whole when it fits the memory budget, else written to the spool
 * first when it fits that. Any other (chunked already, or past both budgets) has them replaced as
 * it streams, holding at most a placeholder's length, and goes chunked.
 */
export async function bodyWithSecrets(
  id: string,
  req: Readable & { headers: Record<string, string | string[] | undefined> },
  headers: Record<string, string | string[]>,
  subs: Substitution[],
  budget: BodyBudget,
  spool?: BodySpool,
): Promise<BodyWithSecrets> {
  const length = Number(req.headers['content-length']);
  const stated = Number.isSafeInteger(length) && length >= 0;
  const release = stated && length <= BODY_HELD_MAX ? budget.take(id, length) : undefined;
  const spooled = !release && stated && length <= BODY_SPOOLED_MAX && spool ? spool.budget.take(id, length) : undefined;
  if (spooled) return spoolBody(id, req, headers, subs, length, spool!, spooled);
  if (!release) {
    delete headers['content-length'];
    const replaced = substitutingStream(subs);
    // A client that goes away mid-body ends the upstream request too (pipe would leave it waiting).
    pipeline(req, replaced).catch(() => {});
    return { body: replaced, release: () => {} };
  }
  try {
    const chunks: Buffer[] = [];
    let read = 0;
    for await (const chunk of req) {
      read += (chunk as Buffer).length;
      // Node's parser stops at Content-Length; the check keeps the budget true whatever feeds it.
      if (read > length) throw new Error('the body is longer than its Content-Length');
      chunks.push(chunk as Buffer);
    }
    const body = Buffer.from(substituteText(Buffer.concat(chunks).toString('latin1'), subs), 'latin1');
    headers['content-length'] = String(body.length);
    return { body, release };
  } catch (err) {
    release();
    throw err;
  }
}

/** The body written to a file of the spool with its placeholders replaced, then sent from it with
 * its length: the file is unlinked as soon as it is open again for reading, so nothing is left of
 * it on disk once the request is done (a crash leaves it to the spool's sweep at start). */
async function spoolBody(
  id: string,
  req: Readable,
  headers: Record<string, string | string[]>,
  subs: Substitution[],
  length: number,
  spool: BodySpool,
  firstRelease: () => void,
): Promise<BodyWithSecrets> {
  const releases = [firstRelease];
  const release = () => releases.forEach((r) => r());
  const file = join(spool.dir, `egress-body-${randomUUID()}`);
  let read = 0;
  let written = 0;
  let taken = length;
  // Node's parser stops at Content-Length; the check keeps the budget true whatever feeds it.
  const stated = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      read += chunk.length;
      done(read > length ? new Error('the body is longer than its Content-Length') : null, chunk);
    },
  });
  const bounded = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      written += chunk.length;
      while (written > taken) {
        const more = spool.budget.take(id, SPOOL_GROWTH_STEP);
        if (!more) return done(new Error('the body with its secrets is past what the proxy may keep of it'));
        releases.push(more);
        taken += SPOOL_GROWTH_STEP;
      }
      done(null, chunk);
    },
  });
  try {
    const out = await open(file, 'wx', 0o600);
    try {
      await pipeline(req, stated, substitutingStream(subs), bounded, out.createWriteStream());
    } finally {
      await out.close().catch(() => {});
    }
    const input = await open(file, 'r');
    await unlink(file);
    headers['content-length'] = String(written);
    const body = input.createReadStream();
    // Sent whole by the time the request is done, or not to be (the file closes with it).
    return { body, release: () => { body.destroy(); release(); } };
  } catch (err) {
    await unlink(file).catch(() => {});
    release();
    throw err;
  }
}
