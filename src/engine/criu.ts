import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';
import { EngineError } from './errors.js';

export interface CriuVersion {
  version: string;
  ok: boolean;
}

/** CRIU, run as a plain command. The restore side is started by the launcher under a shim. */
export class Criu {
  constructor(readonly path: string) {}

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
    const args = ['dump', '-t', String(pid), '-D', imagesDir, '-o', 'dump.log', '-v2',
      '--network-lock', 'skip', '--manage-cgroups=ignore'];
    if (opts.leaveRunning) args.push('--leave-running');
    const r = await execa(this.path, args, { reject: false });
    if (r.exitCode !== 0) {
      const log = await tail(join(imagesDir, 'dump.log'));
      throw new EngineError('DUMP_FAILED', `criu dump failed: ${lastError(log) ?? r.stderr.trim()}`, log);
    }
  }

  restoreArgs(imagesDir: string, workDir: string, root: string, pidfile: string): string[] {
    return [this.path, 'restore', '-d', '-D', imagesDir, '-W', workDir, '-o', 'restore.log', '-v2',
      '--root', root, '--pidfile', pidfile, '--manage-cgroups=ignore'];
  }
}

export async function tail(file: string, lines = 40): Promise<string> {
  const text = await readFile(file, 'utf8').catch(() => '');
  return text.split('\n').slice(-lines).join('\n');
}

/** Lines CRIU logs as errors on every run here: no iptables on the host, no RLIMIT_NOFILE raise. */
export const HARMLESS = /rlimit|iptables|ip6tables|nftables|(Dumping|Restoring) FAILED/;

/** CRIU's own words for what went wrong: the first "Error" line of its log that matters (the cause; later ones are consequences). */
export function lastError(log: string): string | undefined {
  return log
    .split('\n')
    .find((l) => /Error/.test(l) && !HARMLESS.test(l))
    ?.replace(/^\(\d+\.\d+\)\s*/, '')
    .trim();
}
