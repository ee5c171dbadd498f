import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { text } from 'node:stream/consumers';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { packTree, unpackTree } from '../src/engine/pack.js';

// Layers and memory images travel to and from the object store as tar streams (real tar here).
let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'forkpoint-pack-'));
  await mkdir(join(dir, 'src/sub'), { recursive: true });
  await writeFile(join(dir, 'src/sub/file'), 'kept\n');
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function bytesOf(r: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const p of r) parts.push(p as Buffer);
  return Buffer.concat(parts);
}

/** The archive, then more input after a pause: by then tar has seen the end-of-archive mark and
 * gone, as it does when the padding of a download arrives in a later chunk. */
function lateTail(archive: Buffer, tail: Buffer | Error): Readable {
  let sent = false;
  return new Readable({
    read() {
      if (sent) return;
      sent = true;
      this.push(archive);
      setTimeout(() => {
        if (tail instanceof Error) return this.destroy(tail);
        this.push(tail);
        this.push(null);
      }, 300);
    },
  });
}

describe('packing and unpacking trees', () => {
  it('packs the same tree to the same bytes, and unpacks it whole', async () => {
    const one = await bytesOf(packTree(join(dir, 'src')));
    const two = await bytesOf(packTree(join(dir, 'src')));
    expect(one.equals(two)).toBe(true);
    await unpackTree(Readable.from([one]), join(dir, 'dest'));
    expect(await readFile(join(dir, 'dest/sub/file'), 'utf8')).toBe('kept\n');
    expect(existsSync(join(dir, 'dest.incoming'))).toBe(false);
  });

  it('reads the stream to its end after tar has gone (the padding of a download arriving late)', async () => {
    const archive = await bytesOf(packTree(join(dir, 'src')));
    const source = lateTail(archive, Buffer.alloc(20480));
    let ended = false;
    source.on('end', () => (ended = true));
    await unpackTree(source, join(dir, 'dest'));
    expect(await readFile(join(dir, 'dest/sub/file'), 'utf8')).toBe('kept\n');
    // A check at the stream's end (a hash, gzip's CRC) has run before the tree counts.
    expect(ended).toBe(true);
  });

  it('fails with the stream\'s own error when it fails after tar has gone, and keeps nothing', async () => {
    const archive = await bytesOf(packTree(join(dir, 'src')));
    await expect(unpackTree(lateTail(archive, new Error('blob hashes to something else')), join(dir, 'dest'))).rejects.toThrow('blob hashes to something else');
    expect(existsSync(join(dir, 'dest'))).toBe(false);
    expect(existsSync(join(dir, 'dest.incoming'))).toBe(false);
  });

  it('fails, without waiting for input that never comes, when the stream fails half-way', async () => {
    const archive = await bytesOf(packTree(join(dir, 'src')));
    const half = new Readable({
      read() {
        this.push(archive.subarray(0, 512));
        this.destroy(new Error('connection reset'));
      },
    });
    await expect(unpackTree(half, join(dir, 'dest'))).rejects.toThrow('connection reset');
    expect(existsSync(join(dir, 'dest'))).toBe(false);
    expect(existsSync(join(dir, 'dest.incoming'))).toBe(false);
  });

  it('hears a stream that fails before the unpack has started (no unhandled error, no wait)', async () => {
    const early = new Readable({ read() {} });
    process.nextTick(() => early.destroy(new Error('failed at once')));
    await expect(unpackTree(early, join(dir, 'dest'))).rejects.toThrow('failed at once');
    const already = new Readable({ read() {} });
    already.on('error', () => {});
    already.destroy(new Error('failed before'));
    await expect(unpackTree(already, join(dir, 'dest'))).rejects.toThrow('failed before');
    expect(existsSync(join(dir, 'dest.incoming'))).toBe(false);
  });

  it('keeps the failure of a pack read late for its reader (a directory deleted before its upload started ended the server)', async () => {
    const late = packTree(join(dir, 'deleted-meanwhile'));
    await new Promise((r) => setTimeout(r, 300)); // tar has failed by now, and nothing listened
    await expect(text(late)).rejects.toThrow(/tar of .*deleted-meanwhile.* failed/);
  });

  it('refuses what is not a tar', async () => {
    await expect(unpackTree(Readable.from([Buffer.from('not a tar at all'.repeat(100))]), join(dir, 'dest'))).rejects.toThrow(/unpacking into .* failed/);
    expect(existsSync(join(dir, 'dest'))).toBe(false);
  });
});
