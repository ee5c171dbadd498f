#!/usr/bin/env node
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { pino } from 'pino';
import { loadConfig, type Config } from './config.js';
import { openConfiguredStore as storeOf } from './core/forkpoint.js';
import { openLocalForkpoint } from './local.js';
import { execa } from 'execa';
import { request } from 'undici';
import { buildOnServer } from './cli-build.js';
import { importImageArchive } from './engine/image-archive.js';
import { Images } from './engine/images.js';
import { Mounter } from './engine/overlay.js';
import { DataLayout } from './lib/data-layout.js';
import { buildApp, openApiDocument } from './http/app.js';
import type { OpenApiVersion } from './http/openapi.js';
import { VERSION } from './version.js';

interface GlobalFlags {
  config?: string;
  dataDir?: string;
}

const program = new Command()
  .name('forkpoint')
  .description('Self-hosted sandboxes with instant checkpoints, rollback and fork')
  .version(VERSION)
  .option('-c, --config <file>', 'JSON config file (also FORKPOINT_CONFIG)')
  .option('-d, --data-dir <dir>', 'data directory (also FORKPOINT_DATA_DIR)');

/** Where the service and the CLI both read their settings unless told otherwise: a shell's
 * `forkpoint token create` then speaks to the store the service uses. */
export const DEFAULT_CONFIG_FILE = '/etc/forkpoint/config.json';

function config(extra: Partial<Record<keyof Config, unknown>> = {}): Config {
  const g = program.opts<GlobalFlags>();
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

program
  .command('serve')
  .description('Start the API server (creates and prints a token on first start)')
  .option('-p, --port <port>', 'port (also FORKPOINT_PORT)')
  .option('-H, --host <host>', 'address to listen on (also FORKPOINT_HOST)')
  .option('-l, --log-level <level>', 'pino log level (also FORKPOINT_LOG_LEVEL)')
  .action(async (o: { port?: string; host?: string; logLevel?: string }) => {
    const cfg = config({ port: o.port, host: o.host, logLevel: o.logLevel });
    const log = pino({ level: cfg.logLevel });
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
    process.stdout.write(`forkpoint ${VERSION} listening on ${address} (data in ${cfg.dataDir}; API docs at ${address}/docs)\n`);
    const stop = async (signal: string) => {
      log.info({ signal }, 'shutting down; sandboxes keep running and are re-adopted at the next start');
      await app.close();
      await fp.close();
      process.exit(0);
    };
    process.once('SIGINT', () => void stop('SIGINT'));
    process.once('SIGTERM', () => void stop('SIGTERM'));
  });

const token = program.command('token').description('Manage API tokens');
token
  .command('create')
  .description('Create a token and print it (shown once)')
  .option('-o, --owner <owner>', 'the owner everything made with it belongs to', 'default')
  .option('-n, --name <name>', 'a name to recognise it by', 'cli')
  .option('--e2b', 'write it as E2B\'s SDKs expect a key (e2b_ and hex); it works on every face')
  .action(async (o: { owner: string; name: string; e2b?: boolean }) => {
    const store = await serversStore(config());
    const { token: t, record } = await store.tokens.create(o.owner, o.name, o.e2b ? 'e2b' : 'forkpoint');
    process.stdout.write(`${t}\n`);
    process.stderr.write(`token ${record.id} for owner ${record.owner}\n`);
    await store.close();
  });
token
  .command('list')
  .description('List tokens (ids, owners, never secrets)')
  .action(async () => {
    const store = await serversStore(config());
    for (const r of await store.tokens.list()) {
      process.stdout.write(`${r.id}\t${r.owner}\t${r.name}\t${r.createdAt}\t${r.revokedAt ? `revoked ${r.revokedAt}` : 'active'}\n`);
    }
    await store.close();
  });
token
  .command('revoke <id>')
  .description('Revoke a token by id')
  .action(async (id: string) => {
    const store = await serversStore(config());
    const ok = await store.tokens.revoke(id);
    await store.close();
    if (!ok) {
      process.stderr.write(`no active token ${id}\n`);
      process.exit(1);
    }
  });

/** The running server this machine's CLI talks to, and a token for it. */
async function serverOf(cfg: Config, o: { url?: string; token?: string }): Promise<{ url: string; token: string }> {
  return {
    url: (o.url ?? process.env.FORKPOINT_URL ?? `http://127.0.0.1:${cfg.port}`).replace(/\/+$/, ''),
    token: o.token ?? process.env.FORKPOINT_TOKEN ?? (await readFile(new DataLayout(cfg.dataDir).initialTokenFile, 'utf8').catch(() => '')).trim(),
  };
}

program
  .command('drain')
  .description('Drain the server on this machine: it takes no new work and hands its instances over to the other nodes (each from a durable checkpoint of the moment, processes and all); prints what it handed over and kept')
  .option('--url <url>', 'the server (also FORKPOINT_URL); default: this machine\'s, on the configured port')
  .option('--token <token>', 'an operator\'s API token (also FORKPOINT_TOKEN); default: the first one the server made')
  .option('--timeout <seconds>', 'how long to wait for the drain to answer (each handover takes a checkpoint and its upload)', '3600')
  .action(async (o: { url?: string; token?: string; timeout: string }) => {
    const { url, token: t } = await serverOf(config(), o);
    const waitMs = Number(o.timeout) * 1000;
    if (!Number.isFinite(waitMs) || waitMs <= 0) throw new Error(`--timeout: not a number of seconds: ${o.timeout}`);
    const res = await request(`${url}/nodes/drain`, { method: 'POST', headers: { authorization: `Bearer ${t}` }, headersTimeout: waitMs, bodyTimeout: waitMs });
    const text = await res.body.text();
    process.stdout.write(`${text}\n`);
    if (res.statusCode !== 200) process.exitCode = 1;
  });

const image = program.command('image').description('Manage images (read-only rootfs trees, and images built on them)');
image
  .command('import <name> <file>')
  .description('Import an image: a `docker save` tarball, an OCI image layout tarball, or a rootfs tarball')
  .action(async (name: string, file: string) => {
    const cfg = config();
    const { layers } = await importImageArchive(new Images(new DataLayout(cfg.dataDir).images), new Mounter(cfg.agentPath), name, file);
    process.stderr.write(`imported ${name} (${layers} layer${layers === 1 ? '' : 's'})\n`);
  });
image
  .command('build <name> [context]')
  .description('Build an image from a Dockerfile in CONTEXT on the running server (its log as it runs); `image build debian` with no context (re)builds the Debian image from Debian\'s archive')
  .option('-f, --file <dockerfile>', 'the Dockerfile, relative to the context', 'Dockerfile')
  .option('--build-arg <arg...>', 'NAME=VALUE for an ARG')
  .option('--url <url>', 'the server (also FORKPOINT_URL); default: this machine\'s, on the configured port')
  .option('--token <token>', 'an API token (also FORKPOINT_TOKEN); default: the first one the server made')
  .action(async (name: string, context: string | undefined, o: { file: string; buildArg?: string[]; url?: string; token?: string }) => {
    const cfg = config();
    if (!context) {
      if (name !== 'debian') throw new Error('give a build context (a directory with a Dockerfile); only `debian` is built without one');
      await rebuildDebian(cfg);
      return;
    }
    const { url, token: tokenValue } = await serverOf(cfg, o);
    const args = Object.fromEntries((o.buildArg ?? []).map((a) => [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)]));
    const code = await buildOnServer({ url, token: tokenValue, name, context, dockerfile: o.file, buildArgs: args });
    process.exitCode = code;
  });
