// The server and CLI bundled, dist/cli.js and its chunks (over tsc's own dist/cli.js): a start
// read ~1,750 modules one by one (kysely alone is 256 files), which was most of its 1.3 s. Packages stay
// outside the bundle when they are native addons or find their own files at run time.
import { build } from 'esbuild';

const external = [
  'better-sqlite3', // native
  'node-pty', // native
  'pg-native', // optional native driver pg looks for
  '@aws-sdk/*', // loaded only when an object store is used
  'pino', // starts its transports as worker threads from its own files
  '@fastify/swagger', // reads its package.json by __dirname
  '@fastify/swagger-ui', // serves its assets from its own directory
  '@fastify/static',
];

await build({
  entryPoints: { cli: 'src/cli.ts' },
  outdir: 'dist',
  allowOverwrite: true,
  bundle: true,
  // What the CLI loads only for some commands (the server, MCP, builds) stays in chunks of its
  // own: a client command starts in ~0.1 s, not in the whole server's parse time.
  splitting: true,
  chunkNames: 'chunks/[name]-[hash]',
  platform: 'node',
  format: 'esm',
  target: 'node20',
  external,
  // CommonJS packages inside an ES module bundle still call require() for Node's own modules.
  banner: { js: "import { createRequire as __forkpointRequire } from 'node:module'; const require = __forkpointRequire(import.meta.url);" },
  logLevel: 'warning',
});
