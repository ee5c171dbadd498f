// The server and CLI as one file, dist/cli.js (over tsc's own dist/cli.js): a start read ~1,750
// modules one by one (kysely alone is 256 files), which was most of its 1.3 s. Packages stay
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
  entryPoints: ['src/cli.ts'],
  outfile: 'dist/cli.js',
  allowOverwrite: true,
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node20',
  external,
  // CommonJS packages inside an ES module bundle still call require() for Node's own modules.
  banner: { js: "import { createRequire as __forkpointRequire } from 'node:module'; const require = __forkpointRequire(import.meta.url);" },
  logLevel: 'warning',
});
