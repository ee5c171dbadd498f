import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import { execa } from 'execa';

const SCRIPT = new URL('../fixtures/testhost.mjs', import.meta.url).pathname;
const ROOT = new URL('../..', import.meta.url).pathname;

export interface TestHost {
  /** Its address (private: instances reach it only when they allow it). */
  address: string;
  /** The name its DNS answers for it. */
  name: string;
  /** Also served by it: stands in for the cloud metadata address. */
  metadata: string;
  /** Its network namespace (`ip netns exec` it to look at its side of a connection). */
  netns: string;
  close(): Promise<void>;
}

const run = (cmd: string, args: string[]) => execa(cmd, args, { timeout: 10_000 });

/**
 * "The internet" for the network tests: a network namespace of the test's own, linked to the
 * host by a veth pair on 172.31.<n>.0/30, running test/fixtures/testhost.mjs (HTTP on :80, DNS on
 * :53; HTTPS on :443 with `tlsDir`'s cert.pem and key.pem). It also holds 169.254.169.254, routed to it from the host, so that a sandbox that could
 * reach the metadata address would find a server there.
 */
export async function startTestHost(opts: { tlsDir?: string } = {}): Promise<TestHost> {
  const tag = randomBytes(3).toString('hex');
  const ns = `fpt-${tag}`;
  const hostIf = `fpt${tag}h`;
  const n = 16 + (parseInt(tag, 16) % 200);
  const hostSide = `172.31.${n}.1`;
  const address = `172.31.${n}.2`;
  const metadata = '169.254.169.254';
  let child: ChildProcess | undefined;
  const close = async () => {
    child?.kill('SIGKILL');
    await execa('ip', ['route', 'del', `${metadata}/32`, 'via', address], { reject: false });
    await execa('ip', ['netns', 'del', ns], { reject: false });
    await execa('ip', ['link', 'del', hostIf], { reject: false });
  };
  try {
    await run('ip', ['netns', 'add', ns]);
    await run('ip', ['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    await run('ip', ['addr', 'add', `${hostSide}/30`, 'dev', hostIf]);
    await run('ip', ['link', 'set', hostIf, 'up']);
    await run('ip', ['-n', ns, 'addr', 'add', `${address}/30`, 'dev', 'eth0']);
    await run('ip', ['-n', ns, 'addr', 'add', `${metadata}/32`, 'dev', 'eth0']);
    await run('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
    await run('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
    await run('ip', ['-n', ns, 'route', 'add', 'default', 'via', hostSide]);
    await run('ip', ['route', 'replace', `${metadata}/32`, 'via', address]);
    child = spawn('ip', ['netns', 'exec', ns, process.execPath, SCRIPT, address, ...(opts.tlsDir ? [opts.tlsDir] : [])], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
    const ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('the test host did not start')), 10_000);
      createInterface({ input: child!.stdout! }).on('line', (l) => l === 'ready' && (clearTimeout(timer), resolve()));
      child!.once('exit', (code) => reject(new Error(`the test host exited (${code})`)));
    });
    await ready;
  } catch (err) {
    await close();
    throw err;
  }
  return { address, name: 'testhost.internal', metadata, netns: ns, close };
}
