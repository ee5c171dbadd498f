/**
 * The committed OpenAPI documents are the contract: they match the routes, every `$ref`
 * resolves, redocly and spectral find no error, and every operation is named and documented.
 * (test/clients.test.ts shows generators turn them into working clients.)
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openApiText } from '../src/cli/server.js';
import { bothOrUndo, startServer, type TestServer } from './helpers/server.js';

type Json = Record<string, any>;
const repo = new URL('..', import.meta.url).pathname;
const FILES = { '3.1.0': 'openapi.json', '3.0.3': 'openapi-3.0.json' } as const;
const load = async (file: string): Promise<Json> => JSON.parse(await readFile(join(repo, 'openapi', file), 'utf8')) as Json;
const METHODS = ['get', 'put', 'post', 'delete', 'patch'];
const operations = (doc: Json) =>
  Object.entries(doc.paths as Json).flatMap(([path, item]) => METHODS.filter((m) => item[m]).map((m) => ({ path, method: m, op: item[m] as Json })));

let s: TestServer;
let work: string;
beforeAll(async () => {
  [s, work] = await bothOrUndo(startServer(), mkdtemp(join(tmpdir(), 'forkpoint-openapi-test-')), (x) => x.close(), (d) => rm(d, { recursive: true, force: true }));
});
afterAll(async () => {
  await s?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

describe.each(Object.entries(FILES))('OpenAPI %s (openapi/%s)', (version, file) => {
  it('matches the routes (regenerate: npm run openapi)', async () => {
    expect(await load(file)).toEqual(JSON.parse(await openApiText(version as '3.1.0' | '3.0.3')));
  });

  it('every $ref resolves', async () => {
    const doc = await load(file);
    const refs: string[] = [];
    const walk = (n: unknown): void => {
      if (Array.isArray(n)) return n.forEach(walk);
      if (!n || typeof n !== 'object') return;
      for (const [k, v] of Object.entries(n)) (k === '$ref' && typeof v === 'string' ? refs.push(v) : walk(v));
    };
    walk(doc);
    expect(refs.length).toBeGreaterThan(50);
    const unresolved = refs.filter((ref) => {
      if (!ref.startsWith('#/')) return true;
      let at: unknown = doc;
      for (const part of ref.slice(2).split('/').map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'))) at = (at as Json | undefined)?.[part];
      return at === undefined;
    });
    expect(unresolved).toEqual([]);
  });

  it('passes redocly lint with no errors', async () => {
    const r = await execa(join(repo, 'node_modules/.bin/redocly'), ['lint', '--format', 'json', join(repo, 'openapi', file)], { reject: false });
    const report = JSON.parse(r.stdout.slice(r.stdout.indexOf('{'))) as { totals: { errors: number; warnings: number }; problems: { severity: string; message: string }[] };
    expect(report.problems.filter((p) => p.severity === 'error')).toEqual([]);
    expect(report.totals.errors).toBe(0);
  });

  it('passes spectral\'s spectral:oas ruleset with no errors', async () => {
    const ruleset = join(work, 'spectral.yaml');
    await writeFile(ruleset, 'extends: ["spectral:oas"]\n');
    const r = await execa(join(repo, 'node_modules/.bin/spectral'), ['lint', '-r', ruleset, '-f', 'json', '--quiet', join(repo, 'openapi', file)], { reject: false });
    const results = JSON.parse(r.stdout) as { severity: number; code: string; message: string; path: string[] }[];
    expect(results.filter((x) => x.severity === 0)).toEqual([]);
    expect(r.exitCode, r.stderr).toBe(0); // spectral fails on errors by itself, and on a crash
  });

  it('names, describes and tags every operation; documents its errors; ids are unique camelCase, oc* for OpenComputer\'s', async () => {
    const doc = await load(file);
    const ops = operations(doc);
    expect(ops.length).toBeGreaterThan(45);
    const ids = ops.map((o) => o.op.operationId as string);
    expect(new Set(ids).size).toBe(ids.length);
    for (const { path, method, op } of ops) {
      const where = `${method} ${path}`;
      expect(op.operationId, where).toMatch(/^[a-z][a-zA-Z0-9]*$/);
      expect(op.operationId.startsWith('oc'), where).toBe(path.startsWith('/api/'));
      expect(op.summary, where).toBeTruthy();
      expect(op.description, where).toBeTruthy();
      expect(op.tags?.length, where).toBeGreaterThan(0);
      expect(op.responses['500'], `${where}: 500`).toBeTruthy();
      if (path !== '/healthz' && path !== '/readyz') for (const st of ['400', '401', '404', '409', '503', '507']) expect(op.responses[st], `${where}: ${st}`).toBeTruthy();
    }
    for (const [name, op] of [['createInstance', ''], ['createCheckpoint', ''], ['rollbackInstance', ''], ['forkInstance', ''], ['execCommand', ''], ['ocCreateSandbox', '']]) {
      expect(ids, `${name}${op}`).toContain(name);
    }
  });

  it('is precise: integers, nullables, binary bodies, optional bodies, boolean queries, no token for /healthz, 202 documented', async () => {
    const doc = await load(file);
    const schemas = doc.components.schemas as Json;
    for (const name of ['Instance', 'Checkpoint', 'ExecResult', 'Error', 'CreateInstanceRequest', 'ForkRequest']) expect(schemas[name], name).toBeTruthy();
    expect(schemas.ExecResult.properties.exit_code.type).toBe('integer');
    expect(schemas.Process.properties.process_id.type).toBe('integer');
    const nullable = (p: Json) => (version === '3.0.3' ? p.nullable === true : JSON.stringify(p).includes('"null"'));
    expect(nullable(schemas.Instance.properties.head_checkpoint_id)).toBe(true);
    expect(nullable(schemas.Checkpoint.properties.pause_ms)).toBe(true);
    expect(nullable(schemas.Process.properties.pid)).toBe(true);
    const op = (path: string, method: string) => doc.paths[path][method] as Json;
    expect(op('/healthz', 'get').security).toEqual([]);
    expect(op('/instances/{id}/checkpoints', 'post').responses['202'].content['application/json'].schema.$ref).toBe('#/components/schemas/Checkpoint');
    for (const path of ['/instances', '/instances/{id}/checkpoints', '/instances/{id}/fork']) expect(op(path, 'post').requestBody.required, path).toBe(false);
    expect(op('/instances/{id}/rollback', 'post').requestBody.required).toBe(true);
    expect(op('/instances/{id}/files', 'put').requestBody.content['application/octet-stream'].schema).toMatchObject({ type: 'string', format: 'binary' });
    expect(op('/instances/{id}/files', 'get').responses['200'].content['application/octet-stream']).toBeTruthy();
    const wait = (op('/instances/{id}/checkpoints', 'post').parameters as Json[]).find((p) => p.name === 'wait')!;
    // `true` or `false` typed boolean, or `durable`.
    const kinds = (wait.schema.anyOf ?? wait.schema.oneOf) as Json[];
    expect(kinds.map((k) => k.type)).toEqual(['boolean', 'string']);
    expect(kinds[1]!.enum).toEqual(['durable']);
    expect(doc.servers[0].url).toBe('http://127.0.0.1:7878');
  });
});

describe('the served documents', () => {
  it('/openapi.json and /openapi-3.0.json are the committed ones, with this server\'s address', async () => {
    for (const [path, file] of [['/openapi.json', 'openapi.json'], ['/openapi-3.0.json', 'openapi-3.0.json']] as const) {
      const res = await request(s.url + path);
      expect(res.statusCode).toBe(200);
      const served = (await res.body.json()) as Json;
      const committed = await load(file);
      expect(served.servers[0].url).toBe(s.url);
      expect({ ...served, servers: [] }).toEqual({ ...committed, servers: [] });
    }
  });
});
