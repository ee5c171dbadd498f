/**
 * `npm run compat`: the SDKs' own test suites against a fresh forkpoint, pointed at it by
 * environment variables only (issue 23). Not part of `npm test`: it needs the SDK repositories,
 * checked out by whoever runs it, and the npm registry for their test dependencies.
 *
 *   npm run compat -- --e2b ../E2B --code-interpreter ../code-interpreter --opencomputer ../opencomputer
 *
 * Each suite runs from its own source in a temporary directory, with its own dependencies
 * installed there; nothing is written into the checkouts or into this project. Prints, per test
 * file, passed / failed / skipped, and a total per suite. Run as root (it starts a server).
 */
import { execa } from 'execa';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { parseArgs } from 'node:util';

const ROOT = new URL('..', import.meta.url).pathname;
const CLI = join(ROOT, 'dist', 'cli.js');
/** A subnet of its own: the test suite's servers may run beside it. */
const CIDR = process.env.FORKPOINT_NETWORK_CIDR ?? '10.231.0.0/16';
const INSTALL_TIMEOUT_MS = 10 * 60_000;
const SUITE_TIMEOUT_MS = 40 * 60_000;

interface FileResult {
  file: string;
  passed: number;
  failed: number;
  skipped: number;
  /** Each failed test's name and the first line of its error. */
  failures?: string[];
}

interface Server {
  url: string;
  token: string;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const srv = createServer().listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => res(port));
    });
    srv.on('error', rej);
  });
}

/** A fresh server on the embedded default, as a user starts it, with an E2B-shaped key. */
async function startForkpoint(): Promise<Server> {
  const dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-compat-'));
  const port = await freePort();
  const env = { ...process.env, FORKPOINT_DATA_DIR: dataDir, FORKPOINT_PORT: String(port), FORKPOINT_HOST: '127.0.0.1', FORKPOINT_NETWORK_CIDR: CIDR, FORKPOINT_LOG_LEVEL: 'warn', FORKPOINT_CONFIG: '' };
  const server = execa(process.execPath, [CLI, 'serve'], { env, stdout: 'ignore', stderr: 'inherit', reject: false });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 120_000;
  for (;;) {
    if (server.exitCode !== null) throw new Error(`forkpoint exited (${server.exitCode}) while starting`);
    if (await fetch(`${url}/readyz`).then((r) => r.ok, () => false)) break;
    if (Date.now() > deadline) throw new Error('forkpoint was not ready within 120 s');
    await new Promise((r) => setTimeout(r, 250));
  }
  const { stdout } = await execa(process.execPath, [CLI, 'token', 'create', '--e2b', '--name', 'compat'], { env });
  const token = /e2b_[0-9a-f]+/.exec(stdout)?.[0];
  if (!token) throw new Error(`no key in: ${stdout}`);
  return {
    url,
    token,
    async stop() {
      // What the suites left (paused sandboxes among them) goes first: a server stops leaving
      // its instances and their network in place, and this one's data directory goes next.
      const auth = { authorization: `Bearer ${token}` };
      for (let n = 0; n < 20; n++) {
        const page = (await (await fetch(`${url}/instances?limit=100`, { headers: auth })).json()) as { items?: { id: string }[] };
        if (!page.items?.length) break;
        await Promise.all(page.items.map((i) => fetch(`${url}/instances/${i.id}`, { method: 'DELETE', headers: auth })));
      }
      // And the templates (the code interpreter's, made on first use): each keeps a stopped
      // instance of its own, whose address kept the server's network on the host after it stopped.
      const templates = (await (await fetch(`${url}/templates`, { headers: auth })).json()) as { templates?: { name: string }[] };
      for (const t of templates.templates ?? []) await fetch(`${url}/templates/${encodeURIComponent(t.name)}`, { method: 'DELETE', headers: auth });
      server.kill('SIGTERM');
      await server;
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}

/** Copies `parts` of `from` into a new directory and installs `deps` there. */
async function workspace(from: string, parts: string[], deps: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'forkpoint-compat-suite-'));
  for (const p of parts) if (existsSync(join(from, p))) await cp(join(from, p), join(dir, p), { recursive: true });
  await writeFile(join(dir, 'package.json'), JSON.stringify({ name: 'compat', private: true, type: 'module', dependencies: deps }, null, 2));
  await execa('npm', ['install', '--no-audit', '--no-fund', '--ignore-scripts', '--loglevel=error'], { cwd: dir, timeout: INSTALL_TIMEOUT_MS, stdio: 'inherit' });
  return dir;
}

