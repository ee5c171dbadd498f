import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { forgetLazyTransfer, lazyPagesFiles, lazyTransferLeftBehind, recordLazyTree } from '../../src/engine/lazy-pages.js';

/** This process as a shim or a tree the record names: alive, with its start time. */
const self = () => ({ pid: process.pid, startTime: readFileSync('/proc/self/stat', 'utf8').replace(/^.*\) /, '').split(' ')[19]! });
const gone = { pid: 2 ** 22 + 17, startTime: '1' }; // past pid_max here: no such process
const tree = { pid: 4242, startTime: '99' };

// What a server finds of a lazy transfer a server before it started (lazy-pages.ts): the record
// in the instance's run directory and the exit file its shim writes. Only the engine writes
// there, but what it finds may be an earlier transfer's, or cut short.
describe('a lazy transfer left behind', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'fp-unit-lazy-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  const record = (exitFile: string, shim: { pid: number; startTime: string }, withTree = true) =>
    writeFileSync(join(dir, 'lazy-pages.json'), JSON.stringify({ shim, exit: basename(exitFile), ...(withTree ? { tree } : {}) }));

  it('is under way while its shim lives, ended with its code after, and failed when the shim left none', async () => {
    const files = lazyPagesFiles(dir);
    record(files.exit, self());
    expect((await lazyTransferLeftBehind(dir, tree)).state).toBe('running');
    record(files.exit, gone);
    expect(await lazyTransferLeftBehind(dir, tree)).toMatchObject({ state: 'ended', ok: false });
    writeFileSync(files.exit, '0\n');
    expect(await lazyTransferLeftBehind(dir, tree)).toMatchObject({ state: 'ended', ok: true });
    writeFileSync(files.exit, '137\n');
    expect(await lazyTransferLeftBehind(dir, tree)).toMatchObject({ state: 'ended', ok: false });
  });

  it('is another tree\'s when the record names one; a record without its tree is the adopted one\'s', async () => {
    const files = lazyPagesFiles(dir);
    record(files.exit, gone);
    expect((await lazyTransferLeftBehind(dir, { pid: tree.pid, startTime: '100' })).state).toBe('none');
    record(files.exit, gone, false);
    expect((await lazyTransferLeftBehind(dir, { pid: 1, startTime: '1' })).state).toBe('ended');
    recordLazyTree(dir, tree);
    expect((await lazyTransferLeftBehind(dir, { pid: 1, startTime: '1' })).state).toBe('none');
  });

  it('a torn or foreign record, or an exit file named outside the pattern, is no transfer', async () => {
    writeFileSync(join(dir, 'lazy-pages.json'), '{"shim":');
    expect((await lazyTransferLeftBehind(dir, tree)).state).toBe('none');
    writeFileSync(join(dir, 'lazy-pages.json'), JSON.stringify({ shim: gone, exit: '../../etc/passwd', tree }));
    expect((await lazyTransferLeftBehind(dir, tree)).state).toBe('none');
  });

  it('a transfer done forgets only itself once a later one is recorded (a rollback\'s), and everything when it is the last', () => {
    const older = lazyPagesFiles(dir);
    writeFileSync(older.exit, '0\n');
    const newer = { ...lazyPagesFiles(dir) };
    expect(readdirSync(dir)).toEqual([]); // a new transfer starts with nothing of an earlier one
    writeFileSync(older.exit, '0\n'); // the older daemon ended late
    record(newer.exit, self());
    forgetLazyTransfer(dir, older.exit);
    expect(readdirSync(dir)).toEqual(['lazy-pages.json']);
    writeFileSync(newer.exit, '0\n');
    forgetLazyTransfer(dir, newer.exit);
    expect(readdirSync(dir)).toEqual([]);
  });
});