image
  .command('list')
  .action(async () => {
    const cfg = config();
    const images = new Images(new DataLayout(cfg.dataDir).images);
    await images.seedFrom(cfg.imageSeedDir);
    for (const i of await images.list()) process.stdout.write(`${i.name}\t${i.createdAt}\n`);
  });

/** Rebuilds the Debian image into the seed directory, and replaces this data directory's copy
 * (instances booted from now on get the new tree). */
async function rebuildDebian(cfg: Config): Promise<void> {
  const script = new URL('../deploy/debian.sh', import.meta.url).pathname;
  const seed = join(cfg.imageSeedDir, 'debian');
  await execa('bash', [script, '--force', seed], { stdio: 'inherit' });
  const images = new Images(new DataLayout(cfg.dataDir).images);
  if (images.exists('debian')) {
    const old = `${images.path('debian')}.old-${process.pid}`;
    await rename(images.path('debian'), old);
    await rm(old, { recursive: true, force: true });
  }
  await images.seedFrom(cfg.imageSeedDir);
}

program
  .command('openapi')
  .description('Print the OpenAPI document (or write it to a file)')
  .option('-o, --out <file>')
  .option('--openapi <version>', '3.1 (the contract) or 3.0 (the 3.0.3 rendition)', '3.1')
  .action(async (o: { out?: string; openapi: string }) => {
    if (o.openapi !== '3.1' && o.openapi !== '3.0') throw new Error('--openapi is 3.1 or 3.0');
    const text = await openApiText(o.openapi === '3.0' ? '3.0.3' : '3.1.0');
    if (o.out) await writeFile(o.out, text);
    else process.stdout.write(text);
  });

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

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('/cli.js')) {
  program.parseAsync().catch((err: Error) => {
    process.stderr.write(`forkpoint: ${err.message}\n`);
    process.exit(1);
  });
}
