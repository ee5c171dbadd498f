import { existsSync, readFileSync, statSync } from 'node:fs';
import { mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';

import { EMPTY_IMAGE_CONFIG, IMAGE_NAME, type ImageConfig, type SystemImages } from '../seam/runtime.js';

export { EMPTY_IMAGE_CONFIG, IMAGE_NAME, type ImageConfig } from '../seam/runtime.js';

/** The directory of an image pulled from a registry: its digest's. */
const PULLED = /^sha256-[0-9a-f]{56}$/;

/** Read-only rootfs trees, one directory per image. An image is a lower layer of every
 * instance on it, so it is never changed in place: a re-import is a new name. */
export class Images implements SystemImages {
  constructor(private readonly dir: string) {}

  path(name: string): string {
    return join(this.dir, name);
  }

  /** A system image: one of set-up's or an operator's. Pulled images (`sha256-…`, by digest)
   * are reached through an owner's pull only: their names would tell one owner what another pulled. */
  exists(name: string): boolean {
    return IMAGE_NAME.test(name) && !PULLED.test(name) && existsSync(this.path(name));
  }

  present(name: string): boolean {
    return IMAGE_NAME.test(name) && existsSync(this.path(name));
  }

  /** What changes when the image is rebuilt or replaced (its directory is a new one). */
  identity(name: string): string {
    const st = statSync(this.path(name));
    return `${st.ino}-${st.mtimeMs}`;
  }

  createdAt(name: string): string {
    return statSync(this.path(name)).mtime.toISOString();
  }

  private configFile(name: string): string {
    return join(this.dir, '.config', `${name}.json`);
  }

  /** The configuration an imported image came with (an OCI config's Env, WorkingDir, Cmd...),
   * kept beside the tree, not in it: a sandbox cannot change it. */
  config(name: string): ImageConfig | undefined {
    try {
      return { ...EMPTY_IMAGE_CONFIG, ...(JSON.parse(readFileSync(this.configFile(name), 'utf8')) as Partial<ImageConfig>) };
    } catch {
      return undefined;
    }
  }

  async setConfig(name: string, config: ImageConfig): Promise<void> {
    await mkdir(join(this.dir, '.config'), { recursive: true });
    await writeFile(this.configFile(name), JSON.stringify(config, null, 2));
  }

  async list(): Promise<{ name: string; createdAt: string }[]> {
    if (!existsSync(this.dir)) return [];
    const names = (await readdir(this.dir)).filter((n) => IMAGE_NAME.test(n) && !PULLED.test(n));
    return Promise.all(
      names.map(async (name) => ({ name, createdAt: (await stat(this.path(name))).mtime.toISOString() })),
    );
  }

  async pulled(): Promise<string[]> {
    if (!existsSync(this.dir)) return [];
    return (await readdir(this.dir)).filter((n) => PULLED.test(n));
  }

  /** Out of sight at once (renamed into the images' own trash, one filesystem), deleted behind. */
  async removePulled(name: string): Promise<void> {
    if (!PULLED.test(name) || !existsSync(this.path(name))) return;
    const trash = join(this.dir, `.trash-${name}-${Date.now()}`);
    await rename(this.path(name), trash);
    await rm(this.configFile(name), { force: true });
    void rm(trash, { recursive: true, force: true }).catch(() => {});
  }

  /** Copies images from a seed directory (built at set-up) that this data directory lacks.
   * Hard links where the filesystems allow it: images are immutable, so sharing is safe. One
   * that does not fit (a small data disk) is left out, and said so: the others still come. */
  async seedFrom(seedDir: string): Promise<{ name: string; error: string }[]> {
    if (!existsSync(seedDir)) return [];
    await mkdir(this.dir, { recursive: true });
    const failed: { name: string; error: string }[] = [];
    for (const name of await readdir(seedDir)) {
      if (!IMAGE_NAME.test(name) || existsSync(this.path(name))) continue;
      const tmp = join(this.dir, `.seed-${name}-${process.pid}`);
      await rm(tmp, { recursive: true, force: true });
      const linked = await execa('cp', ['-al', join(seedDir, name), tmp], { reject: false });
      if (linked.exitCode !== 0) {
        await rm(tmp, { recursive: true, force: true });
        const copied = await execa('cp', ['-a', join(seedDir, name), tmp], { reject: false });
        if (copied.exitCode !== 0) {
          await rm(tmp, { recursive: true, force: true });
          failed.push({ name, error: copied.stderr.split('\n')[0] ?? 'cp failed' });
          continue;
        }
      }
      await rename(tmp, this.path(name));
    }
    const seedConfigs = join(seedDir, '.config');
    if (existsSync(seedConfigs)) await execa('cp', ['-a', `${seedConfigs}/.`, join(this.dir, '.config')], { reject: false });
    return failed;
  }
}
