import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { execa } from 'execa';
import { request } from 'undici';
import { loadConfig, type Config } from '../config.js';
import { openConfiguredStore as storeOf } from '../core/forkpoint.js';
import { openLocalForkpoint } from '../local.js';
import { buildOnServer } from '../cli-build.js';
import { importImageArchive } from '../engine/image-archive.js';
import { Images } from '../engine/images.js';
import { Mounter } from '../engine/overlay.js';
import { DataLayout } from '../lib/data-layout.js';
import { buildApp, openApiDocument } from '../http/app.js';
import type { OpenApiVersion } from '../http/openapi.js';
import { VERSION } from '../version.js';
import { raiseServerPriority } from '../lib/server-priority.js';
import { packagePath } from '../lib/package-root.js';

/** The commands that run the server or act on its data directory: loaded only when one of
 * them is asked for (the client commands need none of this). */

export interface GlobalFlags {
  config?: string | undefined;
  dataDir?: string | undefined;
}

/** Where the service and the CLI both read their settings unless told otherwise: a shell's
 * `forkpoint token create` then speaks to the store the service uses. */
export const DEFAULT_CONFIG_FILE = '/etc/forkpoint/config.json';

export function config(g: GlobalFlags, extra: Partial<Record<keyof Config, unknown>> = {}): Config {
  const file = g.config ?? (process.env.FORKPOINT_CONFIG || !existsSync(DEFAULT_CONFIG_FILE) ? undefined : DEFAULT_CONFIG_FILE);
  return loadConfig({ file, flags: { dataDir: g.dataDir, ...extra } });
}

/** The store a server of this configuration uses, for the token commands; refused where no
 * server has ever run (a token there would be read by nothing). */
async function serversStore(cfg: Config) {
  const db = new DataLayout(cfg.dataDir).db;
  if (!cfg.databaseUrl && !existsSync(db)) {
    throw new Error(`no forkpoint server has used the data directory ${cfg.dataDir} (there is no ${db}): give the server's configuration, --config FILE (default ${DEFAULT_CONFIG_FILE}) or FORKPOINT_DATA_DIR / FORKPOINT_DATABASE_URL as the server has them`);
  }
  return storeOf(cfg);
}

export async function serve(g: GlobalFlags, o: { port?: string; host?: string; logLevel?: string }): Promise<void> {
  const cfg = config(g, { port: o.port, host: o.host, logLevel: o.logLevel });
  const log = pino({ level: cfg.logLevel });
  const notRaised = raiseServerPriority(cfg.serverNice);
  if (notRaised) log.warn(notRaised);
  const fp = await openLocalForkpoint(cfg, log, VERSION);
  await fp.start();
  const token = await fp.ensureInitialToken();
  if (token) {
    process.stdout.write(`forkpoint: created the first API token (also in ${fp.layout.initialTokenFile}, mode 0600):\n${token}\n`);
  }
  const app = await buildApp({ forkpoint: fp, logger: log, bodyLimitBytes: cfg.bodyLimitBytes });
  const address = await app.listen({ port: cfg.port, host: cfg.host });
  // Where the other nodes sharing the store reach this one (FORKPOINT_NODE_URL says, else this).
  await fp.join(address);
  process.stdout.write(`forkpoint ${VERSION} listening on ${address} (data in ${cfg.dataDir}; web console at ${address}/ui, API docs at ${address}/docs)\n`);
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return; // a second signal: the shutdown under way goes on
    stopping = true;
    log.info({ signal }, 'shutting down; sandboxes keep running and are re-adopted at the next start');
    await app.close();
    await fp.close();
    process.exit(0);
  };
  // `on`, not `once`: execa's clean-up (signal-exit) re-raises a signal it finds no other
  // listener for, which killed the server mid-shutdown whenever a subprocess was under way.
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
}

export async function tokenCreate(g: GlobalFlags, o: { owner: string; name: string; e2b?: boolean }): Promise<void> {
  const store = await serversStore(config(g));
  const { token: t, record } = await store.tokens.create(o.owner, o.name, o.e2b ? 'e2b' : 'forkpoint');
  process.stdout.write(`${t}\n`);
  process.stderr.write(`token ${record.id} for owner ${record.owner}\n`);
  await store.close();
}

export async function tokenList(g: GlobalFlags, o: { json?: boolean }): Promise<void> {
  const store = await serversStore(config(g));
  const rows = await store.tokens.list();
  await store.close();
  if (o.json) {
    process.stdout.write(`${JSON.stringify(rows.map((r) => ({ id: r.id, owner: r.owner, name: r.name, created_at: r.createdAt, revoked_at: r.revokedAt })), null, 2)}\n`);
    return;
  }
  const { table } = await import('./format.js');
  process.stdout.write(table(['ID', 'OWNER', 'NAME', 'CREATED', 'STATE'], rows.map((r) => [r.id, r.owner, r.name, r.createdAt, r.revokedAt ? `revoked ${r.revokedAt}` : 'active'])));
}

export async function tokenRevoke(g: GlobalFlags, id: string): Promise<void> {
  const store = await serversStore(config(g));
  const ok = await store.tokens.revoke(id);
  await store.close();
  if (!ok) {
    process.stderr.write(`forkpoint: no active token ${id}\n`);
    process.exitCode = 1;
  }
}

