import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { DumpStaging, STAGING_BUDGET_BYTES, STAGING_MAX_DUMP_BYTES } from '../../src/engine/dump-staging.js';

// A memory checkpoint's image is written to a tmpfs during the freeze, then copied to disk.
// /dev/shm is writable by every host user: what the server writes there must be its own.
describe('the staging of memory images', () => {
  const name = `fp-unit-staging-${process.pid}`;
  const root = join('/dev/shm', name);
  let disk: string;
  beforeEach(() => {
    disk = mkdtempSync(join(tmpdir(), 'fp-unit-staging-'));
  });
  afterEach(() => {
    rmSync(root, { recursive: true, force: true });
    rmSync(disk, { recursive: true, force: true });
  });

  it('stages in memory and persists to disk: the files arrive, the staged copy goes, its budget comes back', async () => {
    mkdirSync(root, { mode: 0o700 });
    writeFileSync(join(root, 'left-by-a-killed-server'), 'x');
    const { staging, unusable } = await DumpStaging.open('/dev/shm', name);
    expect(unusable).toBeUndefined();
    expect(readdirSync(root)).toEqual([]); // what a killed server left is swept
    const a = (await staging.stage('ckpt_a', 200 * 2 ** 20))!;
    const b = (await staging.stage('ckpt_b', 200 * 2 ** 20))!;
    expect(a.dir.startsWith(root)).toBe(true);
    expect(await staging.stage('ckpt_c', 200 * 2 ** 20)).toBeUndefined(); // past the budget: to disk
    expect(await staging.stage('ckpt_d', STAGING_MAX_DUMP_BYTES + 1)).toBeUndefined(); // too big for memory
    writeFileSync(join(a.dir, 'pages-1.img'), 'pages');
    writeFileSync(join(a.dir, 'core-1.img'), 'core');
    await a.persist(disk);
    expect(readdirSync(disk).sort()).toEqual(['core-1.img', 'pages-1.img']);
    expect(readFileSync(join(disk, 'pages-1.img'), 'utf8')).toBe('pages');
    expect(existsSync(a.dir)).toBe(false);
    await b.discard();
    expect(existsSync(b.dir)).toBe(false);
    // Both reservations are back: the whole budget can be staged again.
    const again = [await staging.stage('ckpt_e', STAGING_BUDGET_BYTES / 2), await staging.stage('ckpt_f', STAGING_BUDGET_BYTES / 2)];
    expect(again.every(Boolean)).toBe(true);
    await staging.close();
    expect(existsSync(root)).toBe(false);
  });

  it('attack: a directory made ahead by someone else (open to all, or a link elsewhere) is not used, and what it points to is untouched', async () => {
    mkdirSync(root, { mode: 0o777 });
    chmodSync(root, 0o777);
    writeFileSync(join(root, 'theirs'), 'x');
    const open = await DumpStaging.open('/dev/shm', name);
    expect(open.unusable).toMatch(/not a directory of this server's alone/);
    expect(await open.staging.stage('ckpt_a', 1024)).toBeUndefined();
    expect(readdirSync(root)).toEqual(['theirs']);
    rmSync(root, { recursive: true });

    symlinkSync(disk, root);
    writeFileSync(join(disk, 'precious'), 'x');
    const linked = await DumpStaging.open('/dev/shm', name);
    expect(linked.unusable).toMatch(/not a directory of this server's alone/);
    expect(await linked.staging.stage('ckpt_a', 1024)).toBeUndefined();
    expect(readdirSync(disk)).toEqual(['precious']);
  });

  it('an incremental dump is staged by what it is expected to write, where the tmpfs has room for all it could', async () => {
    const { staging } = await DumpStaging.open('/dev/shm', name);
    // 1 GiB of memory, 200 MiB expected: staged, and only the expectation counts against the budget.
    const a = (await staging.stage('ckpt_a', 200 * 2 ** 20, 2 ** 30))!;
    expect(a).toBeDefined();
    const b = (await staging.stage('ckpt_b', 200 * 2 ** 20, 2 ** 30))!;
    expect(b).toBeDefined();
    expect(await staging.stage('ckpt_c', 200 * 2 ** 20)).toBeUndefined(); // past the budget
    await Promise.all([a.discard(), b.discard()]);
    // No tmpfs holds what the dump could write: to disk, however little it is expected to write.
    expect(await staging.stage('ckpt_d', 1024, 2 ** 50)).toBeUndefined();
    await staging.close();
  });

  it('is not used where the directory is not a tmpfs (the disk is no faster than the disk)', async () => {
    const { staging, unusable } = await DumpStaging.open(disk, name);
    expect(unusable).toMatch(/not a tmpfs/);
    expect(await staging.stage('ckpt_a', 1024)).toBeUndefined();
  });
});
