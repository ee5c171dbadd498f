import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'fp-config-'));
});
afterAll(async () => rm(dir, { recursive: true, force: true }));

describe('configuration', () => {
  it('has defaults: /var/lib/forkpoint, loopback', () => {
    const c = loadConfig({ env: {} });
    expect(c.dataDir).toBe('/var/lib/forkpoint');
    expect(c.host).toBe('127.0.0.1');
  });

  it('takes flags over environment over file over defaults', async () => {
    const file = join(dir, 'config.json');
    await writeFile(file, JSON.stringify({ port: 1111, host: '0.0.0.0', dataDir: '/from/file', logLevel: 'warn' }));
    const env = { FORKPOINT_PORT: '2222', FORKPOINT_DATA_DIR: '/from/env' };
    const c = loadConfig({ file, env, flags: { port: '3333' } });
    expect(c.port).toBe(3333); // flag
    expect(c.dataDir).toBe('/from/env'); // env over file
    expect(c.host).toBe('0.0.0.0'); // file over default
    expect(c.logLevel).toBe('warn');
    expect(c.maxCheckpointsPerInstance).toBe(10); // default
  });

  it('reads the file named by FORKPOINT_CONFIG', async () => {
    const file = join(dir, 'c.json');
    await writeFile(file, JSON.stringify({ port: 4444 }));
    expect(loadConfig({ env: { FORKPOINT_CONFIG: file } }).port).toBe(4444);
  });

  it('rejects bad values and unknown keys with a clear message', async () => {
    expect(() => loadConfig({ env: { FORKPOINT_PORT: 'seventy' } })).toThrow(/port/);
    const file = join(dir, 'c.json');
    await writeFile(file, JSON.stringify({ prot: 1 }));
    expect(() => loadConfig({ file, env: {} })).toThrow(/prot/);
  });

  it('a node sharing a database: its name is a DNS name, and listening on every address it must say where it is', () => {
    const shared = { FORKPOINT_DATABASE_URL: 'postgresql://u@db/forkpoint' };
    expect(loadConfig({ env: { ...shared, FORKPOINT_NODE_ID: 'worker-1.eu-west.internal' } }).nodeId).toBe('worker-1.eu-west.internal');
    expect(() => loadConfig({ env: { ...shared, FORKPOINT_NODE_ID: 'Bad_Name' } })).toThrow(/nodeId/);
    expect(() => loadConfig({ env: { FORKPOINT_DATABASE_URL: 'mysql://x' } })).toThrow(/databaseUrl/);
    expect(() => loadConfig({ env: { ...shared, FORKPOINT_HOST: '0.0.0.0' } })).toThrow(/FORKPOINT_NODE_URL/);
    expect(loadConfig({ env: { ...shared, FORKPOINT_HOST: '0.0.0.0', FORKPOINT_NODE_URL: 'http://10.0.0.5:7878' } }).nodeUrl).toBe('http://10.0.0.5:7878');
    expect(loadConfig({ env: { FORKPOINT_HOST: '0.0.0.0' } }).host).toBe('0.0.0.0'); // one node: nobody to tell
  });
});
