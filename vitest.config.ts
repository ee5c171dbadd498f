import { defineConfig } from 'vitest/config';

// The suite drives real sandboxes (overlay, CRIU, namespaces) as root: files run one at a
// time so that two heavy files never share the machine's two cores.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['./test/helpers/leftovers.ts'],
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    reporters: ['default', './test/helpers/summary-reporter.ts'],
  },
});
