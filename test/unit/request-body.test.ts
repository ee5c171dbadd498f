import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { BODY_HELD_MAX, BodyBudget, bodyWithSecrets, type BodySpool } from '../../src/engine/network/request-body.js';

const A = { placeholder: 'fpsecret_0123456789abcdef0123456789abcdef', value: 'sk-live-A' };

/** A request as the proxy's HTTP server hands it: a body and its headers. */
function requestOf(body: string, headers: Record<string, string> = { 'content-length': String(Buffer.byteLength(body)) }) {
  return Object.assign(Readable.from([Buffer.from(body)]), { headers });
}

const text = async (body: Buffer | Readable) => (Buffer.isBuffer(body) ? body : await buffer(body)).toString();

describe('request bodies through the egress proxy', () => {
  it('a body of a stated length within the budget is held whole and its length told anew; the budget comes back', async () => {
    const budget = new BodyBudget(1000, 1000);
    const headers: Record<string, string> = { 'content-length': '999' };
    const out = await bodyWithSecrets('a', requestOf(`{"key":"${A.placeholder}"}`), headers, [A], budget);
    expect(Buffer.isBuffer(out.body)).toBe(true);
    expect(await text(out.body)).toBe('{"key":"sk-live-A"}');
    expect(headers['content-length']).toBe(String('{"key":"sk-live-A"}'.length));
    expect(budget.holding('a')).toBeGreaterThan(0);
    out.release();
    out.release();
    expect([budget.holding('a'), budget.holding()]).toEqual([0, 0]);
  });

  it('past a sandbox\'s budget or the server\'s, a body streams (chunked) with its placeholders still replaced', async () => {
    const budget = new BodyBudget(100, 150);
    const hold = budget.take('a', 90)!;
    const body = `x=${A.placeholder}`;
    const headers: Record<string, string> = { 'content-length': String(body.length) };
    const mine = await bodyWithSecrets('a', requestOf(body), headers, [A], budget);
    expect(Buffer.isBuffer(mine.body)).toBe(false);
    expect(headers['content-length']).toBeUndefined();
    expect(await text(mine.body)).toBe('x=sk-live-A');
    // Another sandbox has room of its own, but the server's bound is near: it streams as well.
    budget.take('b', 55);
    const theirs = await bodyWithSecrets('c', requestOf(body), {}, [A], budget);
    expect(Buffer.isBuffer(theirs.body)).toBe(false);
    hold();
    const again = await bodyWithSecrets('a', requestOf(body), {}, [A], budget);
    expect(Buffer.isBuffer(again.body)).toBe(true);
  });

  it('a body longer than the held maximum streams with its placeholders replaced (it went as it was)', async () => {
    const body = 'y'.repeat(BODY_HELD_MAX) + A.placeholder;
    const headers: Record<string, string> = { 'content-length': String(body.length) };
    const out = await bodyWithSecrets('a', requestOf(body), headers, [A], new BodyBudget());
    expect(Buffer.isBuffer(out.body)).toBe(false);
    expect(headers['content-length']).toBeUndefined();
    expect((await text(out.body)).endsWith('ysk-live-A')).toBe(true);
  });

  it('a body that runs past its Content-Length is refused and gives its budget back', async () => {
    const budget = new BodyBudget();
    await expect(bodyWithSecrets('a', requestOf('0123456789', { 'content-length': '4' }), {}, [A], budget)).rejects.toThrow(/longer than its Content-Length/);
    expect(budget.holding()).toBe(0);
  });

  describe('past what is held in memory, a body of a stated length is spooled to disk and keeps a stated length', () => {
    let dir: string;
    beforeEach(() => {
      dir = mkdtempSync(join(tmpdir(), 'fp-unit-spool-'));
    });
    afterEach(() => rmSync(dir, { recursive: true, force: true }));
    const spoolOf = (perSandbox: number, total: number): BodySpool => ({ dir, budget: new BodyBudget(perSandbox, total) });

    it('its placeholders replaced, its new length told, nothing of it left on disk, its budget back once done', async () => {
      const spool = spoolOf(4 * 1024 * 1024, 8 * 1024 * 1024);
      const body = 'y'.repeat(BODY_HELD_MAX) + A.placeholder + 'z'.repeat(1000) + A.placeholder;
      const headers: Record<string, string> = { 'content-length': String(body.length) };
      const out = await bodyWithSecrets('a', requestOf(body), headers, [A], new BodyBudget(), spool);
      expect(Buffer.isBuffer(out.body)).toBe(false);
      const expected = 'y'.repeat(BODY_HELD_MAX) + A.value + 'z'.repeat(1000) + A.value;
      expect(headers['content-length']).toBe(String(expected.length));
      expect(readdirSync(dir)).toEqual([]); // unlinked once open for reading
      expect(spool.budget.holding('a')).toBe(body.length);
      expect(await text(out.body)).toBe(expected);
      out.release();
      expect(spool.budget.holding()).toBe(0);
    });

    it('attack: placeholders that grow past the sandbox\'s spool budget are refused; nothing is left, the budget comes back', async () => {
      const LONG = { placeholder: 'fpsecret_ffffffffffffffffffffffffffffffff', value: 'v'.repeat(4096) };
      const spool = spoolOf(3 * 1024 * 1024, 8 * 1024 * 1024);
      // 1.5 MiB of placeholders: each becomes 4 KiB, ~150 MiB in all.
      const body = LONG.placeholder.repeat(Math.ceil((1.5 * 1024 * 1024) / LONG.placeholder.length));
      await expect(bodyWithSecrets('a', requestOf(body), { 'content-length': String(body.length) }, [LONG], new BodyBudget(), spool)).rejects.toThrow(/past what the proxy may keep/);
      expect(readdirSync(dir)).toEqual([]);
      expect(spool.budget.holding()).toBe(0);
    });

    it('a body that runs past its Content-Length is refused, nothing left; past the spool\'s own budget a body streams chunked', async () => {
      const spool = spoolOf(2 * 1024 * 1024, 8 * 1024 * 1024);
      const body = 'y'.repeat(BODY_HELD_MAX + 10);
      await expect(bodyWithSecrets('a', requestOf(body + 'more', { 'content-length': String(body.length) }), {}, [A], new BodyBudget(), spool)).rejects.toThrow(/longer than its Content-Length/);
      expect([readdirSync(dir), spool.budget.holding()]).toEqual([[], 0]);
      const hold = spool.budget.take('a', 1024 * 1024)!;
      const headers: Record<string, string> = { 'content-length': String(body.length) };
      const out = await bodyWithSecrets('a', requestOf(body), headers, [A], new BodyBudget(), spool);
      expect(headers['content-length']).toBeUndefined();
      expect((await text(out.body)).length).toBe(body.length);
      hold();
    });
  });
});
