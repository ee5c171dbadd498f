import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { availableParallelism, totalmem } from 'node:os';
import { startServer, type TestServer } from './helpers/server.js';

// An owner at its quota while another creates: the shared pools are every tenant's.
/** What one instance may ask of this host's CPUs. */
const HOST_CPU = availableParallelism() * 100;
let s: TestServer;
beforeAll(async () => {
  s = await startServer({ ownerMaxInstances: 3, ownerMaxMemoryMb: 1024, ownerMaxCpuPercent: HOST_CPU + 10, defaultMemoryMb: 256, defaultCpuPercent: 20 });
});
afterAll(async () => s?.close());

const as = async (owner: string) => ({ authorization: `Bearer ${(await s.fp.store.tokens.create(owner, 'test')).token}` });
const ids = async (headers: Record<string, string>) => ((await s.api('GET', '/instances', undefined, headers)).body.items as { id: string }[]).map((i) => i.id).sort();

describe('per-owner quotas', () => {
  it('an owner at its instance quota gets 429 with the reason while another owner creates; a delete gives room back', async () => {
    const [greedy, other] = [await as('greedy'), await as('other')];
    const made: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await s.api('POST', '/instances', {}, greedy);
      expect(r.status).toBe(201);
      made.push(r.body.id);
    }
    const refused = await s.api('POST', '/instances', {}, greedy);
    expect(refused.status).toBe(429);
    expect(refused.body.error).toMatchObject({ code: 'QUOTA_EXCEEDED', details: { reason: 'INSTANCES_PER_OWNER', limit: 3, used: 3, asked: 1 } });
    // E2B's and OpenComputer's faces are the same quota.
    expect((await s.api('POST', '/sandboxes', { templateID: 'base' }, { 'x-api-key': greedy.authorization.slice(7) })).status).toBe(429);
    expect((await s.api('POST', '/api/sandboxes', {}, greedy)).status).toBe(429);
    // A stopped instance keeps its share; a fork is an instance like any other.
    expect((await s.api('POST', `/instances/${made[0]}/stop`, undefined, greedy)).status).toBe(200);
    expect((await s.api('POST', '/instances', {}, greedy)).status).toBe(429);
    expect((await s.api('POST', `/instances/${made[1]}/fork`, {}, greedy)).status).toBe(429);
    expect(await ids(greedy)).toEqual([...made].sort()); // nothing half-made
    const theirs = await s.api('POST', '/instances', {}, other);
    expect(theirs.status).toBe(201);
    expect((await s.api('DELETE', `/instances/${made.pop()}`, undefined, greedy)).status).toBe(204);
    expect((await s.api('POST', '/instances', {}, greedy)).status).toBe(201);
    for (const id of await ids(greedy)) await s.api('DELETE', `/instances/${id}`, undefined, greedy);
    await s.api('DELETE', `/instances/${theirs.body.id}`, undefined, other);
  });

  it('memory and CPU are summed over an owner\'s instances; a fork of many is refused whole, before anything is made', async () => {
    const owner = await as('summed');
    const big = await s.api('POST', '/instances', { limits: { memory_mb: 768 } }, owner);
    expect(big.status).toBe(201);
    const over = await s.api('POST', '/instances', { limits: { memory_mb: 512 } }, owner);
    expect(over.status).toBe(429);
    expect(over.body.error.details).toMatchObject({ reason: 'MEMORY_PER_OWNER', limit: 1024, used: 768, asked: 512 });
    const cpu = await s.api('POST', '/instances', { limits: { memory_mb: 128, cpu_percent: HOST_CPU } }, owner);
    expect(cpu.status).toBe(429);
    expect(cpu.body.error.details).toMatchObject({ reason: 'CPU_PER_OWNER', limit: HOST_CPU + 10, used: 20, asked: HOST_CPU });
    const small = await s.api('POST', '/instances', { limits: { memory_mb: 128 } }, owner);
    expect(small.status).toBe(201);
    const forks = await s.api('POST', `/instances/${small.body.id}/fork`, { count: 2 }, owner);
    expect(forks.status).toBe(429);
    expect(forks.body.error.details).toMatchObject({ reason: 'INSTANCES_PER_OWNER', asked: 2 });
    expect((await ids(owner)).length).toBe(2);
    expect((await s.api('GET', `/instances/${small.body.id}/checkpoints`, undefined, owner)).body.items).toEqual([]);
    for (const id of await ids(owner)) await s.api('DELETE', `/instances/${id}`, undefined, owner);
  });

  it('limits beyond the host are refused with a 400 and a reason, whatever the quota', async () => {
    const owner = await as('huge');
    const hostMb = Math.floor(totalmem() / 1048576);
    for (const [limits, field] of [[{ memory_mb: hostMb + 1024 }, 'memory_mb'], [{ cpu_percent: HOST_CPU + 100 }, 'cpu_percent'], [{ disk_mb: 16 * 1024 * 1024 }, 'disk_mb']] as const) {
      const r = await s.api('POST', '/instances', { limits }, owner);
      expect(r.status, field).toBe(400);
      expect(r.body.error).toMatchObject({ code: 'INVALID_REQUEST', details: { reason: 'LIMIT_BEYOND_HOST', field } });
    }
    expect(await ids(owner)).toEqual([]);
  });
});
