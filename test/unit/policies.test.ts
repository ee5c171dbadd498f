import { untilDeadline } from '../../src/lib/deadline.js';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { pack } from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Backoff, backoffDelay } from '../../src/lib/backoff.js';
import { ArchiveRefusedError, checkArchive, type ArchiveBounds } from '../../src/lib/archive-bounds.js';
import { addressesIn, checkAgainstHost, checkOwnerQuota, ownerQuotaOf, OwnerQuotaError } from '../../src/core/quotas.js';
import { allowed, TRANSITIONS } from '../../src/core/lifecycle.js';
import { parseHostPortRange } from '../../src/core/ports.js';

// The core's policies as plain functions: no root, no engine, no store.
let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'fp-unit-'));
});
afterAll(async () => rm(dir, { recursive: true, force: true }));

describe('owner quotas', () => {
  const host = { memoryMb: 8192, cpuPercent: 400, diskMb: 100_000 };
  const limits = { memoryMb: 1024, pids: 512, cpuPercent: 100, diskMb: null };
  const none = { instances: 0, memoryMb: 0, cpuPercent: 0, diskMb: 0, addresses: 0 };

  it('defaults from the host: memory 8x, CPU 128x, half the subnet', () => {
    expect(ownerQuotaOf({ ownerMaxInstances: 256, ownerMaxDiskMb: 0, networkCidr: '10.0.0.0/24' }, host)).toEqual({ instances: 256, memoryMb: 65536, cpuPercent: 51200, diskMb: 0, addresses: 126 });
    expect(addressesIn('10.0.0.0/28')).toBe(13);
  });

  it('refuses the instance that would pass a bound, with the bound as its reason; 0 is no bound', () => {
    const q = { instances: 2, memoryMb: 2048, cpuPercent: 150, diskMb: 0, addresses: 1 };
    expect(() => checkOwnerQuota(q, none, limits, 1, true)).not.toThrow();
    const reason = (used: Partial<typeof none>, count = 1, address = true) => {
      try {
        checkOwnerQuota(q, { ...none, ...used }, limits, count, address);
        return undefined;
      } catch (err) {
        expect(err).toBeInstanceOf(OwnerQuotaError);
        return (err as OwnerQuotaError).details as { reason: string };
      }
    };
    expect(reason({ instances: 2 })?.reason).toBe('INSTANCES_PER_OWNER');
    expect(reason({ memoryMb: 1025 })?.reason).toBe('MEMORY_PER_OWNER');
    expect(reason({ cpuPercent: 51 })?.reason).toBe('CPU_PER_OWNER');
    expect(reason({ addresses: 1 })?.reason).toBe('ADDRESSES_PER_OWNER');
    expect(reason({ addresses: 1 }, 1, false)).toBeUndefined(); // no network, no address
    expect(reason({}, 2)?.reason).toBe('CPU_PER_OWNER'); // a fork of two asks twice the limits
  });

  it('refuses limits beyond the host whatever the quota', () => {
    expect(() => checkAgainstHost({ ...limits, memoryMb: 8193 }, host)).toThrow(/more than this host has/);
    expect(() => checkAgainstHost({ ...limits, cpuPercent: 401 }, host)).toThrow(/cpu_percent/);
    expect(() => checkAgainstHost(limits, host)).not.toThrow();
  });
});

describe('the lifecycle table', () => {
  it('every state but lost can be stopped or failed; only hibernated wakes; only running hibernates', () => {
    for (const s of ['starting', 'running', 'hibernated', 'stopped', 'error'] as const) {
      expect(allowed('stop', s), s).toBe(true);
      expect(allowed('fail', s), s).toBe(true);
      expect(allowed('wake', s), s).toBe(s === 'hibernated');
      expect(allowed('hibernate', s), s).toBe(s === 'running');
    }
    for (const t of Object.keys(TRANSITIONS) as (keyof typeof TRANSITIONS)[]) expect(allowed(t, 'lost'), t).toBe(false);
  });
});

