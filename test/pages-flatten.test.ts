/**
 * `fp-agent pages-flatten DIR PARENT` (native/pages_flatten.c): an incremental CRIU memory image
 * made whole with its parent's pages, as the engine does after an incremental checkpoint's thaw.
 * The images are CRIU's, but what they describe (addresses, lengths) is a sandbox's: a pagemap
 * that claims more than its pages file holds, a page left to a parent that lacks it, or bytes that
 * are not a pagemap are refused with a message, and the image is left as it was.
 */
import { execa } from 'execa';
import { mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';

const AGENT = loadConfig({ env: {} }).agentPath;
const PAGE = 4096;
const PE_PARENT = 1;
const PE_LAZY = 2;
const PE_PRESENT = 4;

function varint(n: bigint): number[] {
  const out: number[] = [];
  do {
    let b = Number(n & 0x7fn);
    n >>= 7n;
    if (n > 0n) b |= 0x80;
    out.push(b);
  } while (n > 0n);
  return out;
}

function message(fields: [number, bigint][]): Buffer {
  const body = Buffer.from(fields.flatMap(([f, v]) => [f << 3, ...varint(v)]));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(body.length);
  return Buffer.concat([len, body]);
}

/** A pagemap image as CRIU writes it: magics, a head, entries {vaddr, 0, flags, nr_pages}. */
function pagemap(pagesId: number, entries: { vaddr: number; nr: number; flags: number }[]): Buffer {
  const magic = Buffer.alloc(8);
  magic.writeUInt32LE(0x54564319, 0);
  magic.writeUInt32LE(0x56084025, 4);
  return Buffer.concat([magic, message([[1, BigInt(pagesId)]]), ...entries.map((e) => message([[1, BigInt(e.vaddr)], [2, 0n], [4, BigInt(e.flags)], [5, BigInt(e.nr)]]))]);
}

/** Pages whose every byte is `fill`, one value a page. */
const pages = (...fill: number[]) => Buffer.concat(fill.map((f) => Buffer.alloc(PAGE, f)));

/** The entries of a pagemap image (what the engine's restore would read). */
function entriesOf(img: Buffer): { vaddr: number; nr: number; flags: number }[] {
  const out: { vaddr: number; nr: number; flags: number }[] = [];
  let at = 8;
  let head = true;
  while (at < img.length) {
    const len = img.readUInt32LE(at);
    const body = img.subarray(at + 4, at + 4 + len);
    at += 4 + len;
    if (head) {
      head = false;
      continue;
    }
    const v: Record<number, number> = {};
    let i = 0;
    while (i < body.length) {
      const key = body[i++]! >> 3;
      let n = 0n;
      let shift = 0n;
      for (;;) {
        const b = body[i++]!;
        n |= BigInt(b & 0x7f) << shift;
        shift += 7n;
        if (!(b & 0x80)) break;
      }
      v[key] = Number(n);
    }
    out.push({ vaddr: v[1]!, nr: v[5]!, flags: v[4]! });
  }
  return out;
}

let dir: string;
let child: string;
let parent: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'forkpoint-flatten-'));
  child = join(dir, 'child');
  parent = join(dir, 'parent');
  await execa('mkdir', [child, parent]);
  // The parent: whole. Two runs of pages, at 0x10000 (3 pages: 1, 2, 3) and 0x20000 (2: 4, 5).
  await writeFile(join(parent, 'pagemap-1.img'), pagemap(7, [{ vaddr: 0x10000, nr: 3, flags: PE_PRESENT | PE_LAZY }, { vaddr: 0x20000, nr: 2, flags: PE_PRESENT }]));
  await writeFile(join(parent, 'pages-7.img'), pages(1, 2, 3, 4, 5));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const flatten = () => execa(AGENT, ['pages-flatten', child, parent], { reject: false });

