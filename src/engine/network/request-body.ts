import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { substituteText, substitutingStream, type Substitution } from './secret-substitution.js';

/** A body up to this long (by its Content-Length) may be read whole, its placeholders replaced
 * and its length told anew. */
export const BODY_HELD_MAX = 1024 * 1024;
/** Bytes of bodies held whole at once for one sandbox, and for the whole server: 64 connections
 * a sandbox, times many sandboxes, must not hold 1 MiB each in the server's memory. */
export const BODIES_HELD_PER_SANDBOX = 8 * 1024 * 1024;
export const BODIES_HELD_TOTAL = 64 * 1024 * 1024;

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

export interface BodyWithSecrets {
  body: Buffer | Readable;
  /** Gives back what the body took of the budget: call it once the request is done. */
  release: () => void;
}

/**
 * A request body with the placeholders replaced, and `headers`' framing made to match it. One of
 * a stated length that fits the budget is read whole and its Content-Length told anew (some
 * servers refuse chunked uploads); any other (longer, past the budget, or chunked already) has
 * them replaced as it streams, holding at most a placeholder's length, and goes chunked.
 */
export async function bodyWithSecrets(
  id: string,
  req: Readable & { headers: Record<string, string | string[] | undefined> },
  headers: Record<string, string | string[]>,
  subs: Substitution[],
  budget: BodyBudget,
): Promise<BodyWithSecrets> {
  const length = Number(req.headers['content-length']);
  const release = Number.isSafeInteger(length) && length >= 0 && length <= BODY_HELD_MAX ? budget.take(id, length) : undefined;
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
