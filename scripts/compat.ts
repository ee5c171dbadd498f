/**
 * `npm run compat`: the SDKs' own test suites against a fresh forkpoint, pointed at it by
 * environment variables only (issue 23). Not part of `npm test`: it needs the SDK repositories,
 * checked out by whoever runs it, and the npm registry for their test dependencies.
 *
 *   npm run compat -- --e2b ../E2B --code-interpreter ../code-interpreter --opencomputer ../opencomputer
 *   npm run compat -- --e2b-python ../E2B --code-interpreter-python ../code-interpreter --python-deps ../pydeps
 *
 * The Python suites run on Debian's python3 with the SDKs and what Debian has too old (httpx,
 * pytest, ...) taken from clones of their repositories at the releases PYTHON_DISTS names
 * (`--python-deps DIR`: one clone per repository, named as there), since these machines reach
 * no PyPI; the rest comes from Debian's packages (apt).
 *
 * Each suite runs from its own source in a temporary directory, with its own dependencies
 * installed there; nothing is written into the checkouts or into this project. Prints, per test
 * file, passed / failed / skipped, and a total per suite. Run as root (it starts a server).
 */
import { execa } from 'execa';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { basename, join, relative, resolve } from 'node:path';
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

/** One Python distribution taken from a clone of its repository at a release: what pip would
 * install from its wheel, by hand. */
interface PythonDist {
  /** The clone's directory name under `--python-deps`, and the release's tag in it. */
  repo: string;
  tag: string;
  dist: string;
  version: string;
  /** What is copied onto the path (package directories and single modules), from the clone's root. */
  paths: string[];
  /** The file a build from git would write (setuptools-scm, hatch-vcs), relative to the path. */
  versionFile?: string;
  /** pytest's plugins, found through their entry points. */
  pytest11?: string;
}

/**
 * What E2B's Python SDK and its tests need beyond Debian 12's packages (which are too old for
 * its declared bounds: httpx 0.23, attrs 22, rich 13, wcmatch 8, pytest 7), at the versions its
 * uv.lock names, or that repository's nearest tag where the lock's is not tagged (rich, iniconfig).
 * These machines reach no PyPI; every one of these is pure Python, so a clone of its source at
 * the release is the release. E2B's Python SDK moved to connectrpc and pyqwest (a Rust
 * extension) after 2.34.0's tag; that tag is the last that runs from source alone.
 */
const PYTHON_DISTS: PythonDist[] = [
  { repo: 'httpx', tag: '0.28.1', dist: 'httpx', version: '0.28.1', paths: ['httpx'] },
  { repo: 'httpcore', tag: '1.0.9', dist: 'httpcore', version: '1.0.9', paths: ['httpcore'] },
  { repo: 'h11', tag: 'v0.16.0', dist: 'h11', version: '0.16.0', paths: ['h11'] },
  { repo: 'anyio', tag: '4.14.1', dist: 'anyio', version: '4.14.1', paths: ['src/anyio'], pytest11: 'anyio = anyio.pytest_plugin' },
  { repo: 'attrs', tag: '26.1.0', dist: 'attrs', version: '26.1.0', paths: ['src/attr', 'src/attrs'] },
  { repo: 'packaging', tag: '26.2', dist: 'packaging', version: '26.2', paths: ['src/packaging'] },
  { repo: 'typing_extensions', tag: '4.15.0', dist: 'typing_extensions', version: '4.15.0', paths: ['src/typing_extensions.py'] },
  { repo: 'wcmatch', tag: '10.2', dist: 'wcmatch', version: '10.2', paths: ['wcmatch'] },
  { repo: 'bracex', tag: '3.0', dist: 'bracex', version: '3.0', paths: ['bracex'] },
  { repo: 'dockerfile-parse', tag: '2.0.1', dist: 'dockerfile-parse', version: '2.0.1', paths: ['dockerfile_parse'] },
  { repo: 'rich', tag: 'v14.3.3', dist: 'rich', version: '14.3.3', paths: ['rich'] },
  { repo: 'markdown-it-py', tag: 'v4.2.0', dist: 'markdown-it-py', version: '4.2.0', paths: ['markdown_it'] },
  { repo: 'pytest', tag: '9.1.1', dist: 'pytest', version: '9.1.1', paths: ['src/_pytest', 'src/pytest', 'src/py.py'], versionFile: '_pytest/_version.py' },
  { repo: 'pluggy', tag: '1.6.0', dist: 'pluggy', version: '1.6.0', paths: ['src/pluggy'], versionFile: 'pluggy/_version.py' },
  { repo: 'iniconfig', tag: 'v2.1.0', dist: 'iniconfig', version: '2.1.0', paths: ['src/iniconfig'], versionFile: 'iniconfig/_version.py' },
  { repo: 'pytest-asyncio', tag: 'v1.4.0', dist: 'pytest-asyncio', version: '1.4.0', paths: ['pytest_asyncio'], pytest11: 'asyncio = pytest_asyncio.plugin' },
  { repo: 'pytest-timeout', tag: '2.4.0', dist: 'pytest-timeout', version: '2.4.0', paths: ['pytest_timeout.py'], pytest11: 'timeout = pytest_timeout' },
];
/** The rest, new enough in Debian 12 (protobuf's 3.21.12 is the Python runtime 4.21.12). */
const PYTHON_APT = ['python3-protobuf', 'python3-h2', 'python3-hpack', 'python3-hyperframe', 'python3-mdurl', 'python3-pygments', 'python3-idna', 'python3-certifi', 'python3-sniffio', 'python3-dateutil', 'python3-six'];
/** The SDKs' Python sources, each from its own repository at a tag: E2B's is the last that
 * runs from source alone (after it, connectrpc and pyqwest); the code interpreter's is the last
 * that asks for no newer E2B than that (2.8.1; 2.9.1 asks for e2b 2.39). */