/** Runs vitest with a JSON report; results per file. */
async function vitest(dir: string, include: string[], exclude: string[], env: Record<string, string>, setupFiles: string[] = []): Promise<FileResult[]> {
  await writeFile(join(dir, 'vitest.compat.config.mjs'), `export default { test: { include: ${JSON.stringify(include)}, exclude: ${JSON.stringify(exclude)}, setupFiles: ${JSON.stringify(setupFiles)}, testTimeout: 60000, hookTimeout: 60000, fileParallelism: false, isolate: true, environment: 'node' } };\n`);
  const out = join(dir, 'report.json');
  await execa('npx', ['vitest', 'run', '--config', 'vitest.compat.config.mjs', '--reporter=json', `--outputFile=${out}`], { cwd: dir, env: { ...process.env, ...env }, reject: false, timeout: SUITE_TIMEOUT_MS, stdio: 'inherit' });
  const report = JSON.parse(await readFile(out, 'utf8')) as { testResults: { name: string; message?: string; assertionResults: { status: string; fullName: string; failureMessages?: string[] }[] }[] };
  const firstLine = (m: string | undefined) => (m ?? '').split('\n')[0]!.slice(0, 240);
  return report.testResults.map((f) => ({
    file: relative(dir, f.name),
    passed: f.assertionResults.filter((a) => a.status === 'passed').length,
    // A file that failed before any test ran (an import, a hook) counts as one failure.
    failed: f.assertionResults.filter((a) => a.status === 'failed').length || (f.assertionResults.length === 0 && f.message ? 1 : 0),
    skipped: f.assertionResults.filter((a) => a.status !== 'passed' && a.status !== 'failed').length,
    failures: [
      ...(f.assertionResults.length === 0 && f.message ? [`(the file): ${firstLine(f.message)}`] : []),
      ...f.assertionResults.filter((a) => a.status === 'failed').map((a) => `${a.fullName}: ${firstLine(a.failureMessages?.[0])}`),
    ],
  }));
}

async function depsOf(pkg: string, also: string[]): Promise<Record<string, string>> {
  const p = JSON.parse(await readFile(pkg, 'utf8')) as { dependencies?: Record<string, string>; devDependencies?: Record<string, string> };
  const deps = { ...p.dependencies };
  for (const name of also) {
    const v = p.devDependencies?.[name];
    if (v) deps[name] = v;
  }
  return deps;
}

/** Test files that answer E2B's API themselves (msw): the SDK's own unit tests, about what it
 * sends, not about any server. */