describe('fp-agent pages-flatten', () => {
  it('copies in the pages the image leaves to its parent, in address order, and removes the parent link', async () => {
    // The child wrote page 0x11000 (9) and a page of its own at 0x30000 (8); the rest is the parent's.
    await writeFile(join(child, 'pagemap-1.img'), pagemap(3, [
      { vaddr: 0x10000, nr: 1, flags: PE_PARENT },
      { vaddr: 0x11000, nr: 1, flags: PE_PRESENT },
      { vaddr: 0x12000, nr: 1, flags: PE_PARENT },
      { vaddr: 0x20000, nr: 2, flags: PE_PARENT },
      { vaddr: 0x30000, nr: 1, flags: PE_PRESENT },
    ]));
    await writeFile(join(child, 'pages-3.img'), pages(9, 8));
    await symlink(parent, join(child, 'parent'));
    // A pagemap with nothing in the parent is left as it is.
    const own = pagemap(4, [{ vaddr: 0x40000, nr: 1, flags: PE_PRESENT }]);
    await writeFile(join(child, 'pagemap-2.img'), own);
    await writeFile(join(child, 'pages-4.img'), pages(6));

    const r = await flatten();
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stderr).toContain('flattened 1 4');
    expect(entriesOf(await readFile(join(child, 'pagemap-1.img')))).toEqual([
      { vaddr: 0x10000, nr: 1, flags: PE_PRESENT | PE_LAZY },
      { vaddr: 0x11000, nr: 1, flags: PE_PRESENT },
      { vaddr: 0x12000, nr: 1, flags: PE_PRESENT | PE_LAZY },
      { vaddr: 0x20000, nr: 2, flags: PE_PRESENT },
      { vaddr: 0x30000, nr: 1, flags: PE_PRESENT },
    ]);
    expect((await readFile(join(child, 'pages-3.img'))).equals(pages(1, 9, 3, 4, 5, 8))).toBe(true);
    expect((await readFile(join(child, 'pagemap-2.img'))).equals(own)).toBe(true);
    expect((await readdir(child)).sort()).toEqual(['pagemap-1.img', 'pagemap-2.img', 'pages-3.img', 'pages-4.img']);
  });

  const untouched = async (map: Buffer, data: Buffer) => {
    expect((await readFile(join(child, 'pagemap-1.img'))).equals(map)).toBe(true);
    expect((await readFile(join(child, 'pages-3.img'))).equals(data)).toBe(true);
    expect((await readdir(child)).filter((n) => n.startsWith('.flat-'))).toEqual([]);
  };

  it('refuses a page left to a parent that does not hold it', async () => {
    const map = pagemap(3, [{ vaddr: 0x13000, nr: 1, flags: PE_PARENT }]);
    const data = Buffer.alloc(0);
    await writeFile(join(child, 'pagemap-1.img'), map);
    await writeFile(join(child, 'pages-3.img'), data);
    const r = await flatten();
    expect(r.exitCode).toBe(1);
    expect(r.stderr).toContain("not in the parent's");
    await untouched(map, data);
  });

  it('refuses a pagemap that claims more pages than its file holds', async () => {
    const map = pagemap(3, [{ vaddr: 0x10000, nr: 1, flags: PE_PARENT }, { vaddr: 0x30000, nr: 4, flags: PE_PRESENT }]);
    const data = pages(8);
    await writeFile(join(child, 'pagemap-1.img'), map);
    await writeFile(join(child, 'pages-3.img'), data);
    const r = await flatten();
    expect(r.exitCode).toBe(1);
    await untouched(map, data);
  });

  it('refuses what is not a pagemap: a bad magic, a length past the end, entries out of order, a page count that overflows', async () => {
    const data = pages(8);
    await writeFile(join(child, 'pages-3.img'), data);
    const good = pagemap(3, [{ vaddr: 0x10000, nr: 1, flags: PE_PARENT }]);
    const badMagic = Buffer.from(good);
    badMagic.writeUInt32LE(0xdeadbeef, 4);
    const pastEnd = Buffer.concat([good, Buffer.from([0xff, 0xff, 0, 0, 8])]);
    const unordered = pagemap(3, [{ vaddr: 0x20000, nr: 1, flags: PE_PARENT }, { vaddr: 0x10000, nr: 1, flags: PE_PARENT }]);
    const overflow = pagemap(3, [{ vaddr: 0x10000, nr: 2 ** 40, flags: PE_PARENT }]);
    for (const map of [badMagic, pastEnd, unordered, overflow]) {
      await writeFile(join(child, 'pagemap-1.img'), map);
      const r = await flatten();
      expect(r.exitCode, r.stderr).toBe(1);
      expect(r.stderr).toContain('not a pagemap image forkpoint can read');
      await untouched(map, data);
    }
  });
});
