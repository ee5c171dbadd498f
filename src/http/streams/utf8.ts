import { isUtf8 } from 'node:buffer';

export interface TextPiece {
  /** Offset of the piece's first byte in its stream. */
  offset: number;
  data: string;
  encoding: 'utf8' | 'base64';
}

/** How many bytes a UTF-8 sequence with this lead byte has (0: not a lead byte). */
function sequenceLength(lead: number): number {
  if (lead >= 0xc2 && lead <= 0xdf) return 2;
  if (lead >= 0xe0 && lead <= 0xef) return 3;
  if (lead >= 0xf0 && lead <= 0xf4) return 4;
  return 0;
}

/**
 * Cuts a byte stream into pieces that are text where the bytes are valid UTF-8 and base64
 * where they are not. A character split across chunks is held back (at most 3 bytes) until
 * the rest of it comes, so that valid text never turns into base64 because of where a read
 * happened to end.
 */
export class Utf8Pieces {
  private held: Buffer = Buffer.alloc(0);

  constructor(private next: number) {}

  /** Bytes of the stream emitted so far (the offset the next piece starts at). */
  get emitted(): number {
    return this.next;
  }

  push(offset: number, data: Buffer): TextPiece[] {
    // A gap (output that fell out of the scrollback) drops what was held.
    if (offset !== this.next + this.held.length) {
      this.held = Buffer.alloc(0);
      this.next = offset;
    }
    const buf = this.held.length ? Buffer.concat([this.held, data]) : data;
    this.held = Buffer.alloc(0);
    if (isUtf8(buf)) return [this.take(buf, 'utf8')];
    const cut = incompleteTail(buf);
    if (cut > 0 && isUtf8(buf.subarray(0, buf.length - cut))) {
      this.held = Buffer.from(buf.subarray(buf.length - cut));
      return buf.length > cut ? [this.take(buf.subarray(0, buf.length - cut), 'utf8')] : [];
    }
    return [this.take(buf, 'base64')];
  }

  /** What is still held, at the end of the stream: an incomplete character, as base64. */
  flush(): TextPiece[] {
    if (!this.held.length) return [];
    const piece = this.take(this.held, 'base64');
    this.held = Buffer.alloc(0);
    return [piece];
  }

  private take(bytes: Buffer, encoding: 'utf8' | 'base64'): TextPiece {
    const piece = { offset: this.next, data: bytes.toString(encoding), encoding };
    this.next += bytes.length;
    return piece;
  }
}

/** The length of an incomplete UTF-8 sequence at the end of `buf` (0 if there is none). */
function incompleteTail(buf: Buffer): number {
  for (let back = 1; back <= 3 && back <= buf.length; back++) {
    const b = buf[buf.length - back]!;
    if ((b & 0xc0) === 0x80) continue; // a continuation byte: look further back
    const need = sequenceLength(b);
    return need > back ? back : 0;
  }
  return 0;
}
