import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

// The suite drives real sandboxes (overlay, CRIU, namespaces) as root. Three files run at once:
// each server has its own data directory and subnet (test/helpers/subnets.ts), and much of a
// file's time is spent waiting on sandboxes, not computing. Measured on 2 cores: 313 s with
// two workers against 610-640 s one file at a time, the same 396 tests passing; later, 650
// tests from a fresh clone, 464 s with three workers against 531 s with two (the files' own
// summed time grew from 1022 to 1307 s: the cores are shared, not idle).
//
// The node-container test runs alone, after the rest: its node image is Debian 13's, whose nft
// writes rules the host's older nft (Debian 12's 1.0.6) crashes on (SIGSEGV, no output) when it
// reads the ruleset, which every other server here does at start (seen: five kill -9 tests
// failing with "nft: " while it ran). README, "Running on Kubernetes", says so for operators.
//
// Files are not isolated: a worker imports the server's modules once, not once a file (vitest's
// "import" time went from 100-150 s to 13 s summed over the files; the suite from 666 to 633 s,
// all 621 tests passing). It can be: no file mocks a module or keeps state in one, and each
// builds its own servers.
const shared = { testTimeout: 60_000, hookTimeout: 60_000, isolate: false };
const ALONE = ['test/node-container.test.ts'];

// Its podman image is built by test/node-image.test.ts while the other files run (a minute of
// import and build that node-container.test.ts spent alone, at the end), so that file goes first
// (vitest would start it last: it is small, and a fresh clone has no durations cached). Both
// name the image by this run (helpers/node-image.ts); workers inherit the variable.
process.env.FORKPOINT_TEST_RUN ??= String(process.pid);
// Then the longest files, longest first, so that none of them starts last and runs on alone
// (vitest orders a fresh clone's files by size: the soak test, 80 s, started two thirds through).
// Seconds in a fresh clone's run of 2026-11-28; the rest follow in vitest's order.
const FIRST = [
  'test/node-image.test.ts', // 115
  'test/crash-phases.test.ts', // 120
  'test/cluster.test.ts', // 113
  'test/registry.test.ts', // 98
  'test/images.test.ts', // 95
  'test/restart.test.ts', // 81
  'test/soak.test.ts', // 79
  'test/e2b.test.ts', // 55
  'test/partition.test.ts', // 44
  'test/clients.test.ts', // 43
];
class LongestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const rank = (f: TestSpecification) => {
      const i = FIRST.findIndex((name) => f.moduleId.endsWith(name));
      return i < 0 ? FIRST.length : i;
    };
    return sorted.map((f, i) => ({ f, i })).sort((a, b) => rank(a.f) - rank(b.f) || a.i - b.i).map(({ f }) => f);
  }
}

export default defineConfig({
  test: {
    globalSetup: ['./test/helpers/leftovers.ts', './test/helpers/node-image-teardown.ts'],
    reporters: ['default', './test/helpers/summary-reporter.ts'],
    fileParallelism: true,
    sequence: { sequencer: LongestFirst },
    maxWorkers: 3,
    projects: [
      { test: { ...shared, name: 'engine', include: ['test/**/*.test.ts'], exclude: ALONE, sequence: { groupOrder: 0 } } },
      { test: { ...shared, name: 'alone', include: ALONE, sequence: { groupOrder: 1 } } },
    ],
  },
});