const E2B_PYTHON = { tag: '@e2b/python-sdk@2.34.0', dir: 'packages/python-sdk', dist: 'e2b', packages: ['e2b', 'e2b_connect'] };
const CODE_INTERPRETER_PYTHON = { tag: '@e2b/code-interpreter-python@2.9.0', dir: 'python', dist: 'e2b-code-interpreter', packages: ['e2b_code_interpreter'] };
type PythonSdk = typeof E2B_PYTHON;
/** Debian's interpreter: the one its python3-* packages are for. */
const PYTHON = '/usr/bin/python3';

/** `git archive` of `paths` of `repo` at `tag`, unpacked into `into`. */
async function archive(repo: string, tag: string, paths: string[], into: string): Promise<void> {
  const tar = execa('git', ['-C', repo, 'archive', '--format=tar', tag, '--', ...paths], { encoding: 'buffer' });
  await execa('tar', ['-x', '-C', into], { input: (await tar).stdout });
}

/** Installs `d` into `site` as pip would from its wheel: what it imports, the version file a
 * build from git writes, and the .dist-info importlib.metadata reads. */
async function installDist(d: PythonDist, from: string, site: string): Promise<void> {
  for (const p of d.paths) await cp(join(from, p), join(site, basename(p)), { recursive: true });
  if (d.versionFile) {
    const tuple = d.version.split('.').map(Number).join(', ');
    await writeFile(join(site, d.versionFile), `version = __version__ = ${JSON.stringify(d.version)}\nversion_tuple = __version_tuple__ = (${tuple})\n`);
  }
  const info = join(site, `${d.dist.replace(/-/g, '_')}-${d.version}.dist-info`);
  await mkdir(info);
  await writeFile(join(info, 'METADATA'), `Metadata-Version: 2.1\nName: ${d.dist}\nVersion: ${d.version}\n`);
  await writeFile(join(info, 'RECORD'), '');
  if (d.pytest11) await writeFile(join(info, 'entry_points.txt'), `[pytest11]\n${d.pytest11}\n`);
}

/** Unpacks `sdk` from its clone at its tag into `into`; installs it into `site` under the
 * version its pyproject.toml says. */
async function installSdk(sdk: PythonSdk, clone: string, into: string, site: string): Promise<void> {
  await archive(clone, sdk.tag, [sdk.dir], into);
  const root = join(into, sdk.dir);
  const version = /^version = "([^"]+)"/m.exec(await readFile(join(root, 'pyproject.toml'), 'utf8'))?.[1] ?? '0';
  await installDist({ repo: '', tag: sdk.tag, dist: sdk.dist, version, paths: sdk.packages }, root, site);
}

/** A directory to put on PYTHONPATH with PYTHON_DISTS (from the clones under `deps`) and the
 * E2B SDK (from its clone), Debian's part installed by apt. */
async function pythonSite(e2b: string, deps: string, site: string): Promise<void> {
  await execa('apt-get', ['install', '-y', '-q', '--no-install-recommends', ...PYTHON_APT], { env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }, timeout: INSTALL_TIMEOUT_MS, stdio: 'inherit' });
  await mkdir(site, { recursive: true });
  for (const d of PYTHON_DISTS) {
    const unpacked = await mkdtemp(join(tmpdir(), 'forkpoint-compat-pydist-'));
    try {
      await archive(join(deps, d.repo), d.tag, d.paths, unpacked);
      await installDist(d, unpacked, site);
    } finally {
      await rm(unpacked, { recursive: true, force: true });
    }
  }
  const unpacked = await mkdtemp(join(tmpdir(), 'forkpoint-compat-pysdk-'));
  try {
    await installSdk(E2B_PYTHON, e2b, unpacked, site);
  } finally {
    await rm(unpacked, { recursive: true, force: true });
  }
}

/** An SDK's own pytest suite (`args`: what to run, from the SDK's directory) from its clone at
 * its tag, on Debian's interpreter with `site` (and the SDK) on its path, its pytest.ini as it
 * is but for addopts (the code interpreter's asks for pytest-xdist's workers). */
