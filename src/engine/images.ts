import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { copyFile, mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';

import { EngineError } from '../seam/errors.js';
import { EMPTY_BASE, EMPTY_IMAGE_CONFIG, IMAGE_NAME, type ImageConfig, type SystemImages } from '../seam/runtime.js';

export { EMPTY_IMAGE_CONFIG, IMAGE_NAME, type ImageConfig } from '../seam/runtime.js';

/** How long linking (or, across filesystems, copying) a set-up image may take: Debian's is 2 s
 * linked and under a minute copied on this project's machines. */
const LINK_DEADLINE_MS = 10 * 60_000;

/** The directory of an image pulled from a registry: its digest's. */
const PULLED = /^sha256-[0-9a-f]{56}$/;

/** Read-only rootfs trees, one directory per image. An image is a lower layer of every
 * instance on it, so it is never changed in place: a re-import is a new name.
 *
 * Set-up's images (the seed directory) are this data directory's too, but are linked in only
 * when a sandbox first mounts one (`materialize`): hard-linking Debian's 56,000 files took 2 s of
 * every first start, and a data directory that never boots Debian never needs them. Until then
 * its name, configuration and identity are the seed's; once linked, the copy keeps the seed's
 * identity, so that what was keyed on the image (build steps, templates) stays valid. */
export class Images implements SystemImages {
  private readonly linking = new Map<string, Promise<void>>();

  constructor(
    private readonly dir: string,
    private readonly seedDir?: string,
  ) {}

  path(name: string): string {
    return join(this.dir, name);
  }

  /** The seed's tree of a set-up image not linked in here yet. */
  private unlinkedSeed(name: string): string | undefined {
    if (!this.seedDir || !IMAGE_NAME.test(name) || PULLED.test(name) || existsSync(this.path(name))) return undefined;
    const seed = join(this.seedDir, name);
    return existsSync(seed) ? seed : undefined;
  }

  /** A system image: one of set-up's or an operator's. Pulled images (`sha256-…`, by digest)
   * are reached through an owner's pull only: their names would tell one owner what another pulled. */
  exists(name: string): boolean {
    return IMAGE_NAME.test(name) && !PULLED.test(name) && (existsSync(this.path(name)) || this.unlinkedSeed(name) !== undefined);
  }

  present(name: string): boolean {
    if (name === EMPTY_BASE) return true;
    return IMAGE_NAME.test(name) && (existsSync(this.path(name)) || this.unlinkedSeed(name) !== undefined);
  }

  /** What changes when the image is rebuilt or replaced (its directory is a new one). */
  identity(name: string): string {
    const seed = this.unlinkedSeed(name);
    if (seed) return identityOf(seed);
    try {
      return readFileSync(this.identityFile(name), 'utf8').trim();
    } catch {
      return identityOf(this.path(name));
    }
  }

  createdAt(name: string): string {
    return statSync(this.unlinkedSeed(name) ?? this.path(name)).mtime.toISOString();
  }

  /** The image's tree in this data directory, linked in from the seed first if it is one of
   * set-up's not linked yet (hard links where the filesystems allow, a copy where not). Two
   * callers at once share one linking. */
  async materialize(name: string): Promise<void> {
    if (name === EMPTY_BASE) {
      await mkdir(this.path(name), { recursive: true, mode: 0o755 });
      return;
    }
    const seed = this.unlinkedSeed(name);
    if (!seed) return;
    let p = this.linking.get(name);
    if (!p) {
      p = this.link(name, seed).finally(() => this.linking.delete(name));
      this.linking.set(name, p);
    }
    await p;
  }

  private async link(name: string, seed: string): Promise<void> {
    const tmp = join(this.dir, `.seed-${name}-${process.pid}`);
    await mkdir(this.dir, { recursive: true });
    await rm(tmp, { recursive: true, force: true });
    const identity = identityOf(seed);
    const cp = (flags: string) => execa('cp', [flags, seed, tmp], { reject: false, timeout: LINK_DEADLINE_MS });
    let done = await cp('-al');
    if (done.exitCode !== 0 && !done.timedOut) {
      await rm(tmp, { recursive: true, force: true });
      done = await cp('-a');
    }
    if (done.exitCode !== 0) {
      await rm(tmp, { recursive: true, force: true });
      if (done.timedOut) throw new EngineError('TIMEOUT', `set-up's image ${name} was not copied into the data directory within ${LINK_DEADLINE_MS / 60_000} min`);
      throw new EngineError('MOUNT_FAILED', `set-up's image ${name} could not be copied into the data directory: ${done.stderr.split('\n')[0] || 'cp failed'}`);
    }
    const seedConfig = join(this.seedDir!, '.config', `${name}.json`);
    await mkdir(join(this.dir, '.config'), { recursive: true });
    if (existsSync(seedConfig) && !existsSync(this.configFile(name))) await copyFile(seedConfig, this.configFile(name));
    await writeFile(this.identityFile(name), identity);
    await rename(tmp, this.path(name));
  }

  /** Where the seed is on another filesystem than the data directory, its images are copied,
   * not linked: a gigabyte for Debian, too long for a sandbox's first boot to wait for. They are
   * copied from now on, in the background (a boot that comes first waits for its image's). */
  copyAheadAcrossFilesystems(failed: (name: string, err: Error) => void): void {
    if (!this.seedDir || !existsSync(this.seedDir)) return;
    try {
      if (statSync(this.seedDir).dev === statSync(this.dir).dev) return;
    } catch {
      return;
    }
    for (const name of readdirSync(this.seedDir)) {
      if (this.unlinkedSeed(name)) this.materialize(name).catch((err: Error) => failed(name, err));
    }
  }

  /** Drops the data directory's copy of a set-up image: the seed's tree is linked in again when
   * next mounted. A sandbox running on the old copy loses the files under it (its lower is
   * removed): `image build debian` is for a data directory with none running on it. */
  async unlink(name: string): Promise<void> {
    if (!this.seedDir || !existsSync(join(this.seedDir, name)) || !existsSync(this.path(name))) return;
    const old = join(this.dir, `.old-${name}-${process.pid}`);
    await rename(this.path(name), old);
    await rm(this.identityFile(name), { force: true });
    await rm(old, { recursive: true, force: true });
  }

  /** Linkings and unlinkings a server killed half-way left (one server per data directory:
   * none is under way). */
  async sweep(): Promise<void> {
    if (!existsSync(this.dir)) return;
    for (const n of await readdir(this.dir)) if (n.startsWith('.seed-') || n.startsWith('.old-')) await rm(join(this.dir, n), { recursive: true, force: true });
  }

  private identityFile(name: string): string {
    return join(this.dir, '.config', `${name}.identity`);
  }

  private configFile(name: string): string {
    return join(this.dir, '.config', `${name}.json`);
  }

  /** The configuration an imported image came with (an OCI config's Env, WorkingDir, Cmd...),
   * kept beside the tree, not in it: a sandbox cannot change it. */
  config(name: string): ImageConfig | undefined {
    const file = this.unlinkedSeed(name) ? join(this.seedDir!, '.config', `${name}.json`) : this.configFile(name);
    try {
      return { ...EMPTY_IMAGE_CONFIG, ...(JSON.parse(readFileSync(file, 'utf8')) as Partial<ImageConfig>) };
    } catch {
      return undefined;
    }
  }

  async setConfig(name: string, config: ImageConfig): Promise<void> {
    await mkdir(join(this.dir, '.config'), { recursive: true });
    await writeFile(this.configFile(name), JSON.stringify(config, null, 2));
  }

  async list(): Promise<{ name: string; createdAt: string }[]> {
    const namesIn = async (dir: string | undefined) => (dir && existsSync(dir) ? (await readdir(dir)).filter((n) => IMAGE_NAME.test(n) && !PULLED.test(n)) : []);
    const names = [...new Set([...(await namesIn(this.dir)), ...(await namesIn(this.seedDir))])].sort();
    return Promise.all(
      names.map(async (name) => ({ name, createdAt: (await stat(this.unlinkedSeed(name) ?? this.path(name))).mtime.toISOString() })),
    );
  }

  /** Pulled images here: a tree (pulled whole, by an older forkpoint) or, for one pulled layer
   * by layer, the configuration kept by its digest. */
  async pulled(): Promise<string[]> {
    const names = async (dir: string, suffix: string) =>
      existsSync(dir) ? (await readdir(dir)).filter((n) => n.endsWith(suffix)).map((n) => n.slice(0, n.length - suffix.length)).filter((n) => PULLED.test(n)) : [];
    return [...new Set([...(await names(this.dir, '')), ...(await names(join(this.dir, '.config'), '.json'))])].sort();
  }

  /** Out of sight at once (renamed into the images' own trash, one filesystem), deleted behind. */
  async removePulled(name: string): Promise<void> {
    if (!PULLED.test(name)) return;
    await rm(this.configFile(name), { force: true });
    if (!existsSync(this.path(name))) return;
    const trash = join(this.dir, `.trash-${name}-${Date.now()}`);
    await rename(this.path(name), trash);
    void rm(trash, { recursive: true, force: true }).catch(() => {});
  }
}

function identityOf(tree: string): string {
  const st = statSync(tree);
  return `${st.ino}-${st.mtimeMs}`;
}