describe('backoff', () => {
  it('doubles from the first delay to the last, with at most a tenth of jitter', () => {
    const p = { firstMs: 100, lastMs: 1000 };
    expect([1, 2, 3, 4, 5, 9].map((n) => backoffDelay(p, n, () => 0))).toEqual([100, 200, 400, 800, 1000, 1000]);
    expect(backoffDelay(p, 1, () => 0.999)).toBeLessThanOrEqual(110);
    const b = new Backoff<string>(p);
    expect(b.ready('x', 0)).toBe(true);
    expect(b.failed('x', 0).failures).toBe(1);
    expect(b.ready('x', 50)).toBe(false);
    expect(b.ready('x', 200)).toBe(true);
    b.succeeded('x');
    expect(b.ready('x', 0)).toBe(true);
  });
});

describe('host ports', () => {
  it('a range reads as its first and last port', () => {
    expect(parseHostPortRange('30000-32767')).toEqual({ first: 30000, last: 32767 });
  });
});

describe('archive bounds', () => {
  const bounds: ArchiveBounds = { maxBytes: 64 * 1024, maxEntries: 10, types: ['file', 'directory', 'symlink', 'link'] };
  const tar = async (name: string, entries: { name: string; size?: number; type?: 'file' | 'character-device'; pax?: Record<string, string> }[], gzip = false) => {
    const p = pack();
    for (const e of entries) p.entry({ name: e.name, type: e.type ?? 'file', size: e.type === 'character-device' ? 0 : (e.size ?? 0), ...(e.pax ? { pax: e.pax } : {}) }, Buffer.alloc(e.type === 'character-device' ? 0 : (e.size ?? 0)));
    p.finalize();
    const chunks: Buffer[] = [];
    for await (const c of p) chunks.push(Buffer.from(c as Uint8Array));
    const file = join(dir, name);
    await writeFile(file, gzip ? gzipSync(Buffer.concat(chunks), { level: 9 }) : Buffer.concat(chunks));
    return file;
  };
  const refusal = (p: Promise<unknown>) => p.then(() => undefined, (err: unknown) => (err instanceof ArchiveRefusedError ? err.reason : String(err)));

  it('counts what an archive unpacks to, decompressed, and refuses past the bounds', async () => {
    expect(await checkArchive(await tar('ok.tar', [{ name: 'a', size: 100 }]), bounds)).toEqual({ bytes: 2048, entries: 1 });
    expect(await refusal(checkArchive(await tar('bomb.tgz', [{ name: 'zeros', size: 1 << 20 }], true), bounds))).toBe('UNPACKED_TOO_LARGE');
    expect(await refusal(checkArchive(await tar('many.tar', Array.from({ length: 11 }, (_, i) => ({ name: `f${i}` }))), bounds))).toBe('TOO_MANY_ENTRIES');
    expect(await refusal(checkArchive(await tar('dev.tar', [{ name: 'null', type: 'character-device' }]), bounds))).toBe('MEMBER_TYPE');
    expect(await refusal(checkArchive(await tar('sparse.tar', [{ name: 'big', size: 10, pax: { 'GNU.sparse.realsize': String(1 << 40) } }]), bounds))).toBe('SPARSE_MEMBER');
    const junk = join(dir, 'junk.tar');
    await writeFile(junk, Buffer.alloc(1000, 7));
    expect(await refusal(checkArchive(junk, bounds))).toBe('NOT_AN_ARCHIVE');
  });
});

describe('deadlines (untilDeadline, the one way a wait is bounded)', () => {
  it('settles as the work does when it comes first, and as the late answer otherwise', async () => {
    expect(await untilDeadline(Promise.resolve('done'), 1000, () => 'late')).toBe('done');
    await expect(untilDeadline(Promise.reject(new Error('work failed')), 1000, () => 'late')).rejects.toThrow('work failed');
    expect(await untilDeadline(new Promise(() => {}), 10, () => 'late')).toBe('late');
    await expect(untilDeadline(new Promise(() => {}), 10, () => {
      throw new Error('too slow');
    })).rejects.toThrow('too slow');
  });

  it('its timer does not fire once the work has settled', async () => {
    let fired = false;
    await untilDeadline(Promise.resolve(1), 20, () => {
      fired = true;
    });
    await new Promise((r) => setTimeout(r, 50));
    expect(fired).toBe(false);
  });
});
