import { testSubnet } from './subnets.js';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { request } from 'undici';
import type { Reply } from './server.js';

const CLI = new URL('../../dist/cli.js', import.meta.url).pathname;

/** The real `forkpoint serve` as a child process, for tests that kill and restart it. */
export class ChildServer {
  private constructor(
    readonly proc: ChildProcess,
    readonly url: string,
    readonly token: string,
  ) {}

  /** `wrap`: a command the server runs under (setpriv with capabilities, say). */
  static async start(dataDir: string, token?: string, env: Record<string, string> = {}, wrap: string[] = []): Promise<ChildServer> {
    const argv = [...wrap, process.execPath, CLI, 'serve', '--port', '0', '--log-level', 'warn'];
    const proc = spawn(argv[0]!, argv.slice(1), {
      env: { ...process.env, FORKPOINT_DATA_DIR: dataDir, FORKPOINT_NETWORK_CIDR: testSubnet(dataDir), FORKPOINT_WARM_FORKS: '0', ...env },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const lines = createInterface({ input: proc.stdout! });
    let first = token;
    const url = await new Promise<string>((resolve, reject) => {
      proc.once('error', reject);
      const timer = setTimeout(() => reject(new Error('server did not start')), 30_000);
      proc.once('exit', (code) => reject(new Error(`server exited with ${code}`)));
      lines.on('line', (line) => {
        if (line.startsWith('fpk_')) first = line.trim();
        // The node's errors are the first thing to read when a test or bench of it fails.
        if (line.startsWith('{"level":5') || line.startsWith('{"level":6')) process.stderr.write(`[node ${env.FORKPOINT_NODE_ID ?? dataDir}] ${line}\n`);
        const m = /listening on (http:\/\/\S+)/.exec(line);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]!);
        }
      });
    }).catch((err: unknown) => {
      // A server that did not come up does not stay behind.
      proc.kill('SIGKILL');
      throw err;
    });
    if (!first) {
      proc.kill('SIGKILL');
      throw new Error('no token');
    }
    return new ChildServer(proc, url, first);
  }

  async api<T = any>(method: string, path: string, body?: unknown): Promise<Reply<T>> {
    const res = await request(this.url + path, {
      method: method as 'GET',
      headers: { authorization: `Bearer ${this.token}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.body.text();
    return { status: res.statusCode, body: text ? JSON.parse(text) : null };
  }

  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    if (this.proc.exitCode !== null) return;
    const exited = new Promise((r) => this.proc.once('exit', r));
    this.proc.kill(signal);
    await exited;
  }
}
