import { constants } from 'node:fs';
import { copyFile, lstat, mkdir, readdir, rm, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { EngineError } from '../seam/errors.js';

/** What the staging may hold at once, for one server, and for one dump: a dump is staged only
 * when the sandbox's memory (what its image will be, at most) fits in what is left. */
export const STAGING_BUDGET_BYTES = 512 * 2 ** 20;
export const STAGING_MAX_DUMP_BYTES = 256 * 2 ** 20;
/** Free space the tmpfs keeps beyond a staged dump's estimate (others use /dev/shm too). */
const FREE_MARGIN_BYTES = 64 * 2 ** 20;
/** How long persisting a staged image (at most STAGING_MAX_DUMP_BYTES, memory to disk) may take. */
const PERSIST_DEADLINE_MS = 60_000;
const TMPFS_MAGIC = 0x01021994;

/** A dump's image directory in memory, until `persist` copies it to its place on disk. */
export interface StagedDump {
  dir: string;
  /** Copies the image into `to` (which exists) and removes the staged copy. */
  persist(to: string): Promise<void>;
  /** Removes the staged copy (a dump that failed, or one persisted already: no-op). */
  discard(): Promise<void>;
}

/**
 * Where CRIU writes a dump's image while the sandbox is frozen: a directory of this server's on a
 * tmpfs (/dev/shm), so the freeze does not wait for the disk. Writing a sandbox's ~8 image files a
 * process on ext4 cost most of a 40-process pause in inode allocation alone (the allocator reads
 * inode tables to skip recently deleted inodes, and checkpoints delete many): 130 ms p50 on disk
 * against 80 in memory. The image reaches the data directory after the thaw, before the
 * checkpoint is ready. Memory is bounded: STAGING_BUDGET_BYTES for all dumps under way, a dump
 * staged only under STAGING_MAX_DUMP_BYTES and when the tmpfs has room; otherwise it goes to
 * disk as before. The directory must be ours (made here, root's, 0700, not a link): /dev/shm is
 * writable by every host user.
 */
export class DumpStaging {
  private reserved = 0;

  private constructor(private readonly root: string | undefined) {}

  /** Staging under `parent` (a tmpfs) in `name`, emptied of what a killed server left; none when
   * `parent` is not a tmpfs or the directory is not safely ours (the reason is returned). */
  static async open(parent: string | undefined, name: string): Promise<{ staging: DumpStaging; unusable?: string }> {
    if (!parent) return { staging: new DumpStaging(undefined) };
    const fs = await statfs(parent).catch(() => undefined);
    if (!fs || fs.type !== TMPFS_MAGIC) return { staging: new DumpStaging(undefined), unusable: `${parent} is not a tmpfs` };
    const root = join(parent, name);
    await mkdir(root, { mode: 0o700 }).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'EEXIST') throw err;
    });
    const st = await lstat(root);
    if (!st.isDirectory() || st.uid !== process.getuid?.() || (st.mode & 0o777) !== 0o700) {
      return { staging: new DumpStaging(undefined), unusable: `${root} is not a directory of this server's alone (owner ${st.uid}, mode ${(st.mode & 0o7777).toString(8)})` };
    }
    for (const e of await readdir(root)) await rm(join(root, e), { recursive: true, force: true });
    return { staging: new DumpStaging(root) };
  }

  /** A staging directory for the dump `imagesId` whose image is expected to take `expectedBytes`
   * (what the sandbox's memory uses, or for an incremental dump an estimate of what it wrote), or
   * undefined: write it to disk. The tmpfs must have room for `worstCaseBytes` (the memory it
   * uses), so that an estimate short of the truth costs budget, never a failed dump. */
  async stage(imagesId: string, expectedBytes: number, worstCaseBytes = expectedBytes): Promise<StagedDump | undefined> {
    if (!this.root || expectedBytes > STAGING_MAX_DUMP_BYTES || this.reserved + expectedBytes > STAGING_BUDGET_BYTES) return undefined;
    const fs = await statfs(this.root).catch(() => undefined);
    if (!fs || fs.bavail * fs.bsize < Math.max(expectedBytes, worstCaseBytes) + FREE_MARGIN_BYTES) return undefined;
    const dir = join(this.root, imagesId);
    this.reserved += expectedBytes;
    let held = true;
    const release = async () => {
      if (!held) return;
      held = false;
      this.reserved -= expectedBytes;
      await rm(dir, { recursive: true, force: true });
    };
    try {
      await mkdir(dir, { mode: 0o700 });
    } catch (err) {
      await release();
      throw err;
    }
    return {
      dir,
      discard: release,
      persist: async (to) => {
        const deadline = performance.now() + PERSIST_DEADLINE_MS;
        try {
          // CRIU's image directory is flat, its files CRIU's own (nothing from the sandbox names them).
          for (const e of await readdir(dir, { withFileTypes: true })) {
            if (!e.isFile()) continue;
            if (performance.now() > deadline) throw new EngineError('TIMEOUT', `the memory image did not reach the disk within ${PERSIST_DEADLINE_MS / 1000} s`);
            await copyFile(join(dir, e.name), join(to, e.name), constants.COPYFILE_EXCL);
          }
        } finally {
          await release();
        }
      },
    };
  }

  /** Removes the staging directory (the server stops). */
  async close(): Promise<void> {
    if (this.root) await rm(this.root, { recursive: true, force: true });
  }
}