async function pytestSuite(sdk: PythonSdk, clone: string, site: string, args: string[], env: Record<string, string>): Promise<FileResult[]> {
  const dir = await mkdtemp(join(tmpdir(), 'forkpoint-compat-py-'));
  try {
    const own = join(dir, 'site');
    await cp(site, own, { recursive: true });
    if (sdk !== E2B_PYTHON) await installSdk(sdk, clone, dir, own);
    else await archive(clone, sdk.tag, [sdk.dir], dir);
    const root = join(dir, sdk.dir);
    const xml = join(dir, 'report.xml');
    await execa(PYTHON, ['-m', 'pytest', '-q', '-rfE', '-o', 'addopts=--import-mode=importlib', '-p', 'no:cacheprovider', `--junitxml=${xml}`, ...args], {
      cwd: root,
      env: { ...process.env, PYTHONPATH: own, PYTHONDONTWRITEBYTECODE: '1', ...env },
      reject: false,
      timeout: SUITE_TIMEOUT_MS,
      stdio: 'inherit',
    });
    return junitByFile(await readFile(xml, 'utf8'));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** pytest's JUnit report, per test file; each failure's first line. */
function junitByFile(xml: string): FileResult[] {
  const byFile = new Map<string, FileResult>();
  const unescape = (t: string) => t.replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"').replace(/&#10;/g, ' ').replace(/&amp;/g, '&');
  for (const m of xml.matchAll(/<testcase [^>]*?classname="([^"]+)"[^>]*?name="([^"]+)"[^>]*?(\/>|>([\s\S]*?)<\/testcase>)/g)) {
    const parts = m[1]!.split('.');
    // classname is module.path[.Class]: the file is the part that starts with test_
    const end = parts.findIndex((p) => p.startsWith('test_'));
    const file = `${parts.slice(0, end < 0 ? -1 : end + 1).join('/')}.py`;
    const r = byFile.get(file) ?? { file, passed: 0, failed: 0, skipped: 0, failures: [] };
    const body = m[4] ?? '';
    const failure = /<(failure|error)[^>]*?message="([^"]*)"/.exec(body);
    if (failure || /<(failure|error)/.test(body)) {
      r.failed++;
      r.failures!.push(`${unescape(m[2]!)}: ${unescape(failure?.[2] ?? '').slice(0, 240)}`);
    } else if (/<skipped/.test(body)) r.skipped++;
    else r.passed++;
    byFile.set(file, r);
  }
  return [...byFile.values()];
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
  const { values } = parseArgs({ options: { e2b: { type: 'string' }, 'code-interpreter': { type: 'string' }, opencomputer: { type: 'string' }, 'e2b-python': { type: 'string' }, 'code-interpreter-python': { type: 'string' }, 'python-deps': { type: 'string' }, out: { type: 'string' } } });
  if (!values.e2b && !values['e2b-python'] && !values['code-interpreter'] && !values['code-interpreter-python'] && !values.opencomputer) {
    console.error('usage: npm run compat -- [--e2b DIR] [--e2b-python DIR --python-deps DIR [--code-interpreter-python DIR]] [--code-interpreter DIR] [--opencomputer DIR] [--out FILE.md]\n(checkouts of e2b-dev/E2B, e2b-dev/code-interpreter, diggerhq/opencomputer; for the Python suites, clones with their tags; --python-deps: a directory of clones named as PYTHON_DISTS in scripts/compat.ts names them)');
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
    }
    const python = values['e2b-python'] ? resolve(values['e2b-python']) : undefined;
    const deps = values['python-deps'] ? resolve(values['python-deps']) : undefined;
    if ((python || values['code-interpreter-python']) && !(python && deps)) throw new Error('the Python suites need --e2b-python (a clone of e2b-dev/E2B with its tags) and --python-deps (clones of the repositories PYTHON_DISTS names): this machine reaches no PyPI');
    if (python && deps) {
      const site = await mkdtemp(join(tmpdir(), 'forkpoint-compat-site-'));
      try {
        await pythonSite(python, deps, site);
        const env = { E2B_API_URL: srv.url, E2B_SANDBOX_URL: srv.url, E2B_VOLUME_API_URL: srv.url, E2B_API_KEY: srv.token, ENABLE_VOLUME_TESTS: '1' };
        // Its template builds aside, as the JS suite's are.
        const args = ['tests/sync', 'tests/async', '--ignore', 'tests/sync/template_sync', '--ignore', 'tests/async/template_async'];
        report.push(table(`E2B Python SDK (${E2B_PYTHON.dir}/tests at ${E2B_PYTHON.tag}: sync, async, volumes)`, await pytestSuite(E2B_PYTHON, python, site, args, env)));
        const ci = values['code-interpreter-python'];
        if (ci) report.push(table(`@e2b/code-interpreter, Python (${CODE_INTERPRETER_PYTHON.dir}/tests at ${CODE_INTERPRETER_PYTHON.tag})`, await pytestSuite(CODE_INTERPRETER_PYTHON, resolve(ci), site, ['tests', '--ignore', 'tests/performance.py'], env)));
      } finally {
        await rm(site, { recursive: true, force: true });
      }
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
