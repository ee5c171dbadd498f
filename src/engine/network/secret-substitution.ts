import { Transform } from 'node:stream';

/** A placeholder and the value that goes out in its place. */
export interface Substitution {
  placeholder: string;
  value: string;
}

/** Every placeholder in `text` replaced by its value (`encode` applied to the value). */
export function substituteText(text: string, subs: Substitution[], encode: (value: string) => string = (v) => v): string {
  let out = text;
  for (const s of subs) if (out.includes(s.placeholder)) out = out.split(s.placeholder).join(encode(s.value));
  return out;
}

/**
 * A body's bytes with every placeholder replaced, as they stream: a placeholder split across
 * chunks is held back until it is whole (at most a placeholder's length, less one byte). Bytes
 * are read as latin1, one character each, so that nothing but the placeholders changes, whatever
 * the encoding; the values are printable ASCII.
 */
export function substitutingStream(subs: Substitution[]): Transform {
  const longest = Math.max(0, ...subs.map((s) => s.placeholder.length));
  let held = '';
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      const text = held + chunk.toString('latin1');
      let out = '';
      let at = 0;
      for (let next = firstPlaceholder(text, at, subs); next; next = firstPlaceholder(text, at, subs)) {
        out += text.slice(at, next.index) + next.sub.value;
        at = next.index + next.sub.placeholder.length;
      }
      // What is left holds no whole placeholder; its end may be the start of one.
      const rest = text.slice(at);
      const keep = partialAtEnd(rest, subs, longest);
      held = rest.slice(rest.length - keep);
      done(null, Buffer.from(out + rest.slice(0, rest.length - keep), 'latin1'));
    },
    flush(done) {
      done(null, Buffer.from(held, 'latin1'));
    },
  });
}

function firstPlaceholder(text: string, from: number, subs: Substitution[]): { index: number; sub: Substitution } | undefined {
  let first: { index: number; sub: Substitution } | undefined;
  for (const sub of subs) {
    const index = text.indexOf(sub.placeholder, from);
    if (index >= 0 && (!first || index < first.index)) first = { index, sub };
  }
  return first;
}

/** How many characters at the end of `text` (which holds no whole placeholder) may be the start
 * of one that the next chunk completes. */
function partialAtEnd(text: string, subs: Substitution[], longest: number): number {
  for (let n = Math.min(longest - 1, text.length); n > 0; n--) {
    const tail = text.slice(text.length - n);
    if (subs.some((s) => s.placeholder.length > n && s.placeholder.startsWith(tail))) return n;
  }
  return 0;
}
