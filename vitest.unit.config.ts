import { defineConfig } from 'vitest/config';

// The fast tests: no root, no engine, no sandboxes. `npm run test:unit`; `npm test` runs them
// too, with everything else.
export default defineConfig({
  test: {
    include: ['test/unit/**/*.test.ts'],
    testTimeout: 20_000,
  },
});
