import { existsSync, statSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { Images } from '../../src/engine/images.js';

// Set-up's images are linked into a data directory when a sandbox first mounts one, not at
// every first start (2 s for Debian's tree); until then, and after, they read the same.
let root: string;
let seed: string;
let dir: string;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), 'forkpoint-seed-'));
  seed = join(root, 'seed');
  dir = join(root, 'data', 'images');
  await mkdir(join(seed, 'base', 'etc'), { recursive: true });
  await writeFile(join(seed, 'base', 'etc', 'os-release'), 'NAME=base\n');
  await mkdir(join(seed, '.config'), { recursive: true });
  await writeFile(join(seed, '.config', 'base.json'), JSON.stringify({ env: ['A=1'] }));
});

afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe('set-up images, linked in on first use', () => {
  it('are images of the data directory before anything is linked: listed, with their configuration and identity', async () => {
    const images = new Images(dir, seed);
    expect(images.exists('base')).toBe(true);
    expect(images.present('base')).toBe(true);
    expect(images.exists('nothing')).toBe(false);
    expect((await images.list()).map((i) => i.name)).toEqual(['base']);
    expect(images.config('base')?.env).toEqual(['A=1']);
    expect(existsSync(join(dir, 'base'))).toBe(false);
  });

  it('materialize links the tree (hard links, the seed\'s files), keeps the identity, and links once for two callers', async () => {
    const images = new Images(dir, seed);
    const before = images.identity('base');
    await Promise.all([images.materialize('base'), images.materialize('base')]);
    const file = join(dir, 'base', 'etc', 'os-release');
    expect(statSync(file).ino).toBe(statSync(join(seed, 'base', 'etc', 'os-release')).ino);
    expect(images.identity('base')).toBe(before);
    expect(images.config('base')?.env).toEqual(['A=1']);
    expect((await readdir(dir)).filter((n) => n.startsWith('.seed-'))).toEqual([]);
    // A later server on the same data directory reads the linked copy as the same image.
    expect(new Images(dir, seed).identity('base')).toBe(before);
  });

  it('an image of the data directory\'s own is left as it is; an unknown one is nothing to link', async () => {
    await mkdir(join(dir, 'own'), { recursive: true });
    const images = new Images(dir, seed);
    await images.materialize('own');
    await images.materialize('nothing');
    expect(existsSync(join(dir, 'nothing'))).toBe(false);
    expect((await images.list()).map((i) => i.name)).toEqual(['base', 'own']);
  });

  it('a linking cut short is swept at the next start; an unlinked copy is linked anew from the seed', async () => {
    const images = new Images(dir, seed);
    await mkdir(join(dir, '.seed-base-999', 'etc'), { recursive: true });
    await images.sweep();
    expect(await readdir(dir)).toEqual([]);
    await images.materialize('base');
    await images.unlink('base');
    expect(existsSync(join(dir, 'base'))).toBe(false);
    expect(images.exists('base')).toBe(true);
    await images.materialize('base');
    expect(existsSync(join(dir, 'base', 'etc', 'os-release'))).toBe(true);
  });

  it('a seed on another filesystem is copied ahead, in the background, from the start; one on the same filesystem waits to be used', async () => {
    // /dev/shm is a tmpfs, the temporary directory another filesystem (no root needed for either).
    const away = await mkdtemp(join('/dev/shm', 'forkpoint-seed-'));
    try {
      await mkdir(join(away, 'far', 'etc'), { recursive: true });
      await writeFile(join(away, 'far', 'etc', 'os-release'), 'NAME=far\n');
      expect(statSync(away).dev).not.toBe(statSync(root).dev);
      await mkdir(dir, { recursive: true });
      const failures: string[] = [];
      new Images(dir, away).copyAheadAcrossFilesystems((name) => failures.push(name));
      const deadline = Date.now() + 10_000;
      while (!existsSync(join(dir, 'far')) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      expect(existsSync(join(dir, 'far', 'etc', 'os-release'))).toBe(true);
      expect(failures).toEqual([]);
      new Images(dir, seed).copyAheadAcrossFilesystems(() => {});
      await new Promise((r) => setTimeout(r, 200));
      expect(existsSync(join(dir, 'base'))).toBe(false);
    } finally {
      await rm(away, { recursive: true, force: true });
    }
  });
});
