import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

// The console is served by the API server under /ui (src/http/console.ts), from dist/ui: every
// file it needs is in the bundle, nothing comes from elsewhere at run time.
export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  base: '/ui/',
  logLevel: 'warn',
  build: {
    outDir: fileURLToPath(new URL('../dist/ui', import.meta.url)),
    emptyOutDir: true,
    target: 'es2022',
    // No inline script or style: the page's policy runs code from files of this origin only.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
  },
});
