import { existsSync } from 'node:fs';
import { mkdir, readdir, rm, rmdir } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';
import { makeExt4Image, MIN_EXT4_MB, mountExt4Image } from './ext4-image.js';
import { isMounted } from './overlay.js';

/** The smallest disk limit. */
export const MIN_DISK_MB = MIN_EXT4_MB;

/**
 * Size-limited filesystems for instances with `limits.diskMb`: a sparse ext4 image per instance,
 * loop-mounted under `volumes/<id>`. The instance's upper and work dirs live in it, and so do the
 * layers its checkpoints freeze (a checkpoint stays a rename: `layers/<layer>` is a symlink into
 * the volume). So the limit covers everything the instance writes, its checkpoints' changes
 * included, until they are deleted or squashed. The kernel's project quotas would do the same
 * without a filesystem per instance, but this machine's kernel has none (README, "Security").
 *
 * Mounted with `discard`, so that what is deleted inside goes back to the host's disk. A volume
 * stays while its instance exists or a layer in it is used (by a fork, a checkpoint).
 */
export class LimitedDisks {
  constructor(private readonly root: string) {}

  dir(id: string): string {
    return join(this.root, id);
  }

  private image(id: string): string {
    return join(this.root, `${id}.img`);
  }

  has(id: string): boolean {
    return existsSync(this.image(id));
  }

  upper(id: string): string {
    return join(this.dir(id), 'upper');
  }

  work(id: string): string {
    return join(this.dir(id), 'work');
  }

  layers(id: string): string {
    return join(this.dir(id), 'layers');
  }

  /** A same-filesystem trash inside the volume: discarding there is a rename, not a copy. */
  trash(id: string): string {
    return join(this.dir(id), 'trash');
  }

  /** Makes and mounts the volume (a no-op when it exists and is mounted). */
  async create(id: string, sizeMb: number): Promise<void> {
    if (!this.has(id)) {
      await mkdir(this.dir(id), { recursive: true });
      await makeExt4Image(this.image(id), sizeMb, `disk for ${id}`);
    }
    await this.mount(id);
  }

  async mount(id: string): Promise<void> {
    await mountExt4Image(this.image(id), this.dir(id), `the disk of ${id}`);
    for (const d of [this.layers(id), this.trash(id)]) await mkdir(d, { recursive: true });
  }

  /** After a reboot: every volume mounted again before anything stands on it. */
  async mountAll(): Promise<void> {
    if (!existsSync(this.root)) return;
    for (const name of await readdir(this.root)) {
      if (name.endsWith('.img')) await this.mount(name.slice(0, -'.img'.length));
    }
  }

  /** Removes the volume once nothing is left in it: no upper (its instance is gone) and no
   * frozen layer. Returns whether it went. */
  async releaseIfEmpty(id: string): Promise<boolean> {
    if (!this.has(id)) return false;
    if (existsSync(this.upper(id))) return false;
    const layers = await readdir(this.layers(id)).catch(() => []);
    if (layers.length) return false;
    // Lazily: a background delete in its trash may still hold it for a moment.
    const r = await execa('umount', ['-l', this.dir(id)], { reject: false });
    if (r.exitCode !== 0 && (await isMounted(this.dir(id)))) return false;
    await rm(this.image(id), { force: true });
    await rmdir(this.dir(id)).catch(() => {});
    return true;
  }
}