async function mocksTheApi(dir: string, files: string[]): Promise<string[]> {
  const mocked: string[] = [];
  for (const f of files) if (/from ['"]msw/.test(await readFile(join(dir, f), 'utf8'))) mocked.push(f);
  return mocked;
}

async function testFiles(dir: string, under: string[]): Promise<string[]> {
  const { stdout } = await execa('find', [...under, '-name', '*.test.ts'], { cwd: dir, reject: false });
  return stdout.split('\n').filter(Boolean);
}

/** E2B's JS SDK, its own source and tests (packages/js-sdk): what reaches a sandbox, against
 * forkpoint; the files that mock E2B's API run apart, with no server named, as their authors
 * run them. */
async function e2bJs(repo: string, srv: Server): Promise<{ server: FileResult[]; mocked: FileResult[] }> {
  const sdk = join(repo, 'packages', 'js-sdk');
  const dir = await workspace(sdk, ['src', 'tests', 'tsconfig.json'], await depsOf(join(sdk, 'package.json'), ['vitest', 'msw', 'dotenv', 'error-stack-parser-es']));
  try {
    const setup = existsSync(join(sdk, 'tests', 'globalFetchFallback.setup.ts')) ? ['tests/globalFetchFallback.setup.ts'] : [];
    const mocked = await mocksTheApi(dir, await testFiles(dir, ['tests/sandbox', 'tests/api']));
    const exclude = ['tests/runtimes/**', 'tests/template/**'];
    const server = await vitest(dir, ['tests/sandbox/**/*.test.ts', 'tests/api/**/*.test.ts'], [...exclude, ...mocked], { E2B_API_URL: srv.url, E2B_SANDBOX_URL: srv.url, E2B_API_KEY: srv.token }, setup);
    const own = mocked.length ? await vitest(dir, mocked, exclude, {}, setup) : [];
    return { server, mocked: own };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** The code interpreter's JS SDK tests (js/), with the published e2b. */
async function codeInterpreterJs(repo: string, srv: Server): Promise<FileResult[]> {
  const sdk = join(repo, 'js');
  const dir = await workspace(sdk, ['src', 'tests', 'tsconfig.json'], await depsOf(join(sdk, 'package.json'), ['vitest', 'dotenv']));
  try {
    return await vitest(dir, ['tests/**/*.test.ts'], ['tests/runtimes/**', 'tests/benchmarking*'], { E2B_API_URL: srv.url, E2B_SANDBOX_URL: srv.url, E2B_API_KEY: srv.token });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** OpenComputer's SDK examples (sdks/typescript/examples): each prints its checks and a
 * "Results: N passed, M failed" line. */
async function openComputer(repo: string, srv: Server): Promise<FileResult[]> {
  const sdk = join(repo, 'sdks', 'typescript');
  const dir = await workspace(sdk, ['src', 'examples', 'tsconfig.json'], { ...(await depsOf(join(sdk, 'package.json'), ['tsx', 'undici'])) });
  try {
    const runner = await readFile(join(dir, 'examples', 'run-all-tests.ts'), 'utf8');
    const files = [...runner.matchAll(/file: "([^"]+)"(?:, slow: true)?/g)].filter((m) => !m[0].includes('slow')).map((m) => m[1]!);
    const results: FileResult[] = [];
    for (const file of files) {
      const r = await execa('npx', ['tsx', join('examples', file)], {
        cwd: dir,
        env: { ...process.env, OPENCOMPUTER_API_URL: srv.url, OPENCOMPUTER_API_KEY: srv.token },
        reject: false,
        timeout: 10 * 60_000,
        all: true,
      });
      const out = r.all ?? '';
      const m = /Results: (\d+) passed, (\d+) failed/.exec(out);
      const passed = m ? Number(m[1]) : (out.match(/✓/g) ?? []).length;
      const failed = m ? Number(m[2]) : Math.max((out.match(/✗/g) ?? []).length, r.exitCode === 0 ? 0 : 1);
      results.push({ file: `examples/${file}`, passed, failed, skipped: 0 });
      process.stdout.write(`${file}: ${passed} passed, ${failed} failed\n`);
    }
    return results;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** E2B's Python SDK tests, if the interpreter here has the SDK and pytest (this project's
 * machines reach no PyPI: then it says so and runs nothing). */
async function e2bPython(repo: string, srv: Server): Promise<FileResult[] | string> {
  const has = await execa('python3', ['-c', 'import e2b, pytest, pytest_asyncio'], { reject: false });
  if (has.exitCode !== 0) return 'not run: python3 has no e2b, pytest and pytest-asyncio here (pip install e2b pytest pytest-asyncio)';
  const dir = await mkdtemp(join(tmpdir(), 'forkpoint-compat-py-'));
  try {
    await cp(join(repo, 'packages', 'python-sdk', 'tests'), join(dir, 'tests'), { recursive: true });
    const xml = join(dir, 'report.xml');
    await execa('python3', ['-m', 'pytest', '-q', 'tests/sync', 'tests/async', `--junitxml=${xml}`, '-p', 'no:cacheprovider'], { cwd: dir, env: { ...process.env, E2B_API_URL: srv.url, E2B_SANDBOX_URL: srv.url, E2B_API_KEY: srv.token }, reject: false, timeout: SUITE_TIMEOUT_MS, stdio: 'inherit' });
    const byFile = new Map<string, FileResult>();
    for (const m of (await readFile(xml, 'utf8')).matchAll(/<testcase [^>]*classname="([^"]+)"[^>]*?(\/>|>([\s\S]*?)<\/testcase>)/g)) {
      const file = `${m[1]!.split('.').slice(0, -1).join('/') || m[1]}.py`;
      const r = byFile.get(file) ?? { file, passed: 0, failed: 0, skipped: 0 };
      const body = m[3] ?? '';
      if (/<(failure|error)/.test(body)) r.failed++;
      else if (/<skipped/.test(body)) r.skipped++;
      else r.passed++;
      byFile.set(file, r);
    }
    return [...byFile.values()];
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

function table(name: string, results: FileResult[] | string): string {
  if (typeof results === 'string') return `## ${name}\n\n${results}\n`;
  const sum = (k: 'passed' | 'failed' | 'skipped') => results.reduce((n, r) => n + r[k], 0);
  const rows = results.sort((a, b) => a.file.localeCompare(b.file)).map((r) => `| ${r.file} | ${r.passed} | ${r.failed} | ${r.skipped} |`);
  const failures = results.flatMap((r) => (r.failures ?? []).map((f) => `- ${r.file}: ${f.replace(/\s+/g, ' ')}`));
  return [
    `## ${name}: ${sum('passed')} passed, ${sum('failed')} failed, ${sum('skipped')} skipped`, '', '| file | passed | failed | skipped |', '|---|---|---|---|', ...rows, '',
    ...(failures.length ? ['<details><summary>the failures</summary>', '', ...failures, '', '</details>', ''] : []),
  ].join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { e2b: { type: 'string' }, 'code-interpreter': { type: 'string' }, opencomputer: { type: 'string' }, out: { type: 'string' } } });
  if (!values.e2b && !values['code-interpreter'] && !values.opencomputer) {
    console.error('usage: npm run compat -- [--e2b DIR] [--code-interpreter DIR] [--opencomputer DIR] [--out FILE.md]\n(checkouts of e2b-dev/E2B, e2b-dev/code-interpreter, diggerhq/opencomputer)');
    process.exit(2);
  }
  if (!existsSync(CLI)) throw new Error('dist/cli.js is missing: npm run build first');
  const srv = await startForkpoint();
  const report: string[] = [`# forkpoint compatibility, ${new Date().toISOString().slice(0, 10)}\n`];
  try {
    if (values.e2b) {
      const js = await e2bJs(resolve(values.e2b), srv);
      report.push(table('E2B JS SDK against forkpoint (packages/js-sdk/tests: sandbox, api)', js.server));
      report.push(table('E2B JS SDK, its files that mock E2B\'s API (msw; no server is asked)', js.mocked));
      report.push(table('E2B Python SDK (packages/python-sdk/tests: sync, async)', await e2bPython(resolve(values.e2b), srv)));
    }
    if (values['code-interpreter']) report.push(table('@e2b/code-interpreter (js/tests)', await codeInterpreterJs(resolve(values['code-interpreter']), srv)));
    if (values.opencomputer) report.push(table('OpenComputer SDK examples (sdks/typescript/examples, run-all-tests.ts without the slow one)', await openComputer(resolve(values.opencomputer), srv)));
  } finally {
    await srv.stop();
  }
  const text = report.join('\n');
  process.stdout.write(`\n${text}`);
  if (values.out) await writeFile(values.out, text);
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
