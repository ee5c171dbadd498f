import { existsSync } from 'node:fs';
import fastifyStatic from '@fastify/static';
import type { FastifyInstance } from 'fastify';
import { UnavailableError } from '../core/errors.js';
import { packagePath } from '../lib/package-root.js';

/**
 * The web console at `/ui`: the files Vite built from ui/ (dist/ui), and nothing else. The page
 * signs in with an API token and calls the same API as every other client (the token is the
 * page's, kept in the tab's session storage); nothing here reads a token or the store. Every
 * answer carries a policy that lets the page run code from this origin alone: data shown on it
 * comes from sandboxes, so it is written as text, never as markup, and a script that got in anyway
 * could not run.
 */
const BUILT = `${packagePath('dist', 'ui')}/`;

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

export async function consoleRoutes(app: FastifyInstance): Promise<void> {
  // Its files need no token: they hold no data, and the sign-in page is one of them.
  app.addHook('onRoute', (route) => {
    route.config = { ...(route.config as object), scope: 'public' };
  });
  if (!existsSync(`${BUILT}index.html`)) {
    app.get('/ui/*', { schema: { hide: true } }, async () => {
      throw new UnavailableError('the web console is not built: run the set-up (bash deploy/setup.sh) or npm run build', { reason: 'CONSOLE_NOT_BUILT' });
    });
    return;
  }
  await app.register(fastifyStatic, {
    root: BUILT,
    prefix: '/ui/',
    index: 'index.html',
    redirect: false,
    dotfiles: 'deny',
    // Bundles are named by their content: a new build is new names, and index.html is asked again.
    cacheControl: false,
    setHeaders: (reply) => {
      reply.header('content-security-policy', CSP).header('x-content-type-options', 'nosniff').header('referrer-policy', 'no-referrer').header('cache-control', 'no-cache');
    },
  });
  // The plugin's route is /ui/*: the console's own address, without the slash, is the page too.
  app.get('/ui', { schema: { hide: true } }, (_req, reply) => reply.sendFile('index.html'));
}