/** The running server this machine's CLI talks to, and a token for it. */
async function serverOf(cfg: Config, o: { url?: string; token?: string }): Promise<{ url: string; token: string }> {
  return {
    url: (o.url ?? process.env.FORKPOINT_URL ?? `http://127.0.0.1:${cfg.port}`).replace(/\/+$/, ''),
    token: o.token ?? process.env.FORKPOINT_TOKEN ?? (await readFile(new DataLayout(cfg.dataDir).initialTokenFile, 'utf8').catch(() => '')).trim(),
  };
}

export async function drain(g: GlobalFlags, o: { url?: string; token?: string; timeout: string }): Promise<void> {
  const { url, token: t } = await serverOf(config(g), o);
  const waitMs = Number(o.timeout) * 1000;
  if (!Number.isFinite(waitMs) || waitMs <= 0) throw new Error(`--timeout: not a number of seconds: ${o.timeout}`);
  const res = await request(`${url}/nodes/drain`, { method: 'POST', headers: { authorization: `Bearer ${t}` }, headersTimeout: waitMs, bodyTimeout: waitMs });
  const text = await res.body.text();
  process.stdout.write(`${text}\n`);
  if (res.statusCode !== 200) process.exitCode = 1;
}

export async function imageImport(g: GlobalFlags, name: string, file: string): Promise<void> {
  const cfg = config(g);
  const { layers } = await importImageArchive(new Images(new DataLayout(cfg.dataDir).images), new Mounter(cfg.agentPath), name, file);
  process.stderr.write(`imported ${name} (${layers} layer${layers === 1 ? '' : 's'})\n`);
}

export async function imageBuild(g: GlobalFlags, name: string, context: string | undefined, o: { file?: string; buildArg?: string[]; url?: string; token?: string }): Promise<void> {
  const cfg = config(g);
  if (!context) {
    if (name !== 'debian') throw new Error('give a build context (a directory with a Dockerfile); only `debian` is built without one');
    await rebuildDebian(cfg);
    return;
  }
  const { resolve, relative, isAbsolute } = await import('node:path');
  const { statSync } = await import('node:fs');
  const dir = resolve(context);
  if (!statSync(dir, { throwIfNoEntry: false })?.isDirectory()) throw new Error(`the build context ${context} is not a directory (looked for ${dir})`);
  // -f as Docker takes it: relative to the current directory (absolute allowed); default: the
  // context's Dockerfile. The server reads it inside the context.
  const dockerfile = o.file === undefined ? 'Dockerfile' : relative(dir, resolve(o.file));
  if (o.file !== undefined && (dockerfile.startsWith('..') || isAbsolute(dockerfile))) throw new Error(`the Dockerfile ${o.file} is outside the build context ${context}`);
  if (!existsSync(join(dir, dockerfile))) throw new Error(`no Dockerfile at ${join(dir, dockerfile)}`);
  const { url, token: tokenValue } = await serverOf(cfg, o);
  const args = Object.fromEntries((o.buildArg ?? []).map((a) => [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)]));
  process.exitCode = await buildOnServer({ url, token: tokenValue, name, context: dir, dockerfile, buildArgs: args });
}

export async function imageList(g: GlobalFlags, o: { json?: boolean }): Promise<void> {
  const cfg = config(g);
  const list = await new Images(new DataLayout(cfg.dataDir).images, cfg.imageSeedDir).list();
  if (o.json) {
    process.stdout.write(`${JSON.stringify(list.map((i) => ({ name: i.name, created_at: i.createdAt })), null, 2)}\n`);
    return;
  }
  const { table } = await import('./format.js');
  process.stdout.write(table(['NAME', 'CREATED'], list.map((i) => [i.name, i.createdAt])));
}

/** Rebuilds the Debian image into the seed directory, and drops this data directory's copy
 * (instances booted from now on link in the new tree). */
async function rebuildDebian(cfg: Config): Promise<void> {
  const script = packagePath('deploy', 'debian.sh');
  const seed = join(cfg.imageSeedDir, 'debian');
  await execa('bash', [script, '--force', seed], { stdio: 'inherit' });
  await new Images(new DataLayout(cfg.dataDir).images, cfg.imageSeedDir).unlink('debian');
}

export async function openapi(o: { out?: string; openapi: string }): Promise<void> {
  if (o.openapi !== '3.1' && o.openapi !== '3.0') throw new Error('--openapi is 3.1 or 3.0');
  const text = await openApiText(o.openapi === '3.0' ? '3.0.3' : '3.1.0');
  if (o.out) await writeFile(o.out, text);
  else process.stdout.write(text);
}

/** The document from the routes' zod schemas, on a throwaway store (no engine is started), with
 * the default address as its server. */
export async function openApiText(version: OpenApiVersion): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'forkpoint-openapi-'));
  try {
    const cfg = loadConfig({ env: {}, flags: { dataDir: dir } });
    const fp = await openLocalForkpoint(cfg, pino({ level: 'silent' }), VERSION);
    const text = JSON.stringify(await openApiDocument(fp, version), null, 2) + '\n';
    await fp.close();
    return text;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
