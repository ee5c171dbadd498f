import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { describe, expect, it } from 'vitest';
import { substituteText, substitutingStream } from '../../src/engine/network/secret-substitution.js';

const A = { placeholder: 'fpsecret_0123456789abcdef0123456789abcdef', value: 'sk-live-A' };
const B = { placeholder: 'fpsecret_fedcba9876543210fedcba987654321f', value: 'a&b c' };

/** The stream's output for `input` cut into chunks at every one of `cuts`. */
async function through(input: string, cuts: number[]): Promise<string> {
  const chunks: Buffer[] = [];
  let at = 0;
  for (const c of [...cuts, input.length]) {
    chunks.push(Buffer.from(input.slice(at, c), 'latin1'));
    at = c;
  }
  return (await buffer(Readable.from(chunks).pipe(substitutingStream([A, B])))).toString('latin1');
}

describe('secret substitution', () => {
  it('in text, with the value encoded for where it goes (a URL\'s query)', () => {
    expect(substituteText(`/v1?key=${B.placeholder}&x=${A.placeholder}`, [A, B], encodeURIComponent)).toBe('/v1?key=a%26b%20c&x=sk-live-A');
    expect(substituteText('nothing here', [A, B])).toBe('nothing here');
  });

  it('in a body, whatever the chunks: a placeholder split anywhere, two in a row, one ending a chunk with a byte that starts another', async () => {
    const body = `{"a":"${A.placeholder}","b":"${B.placeholder}${A.placeholder}"}\u00ff`;
    const want = `{"a":"sk-live-A","b":"a&b csk-live-A"}\u00ff`;
    for (let cut = 0; cut <= body.length; cut++) expect(await through(body, [cut])).toBe(want);
    for (let cut = 1; cut < body.length - 1; cut += 7) expect(await through(body, [cut, cut + 1, cut + 2])).toBe(want);
    // B's placeholder ends in "f", which also starts every placeholder: it is still replaced.
    expect(await through(`x${B.placeholder}`, [B.placeholder.length + 1])).toBe('xa&b c');
    // A prefix left at the very end is passed on as it is.
    expect(await through('tail fpsecret_0123', [5])).toBe('tail fpsecret_0123');
  });
});
