import { readFileSync, writeFileSync } from 'node:fs';
import { chmod, mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';
import { EngineError } from '../seam/errors.js';
import { isMounted } from './overlay.js';
import { run } from './run.js';

const FORMAT_FILE = 'forkpoint-format';
const FORMAT = 3;
/** How many volumes a restore can mount (the core's VOLUMES_PER_INSTANCE). */
const VOLUME_SLOTS = 16;

export interface CriuVersion {
  version: string;
  ok: boolean;
}

/** CRIU, run through `fp-agent criu-run` so that its kernel-probe cache lives on a tmpfs
 * (`cacheDir`) even where /run is not one, and as an RPC worker (see criu-worker.ts). */
export class Criu {
  constructor(
    readonly path: string,
    private readonly cacheDir: string,
  ) {}

  /** Mounts the cache tmpfs once per boot of the machine; shared by every data directory. */
  async ensureCache(): Promise<void> {
    await mkdir(this.cacheDir, { recursive: true, mode: 0o700 });
    let failed: string | undefined;
    if (!(await isMounted(this.cacheDir))) {
      const r = await run('mount', ['-t', 'tmpfs', '-o', 'size=4m,mode=0700', 'forkpoint-criu', this.cacheDir]);
      if (r.code !== 0 && !(await isMounted(this.cacheDir))) failed = r.stderr.trim();
    }
    // The places a restore's volumes are mounted on in a worker's own namespace (volumeSlot):
    // CRIU opens them from inside a tree's user namespace, whose root must be able to reach
    // them (search, nothing more), unlike anything under the data directory.
    await chmod(this.cacheDir, 0o711);
    for (let i = 0; i < VOLUME_SLOTS; i++) await mkdir(join(this.cacheDir, 'volumes', String(i)), { recursive: true, mode: 0o711 });
    await chmod(join(this.cacheDir, 'volumes'), 0o711);
    // CRIU restoring a network namespace (a tree in a user namespace) wants iptables' lock file
    // in /run; missing, it unshares a mount namespace in the tree's root task, a copy of the
    // host's whole mount table (every sandbox's mounts), and mounts a tmpfs on /run there:
    // 2-3 ms of every such rollback and fork. The file here, readable by the tree's root, is
    // all it looks for; nothing of forkpoint's takes that lock.
    await writeFile(join(this.cacheDir, 'xtables.lock'), '', { flag: 'a', mode: 0o644 });
    if (failed !== undefined) throw new Error(`mount criu cache: ${failed}`);
  }

  /** Where a worker (whose /run is the cache) mounts a restore's `i`th volume for CRIU. */
  volumeSlot(i: number): string {
    if (!Number.isInteger(i) || i < 0 || i >= VOLUME_SLOTS) throw new EngineError('RESTORE_FAILED', `at most ${VOLUME_SLOTS} volumes per sandbox`);
    return `/run/volumes/${i}`;
  }

  /** The last answer of `criu --version`, for the binary as it was then. */
  private known: { binary: string; answer: CriuVersion | undefined } | undefined;

  /** CRIU's version, asked of the binary once per build of it: `/healthz` needs no token, and
   * each call of it must not start a process. */
  async version(): Promise<CriuVersion | undefined> {
    const st = await stat(this.path).catch(() => undefined);
    const binary = st ? `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}` : '';
    if (binary && this.known?.binary === binary) return this.known.answer;
    const r = await execa(this.path, ['--version'], { reject: false });
    const m = /Version:\s*(\S+)/.exec(r.stdout);
    const [major = 0, minor = 0] = m ? m[1]!.split('.').map(Number) : [];
    const answer = m ? { version: m[1]!, ok: major > 4 || (major === 4 && minor >= 2) } : undefined;
    if (binary) this.known = { binary, answer };
    return answer;
  }

  /** `criu check`: whether this kernel, with the privileges the server has, lets CRIU dump and
   * restore. Asked when the server starts, not when its image is built (a build has neither). */
  async check(): Promise<{ ok: boolean; output: string }> {
    const r = await execa(this.path, ['check'], { reject: false, timeout: 30_000, all: true });
    return { ok: r.exitCode === 0, output: (r.all ?? '').trim().split('\n').slice(-5).join('\n') };
  }

  /** `fp-agent criu-run --swrk`: a CRIU RPC worker, in the sandbox's netns (`netnsOf`, for a
   * dump) or a fresh one, which a restored tree inherits. */
  workerCommand(where: { netnsOf: number } | { fresh: true }): string[] {
    const netns = 'netnsOf' in where ? ['--netns-of', String(where.netnsOf)] : ['--new-netns'];
    return ['criu-run', '--cache', this.cacheDir, ...netns, '--swrk', '--', this.path];
  }

  /** `fp-agent criu-run -- criu lazy-pages`: serves the pages of `imagesDir` to the lazy restore
   * whose work directory is `workDir` (lazy-pages.ts), logging there; a byte in `readyFile` once
   * it listens. */
  lazyPagesCommand(imagesDir: string, workDir: string, readyFile: string): string[] {
    return ['criu-run', '--cache', this.cacheDir, '--ready-file', readyFile, '--', this.path, 'lazy-pages', '-D', imagesDir, '-W', workDir, '-o', 'lazy-pages.log'];
  }

  /** Whether this kernel and CRIU can restore lazily (userfaultfd with its fork and remap events). */
  async lazyPagesWork(): Promise<boolean> {
    const r = await execa(this.path, ['check', '--feature', 'uffd-noncoop'], { reject: false, timeout: 30_000 });
    return r.exitCode === 0;
  }

  /** Marks a memory image with the format it was made in: 2, CRIU inside the sandbox's netns
   * and /dev in the agent layer; 3, the sandbox confined (masked /proc, seccomp), which CRIU
   * carries in the image. */
  markFormat(imagesDir: string): void {
    writeFileSync(join(imagesDir, FORMAT_FILE), `${FORMAT}\n`);
  }

  /** Whether an image restores into a sandbox as confined as a fresh one. Older images would
   * bring back a tree without the masks and the filter: the engine boots on their files instead. */
  isCurrentFormat(imagesDir: string): boolean {
    try {
      return Number(readFileSync(join(imagesDir, FORMAT_FILE), 'utf8').trim()) >= FORMAT;
    } catch {
      return false;
    }
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
