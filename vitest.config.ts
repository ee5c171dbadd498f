import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

// The suite drives real sandboxes (overlay, CRIU, namespaces) as root. Three files run at once:
// each server has its own data directory and subnet (test/helpers: subnetFor), and much of a
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
const FIRST = 'test/node-image.test.ts';
class NodeImageFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const first = (f: TestSpecification) => f.moduleId.endsWith(FIRST);
    return [...sorted.filter(first), ...sorted.filter((f) => !first(f))];
  }
}

export default defineConfig({
  test: {
    globalSetup: ['./test/helpers/leftovers.ts', './test/helpers/node-image-teardown.ts'],
    reporters: ['default', './test/helpers/summary-reporter.ts'],
    fileParallelism: true,
    sequence: { sequencer: NodeImageFirst },
    maxWorkers: 3,
    projects: [
      { test: { ...shared, name: 'engine', include: ['test/**/*.test.ts'], exclude: ALONE, sequence: { groupOrder: 0 } } },
      { test: { ...shared, name: 'alone', include: ALONE, sequence: { groupOrder: 1 } } },
    ],
  },
});
