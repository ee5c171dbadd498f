import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';
import { CODE_INTERPRETER_ONLY } from './registry.js';

// The node image (deploy/Containerfile), built with no registry: its base is the Debian image the
// set-up made (Debian 13, whose nodejs is 20), imported into podman; the build reaches Debian's
// archive through the host's apt configuration (the "mirror the operator names") and takes the
// checkout's build as it is (FROM_CHECKOUT=1).
//
// test/node-image.test.ts builds it while the other files run (a minute of a run that used to be
// spent alone, at the end); test/node-container.test.ts, which must run alone, uses it, building
// it itself when run on its own. Named by the run (vitest.config.ts sets FORKPOINT_TEST_RUN), so
// that both files find the same image and two runs never share one; removed by the run's
// teardown (removeNodeImages) whichever files ran.

const IMAGES = '/opt/forkpoint/images';
const RUN = process.env.FORKPOINT_TEST_RUN ?? String(process.pid);
export const TAG = `fp-test-${RUN}`;
const BASE = `localhost/forkpoint-base:${TAG}`;
export const NODE_IMAGE = `localhost/forkpoint-node:${TAG}`;
const REPO = new URL('../..', import.meta.url).pathname;

// podman raises a container's open files to 1048576 by default, which a host whose root lacks
// CAP_SYS_RESOURCE (this one) cannot grant: the container gets the server's own limits.
export const podmanLimits = (() => {
  const text = readFileSync('/proc/self/limits', 'utf8');
  const hard = (name: string) => /^\S.*?\s{2,}\S+\s+(\S+)/.exec(text.split('\n').find((l) => l.startsWith(name)) ?? '')?.[1] ?? '4096';
  return ['--ulimit', `nofile=${hard('Max open files')}:${hard('Max open files')}`, '--ulimit', 'nproc=4096:4096'];
})();

export const podman = (...args: string[]) => execa('podman', ['--runtime', 'runc', ...args], { timeout: 300_000 });

/** podman and runc are there: their absence is a broken set-up (`npm test` installs both), not a skip. */
export async function requirePodman(): Promise<void> {
  for (const tool of ['podman', 'runc']) {
    await execa(tool, ['--version']).catch(() => {
      throw new Error(`${tool} is missing: run bash deploy/setup.sh --test`);
    });
  }
}

export async function nodeImageExists(): Promise<boolean> {
  return (await podman('image', 'exists', NODE_IMAGE).catch(() => ({ exitCode: 1 }))).exitCode === 0;
}

/** Builds the node image (and its base) unless this run has it already. */
export async function ensureNodeImage(): Promise<void> {
  await requirePodman();
  if (await nodeImageExists()) return;
  // The node's own system needs none of what only the code interpreter uses.
  const leftOut = CODE_INTERPRETER_ONLY.map((p) => `--exclude=${p}`).join(' ');
  await execa('sh', ['-c', `tar -C "$1" ${leftOut} -c . | podman import -q - "$2"`, 'import', join(IMAGES, 'debian'), BASE], { timeout: 300_000 });
  await podman('build', '-q', '--layers=false', '--network', 'host', ...podmanLimits,
    '-v', '/etc/apt/apt.conf.d:/etc/apt/apt.conf.d:ro',
    // CRIU_BUILD=0: Debian testing's CRIU binaries, not a minute of compiling forkpoint's; what
    // is tested here is the container's lifetime, and set-up builds forkpoint's CRIU on the host.
    '-f', 'deploy/Containerfile', '--build-arg', `BASE=${BASE}`, '--build-arg', 'FROM_CHECKOUT=1', '--build-arg', 'CRIU_BUILD=0',
    '-t', NODE_IMAGE, REPO);
}

/** The run's images, if any (the global teardown's). */
export async function removeNodeImages(): Promise<void> {
  const have = await execa('podman', ['image', 'ls', '-q', '--filter', `reference=*:${TAG}`], { reject: false }).catch(() => undefined);
  if (have?.exitCode === 0 && have.stdout.trim()) await podman('rmi', '-f', NODE_IMAGE, BASE).catch(() => undefined);
}
