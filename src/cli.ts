#!/usr/bin/env node
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { pino } from 'pino';
import { loadConfig, type Config } from './config.js';
import { Forkpoint } from './core/forkpoint.js';
import { openStore } from './store/index.js';
import { Images } from './engine/images.js';
import { DataLayout } from './engine/layout.js';
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

function config(extra: Partial<Record<keyof Config, unknown>> = {}): Config {
  const g = program.opts<GlobalFlags>();
  return loadConfig({ file: g.config, flags: { dataDir: g.dataDir, ...extra } });
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
    const fp = await Forkpoint.open(cfg, log, VERSION);
    await fp.start();
    const token = await fp.ensureInitialToken();
    if (token) {
      process.stdout.write(`forkpoint: created the first API token (also in ${fp.engine.layout.initialTokenFile}, mode 0600):\n${token}\n`);
    }
    const app = await buildApp({ forkpoint: fp, logger: log, bodyLimitBytes: cfg.bodyLimitBytes });
    const address = await app.listen({ port: cfg.port, host: cfg.host });
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
  .action((o: { owner: string; name: string }) => {
    const store = openStore(new DataLayout(config().dataDir).db);
    const { token: t, record } = store.tokens.create(o.owner, o.name);
    process.stdout.write(`${t}\n`);
    process.stderr.write(`token ${record.id} for owner ${record.owner}\n`);
    store.close();
  });
token
  .command('list')
  .description('List tokens (ids, owners, never secrets)')
  .action(() => {
    const store = openStore(new DataLayout(config().dataDir).db);
    for (const r of store.tokens.list()) {
      process.stdout.write(`${r.id}\t${r.owner}\t${r.name}\t${r.createdAt}\t${r.revokedAt ? `revoked ${r.revokedAt}` : 'active'}\n`);
    }
    store.close();
  });
token
  .command('revoke <id>')
  .description('Revoke a token by id')
  .action((id: string) => {
    const store = openStore(new DataLayout(config().dataDir).db);
    const ok = store.tokens.revoke(id);
    store.close();
    if (!ok) {
      process.stderr.write(`no active token ${id}\n`);
      process.exit(1);
    }
  });

const image = program.command('image').description('Manage images (read-only rootfs trees)');
image
  .command('import <name> <tarball>')
  .description('Import a rootfs tarball as a named image')
  .action(async (name: string, tarball: string) => {
    await new Images(new DataLayout(config().dataDir).images).import(name, tarball);
  });
image
  .command('list')
  .action(async () => {
    const cfg = config();
    const images = new Images(new DataLayout(cfg.dataDir).images);
    await images.seedFrom(cfg.imageSeedDir);
    for (const i of await images.list()) process.stdout.write(`${i.name}\t${i.createdAt}\n`);
  });

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
    const fp = await Forkpoint.open(cfg, pino({ level: 'silent' }), VERSION);
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
