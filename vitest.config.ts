import { defineConfig } from 'vitest/config';

// The suite drives real sandboxes (overlay, CRIU, namespaces) as root. Two files run at once:
// each server has its own data directory and subnet (test/helpers: subnetFor), and most of a
// file's time is spent waiting on sandboxes, not computing. Measured on 2 cores: 313 s with
// two workers against 610-640 s one file at a time, the same 396 tests passing.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['./test/helpers/leftovers.ts'],
    fileParallelism: true,
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    reporters: ['default', './test/helpers/summary-reporter.ts'],
  },
});
