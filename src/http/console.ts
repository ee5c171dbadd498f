import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type { FastifyInstance, FastifyReply } from 'fastify';
import { NotFoundError, UnavailableError } from '../core/errors.js';

/**
 * The web console at `/ui`: static files only. The page signs in with an API token and calls the
 * same API as every other client (the token is the page's, kept in the tab's session storage);
 * nothing here reads the token or the store. Files are served from a fixed table, never from a
 * path the request names, and every answer carries a policy that lets the page load code from this
 * origin alone: data shown on it comes from sandboxes, so it is written as text, never as markup,
 * and a script that got in anyway could not run.
 */
const require = createRequire(import.meta.url);
const ROOT = new URL('../../', import.meta.url).pathname;
const xtermDir = dirname(require.resolve('@xterm/xterm/package.json'));
const fitDir = dirname(require.resolve('@xterm/addon-fit/package.json'));

const JS = 'text/javascript; charset=utf-8';
const FILES: Record<string, { path: string; type: string }> = {
  'index.html': { path: join(ROOT, 'ui/index.html'), type: 'text/html; charset=utf-8' },
  'console.css': { path: join(ROOT, 'ui/console.css'), type: 'text/css; charset=utf-8' },
  'favicon.svg': { path: join(ROOT, 'ui/favicon.svg'), type: 'image/svg+xml' },
  'vendor/xterm.mjs': { path: join(xtermDir, 'lib/xterm.mjs'), type: JS },
  'vendor/xterm.css': { path: join(xtermDir, 'css/xterm.css'), type: 'text/css; charset=utf-8' },
  'vendor/addon-fit.mjs': { path: join(fitDir, 'lib/addon-fit.mjs'), type: JS },
};
/** The page's own modules, compiled from ui/src by ui/tsconfig.json. */
const MODULES = ['api', 'app', 'dom', 'events', 'files', 'instance', 'instances', 'lineage', 'terminal'];
for (const m of MODULES) FILES[`${m}.js`] = { path: join(ROOT, `dist/ui/${m}.js`), type: JS };

/** Code from this origin only; xterm.js sets styles inline; WebSockets to this host (the terminal). */
const CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data: blob:",
  "font-src 'self'",
  "connect-src 'self' ws: wss:",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

const cache = new Map<string, Buffer>();

async function serve(reply: FastifyReply, name: string): Promise<FastifyReply> {
  const file = FILES[name];
  if (!file) throw new NotFoundError('console file', name);
  let body = cache.get(name);
  if (!body) {
    body = await readFile(file.path).catch((cause: unknown) => {
      throw new UnavailableError(`the console is not built (${name} is missing): run the set-up, bash deploy/setup.sh`, { reason: 'CONSOLE_NOT_BUILT' }, { cause });
    });
    cache.set(name, body);
  }
  return reply
    .header('content-type', file.type)
    .header('content-security-policy', CSP)
    .header('x-content-type-options', 'nosniff')
    .header('referrer-policy', 'no-referrer')
    .header('cache-control', 'no-cache')
    .send(body);
}

export async function consoleRoutes(app: FastifyInstance): Promise<void> {
  const route = { config: { scope: 'public' as const }, schema: { hide: true } };
  app.get('/ui', route, async (_req, reply) => serve(reply, 'index.html'));
  app.get<{ Params: { file: string } }>('/ui/:file', route, async (req, reply) => serve(reply, req.params.file));
  app.get<{ Params: { file: string } }>('/ui/vendor/:file', route, async (req, reply) => serve(reply, `vendor/${req.params.file}`));
}
