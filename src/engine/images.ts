import { existsSync } from 'node:fs';
import { mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';
import { EngineError } from './errors.js';

export const IMAGE_NAME = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/** Read-only rootfs trees, one directory per image. An image is a lower layer of every
 * instance on it, so it is never changed in place: a re-import is a new name. */
export class Images {
  constructor(private readonly dir: string) {}

  path(name: string): string {
    return join(this.dir, name);
  }

  exists(name: string): boolean {
    return IMAGE_NAME.test(name) && existsSync(this.path(name));
  }

  async list(): Promise<{ name: string; createdAt: string }[]> {
    if (!existsSync(this.dir)) return [];
    const names = (await readdir(this.dir)).filter((n) => IMAGE_NAME.test(n));
    return Promise.all(
      names.map(async (name) => ({ name, createdAt: (await stat(this.path(name))).mtime.toISOString() })),
    );
  }

  /** Copies images from a seed directory (built at set-up) that this data directory lacks.
   * Hard links where the filesystems allow it: images are immutable, so sharing is safe. */
  async seedFrom(seedDir: string): Promise<void> {
    if (!existsSync(seedDir)) return;
    await mkdir(this.dir, { recursive: true });
    for (const name of await readdir(seedDir)) {
      if (!IMAGE_NAME.test(name) || existsSync(this.path(name))) continue;
      const tmp = join(this.dir, `.seed-${name}-${process.pid}`);
      await rm(tmp, { recursive: true, force: true });
      const linked = await execa('cp', ['-al', join(seedDir, name), tmp], { reject: false });
      if (linked.exitCode !== 0) {
        await rm(tmp, { recursive: true, force: true });
        await execa('cp', ['-a', join(seedDir, name), tmp]);
      }
      await rename(tmp, this.path(name));
    }
  }

  /** Unpacks a rootfs tarball (any compression tar knows) as a new image. */
  async import(name: string, tarball: string): Promise<void> {
    if (!IMAGE_NAME.test(name)) throw new EngineError('BOOT_FAILED', `bad image name ${name}`);
    if (existsSync(this.path(name))) throw new EngineError('BOOT_FAILED', `image ${name} exists`);
    const tmp = join(this.dir, `.import-${name}-${process.pid}`);
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp, { recursive: true });
    const r = await execa('tar', ['-xpf', tarball, '-C', tmp, '--numeric-owner'], { reject: false });
    if (r.exitCode !== 0) {
      await rm(tmp, { recursive: true, force: true });
      throw new EngineError('BOOT_FAILED', `tar: ${r.stderr.trim()}`);
    }
    await rename(tmp, this.path(name));
  }
}
