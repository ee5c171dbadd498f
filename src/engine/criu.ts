import { readdirSync } from 'node:fs';
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';
import { EngineError } from './errors.js';
import { isMounted } from './overlay.js';
import { run } from './run.js';

export interface CriuVersion {
  version: string;
  ok: boolean;
}

/** CRIU, run through `fp-agent criu-run` so that its kernel-probe cache lives on a tmpfs
 * (`cacheDir`) even where /run is not one. The restore side is started under a shim. */
export class Criu {
  constructor(
    readonly path: string,
    private readonly helper: string,
    private readonly cacheDir: string,
  ) {}

  private command(netns: string[], args: string[]): string[] {
    return [this.helper, 'criu-run', '--cache', this.cacheDir, ...netns, '--', this.path, ...args];
  }

  /** Mounts the cache tmpfs once per boot of the machine; shared by every data directory. */
  async ensureCache(): Promise<void> {
    await mkdir(this.cacheDir, { recursive: true, mode: 0o700 });
    if (await isMounted(this.cacheDir)) return;
    const r = await run('mount', ['-t', 'tmpfs', '-o', 'size=4m,mode=0700', 'forkpoint-criu', this.cacheDir]);
    if (r.code !== 0 && !(await isMounted(this.cacheDir))) throw new Error(`mount criu cache: ${r.stderr.trim()}`);
  }

  async version(): Promise<CriuVersion | undefined> {
    const r = await execa(this.path, ['--version'], { reject: false });
    const m = /Version:\s*(\S+)/.exec(r.stdout);
    if (!m) return undefined;
    const [major = 0, minor = 0] = m[1]!.split('.').map(Number);
    return { version: m[1]!, ok: major > 4 || (major === 4 && minor >= 2) };
  }

  async check(): Promise<boolean> {
    const r = await execa(this.path, ['check'], { reject: false });
    return r.exitCode === 0;
  }

  /** Dumps the process tree rooted at `pid` into `imagesDir`. Without `leaveRunning` the tree is
   * gone afterwards; on failure CRIU resumes it as it was. */
  async dump(pid: number, imagesDir: string, opts: { leaveRunning?: boolean } = {}): Promise<void> {
    // CRIU runs inside the sandbox's netns, which it then leaves out of the image: it holds
    // only lo, and a restore gets a fresh one (see native/criu_run.c).
    const args = ['dump', '-t', String(pid), '-D', imagesDir, '-o', 'dump.log', '-v2',
      '--network-lock', 'skip', '--manage-cgroups=ignore'];
    if (opts.leaveRunning) args.push('--leave-running');
    const [file, ...rest] = this.command(['--netns-of', String(pid)], args);
    const r = await run(file!, rest);
    if (r.code !== 0) {
      const log = await tail(join(imagesDir, 'dump.log'));
      throw new EngineError('DUMP_FAILED', `criu dump failed: ${lastError(log) ?? r.stderr.trim()}`, log);
    }
  }

  /** Images made before CRIU ran inside the sandbox's netns carry an (empty) netns of their own. */
  hasOwnNetns(imagesDir: string): boolean {
    return readdirSync(imagesDir).some((f) => f.startsWith('netns-'));
  }

  restoreArgs(imagesDir: string, workDir: string, root: string, pidfile: string): string[] {
    const args = ['restore', '-d', '-D', imagesDir, '-W', workDir, '-o', 'restore.log', '-v2',
      '--root', root, '--pidfile', pidfile, '--manage-cgroups=ignore'];
    if (this.hasOwnNetns(imagesDir)) return this.command([], [...args, '--empty-ns', 'net']);
    return this.command(['--new-netns'], args);
  }
}

export async function tail(file: string, lines = 40): Promise<string> {
  const text = await readFile(file, 'utf8').catch(() => '');
  return text.split('\n').slice(-lines).join('\n');
}

/** Lines CRIU logs as errors on every run here: no iptables on the host, no RLIMIT_NOFILE raise. */
export const HARMLESS = /already assigned|rlimit|iptables|ip6tables|nftables|(Dumping|Restoring) FAILED/;

/** CRIU's own words for what went wrong: the first "Error" line of its log that matters (the cause; later ones are consequences). */
export function lastError(log: string): string | undefined {
  return log
    .split('\n')
    .find((l) => /Error/.test(l) && !HARMLESS.test(l))
    ?.replace(/^\(\d+\.\d+\)\s*/, '')
    .trim();
}
