import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { Criu } from '../../src/engine/criu.js';

// `/healthz` answers anyone, with CRIU's version in it: asking a binary that has not changed
// must not start a process each time (a flood of probes would be a flood of processes).
describe('CRIU\'s version', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'fp-unit-criu-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  /** A stand-in for criu that counts how often it is run. */
  const fakeCriu = (version: string) => {
    const bin = join(dir, 'criu');
    writeFileSync(bin, `#!/bin/sh\necho run >> ${join(dir, 'runs')}\necho "Version: ${version}"\n`);
    chmodSync(bin, 0o755);
    return bin;
  };
  const runs = () => readFileSync(join(dir, 'runs'), 'utf8').split('\n').filter(Boolean).length;

  it('is asked of the binary once, and again only once the binary is another', async () => {
    const criu = new Criu(fakeCriu('4.2.1'), dir);
    for (let i = 0; i < 5; i++) expect(await criu.version()).toEqual({ version: '4.2.1', ok: true });
    expect(runs()).toBe(1);
    await new Promise((r) => setTimeout(r, 20)); // a later mtime
    fakeCriu('4.1');
    expect(await criu.version()).toEqual({ version: '4.1', ok: false });
    expect(await criu.version()).toEqual({ version: '4.1', ok: false });
    expect(runs()).toBe(2);
  });

  it('a binary that is not there has no version, and is asked again', async () => {
    const criu = new Criu(join(dir, 'nothing'), dir);
    expect(await criu.version()).toBeUndefined();
    expect(await criu.version()).toBeUndefined();
  });
});
