import { mkdir, rm } from 'node:fs/promises';
import { execa } from 'execa';
import { EngineError } from '../seam/errors.js';
import { isMounted } from './overlay.js';

/** The smallest ext4 image worth making: its own metadata and a 4 MiB journal need a few MiB. */
export const MIN_EXT4_MB = 64;

const stderrOf = (err: unknown) => (err as { stderr?: string }).stderr?.trim() || (err as Error).message;

/**
 * A sparse ext4 image of `sizeMb` at `image`: the kernel's way of bounding what one tenant
 * writes (this machine's kernel has no project quotas). Made under a temporary name and renamed,
 * so that a crash leaves no half-made image under the real one.
 */
export async function makeExt4Image(image: string, sizeMb: number, what: string): Promise<void> {
  const tmp = `${image}.tmp`;
  try {
    await execa('truncate', ['-s', `${sizeMb}M`, tmp]);
    // No reserved blocks (the host writes nothing of its own there); a small journal.
    await execa('mkfs.ext4', ['-q', '-F', '-m', '0', '-J', 'size=4', '-E', 'lazy_itable_init=1,nodiscard', tmp]);
    await execa('mv', [tmp, image]);
  } catch (err) {
    await rm(tmp, { force: true });
    throw new EngineError('MOUNT_FAILED', `${what} of ${sizeMb} MiB: ${stderrOf(err)}`, undefined, { cause: err });
  }
}

/** Loop-mounts the image on `dir` (a no-op when something is mounted there): `discard`, so that
 * what is deleted inside goes back to the host's disk; never a device or a set-user-id file. */
export async function mountExt4Image(image: string, dir: string, what: string): Promise<void> {
  if (await isMounted(dir)) return;
  await mkdir(dir, { recursive: true });
  const r = await execa('mount', ['-o', 'loop,discard,noatime,nodev,nosuid', image, dir], { reject: false });
  if (r.exitCode !== 0) throw new EngineError('MOUNT_FAILED', `mount ${what}: ${r.stderr.trim()} (this needs loop devices)`);
}
