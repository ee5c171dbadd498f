import { existsSync, lstatSync, mkdirSync, readlinkSync, renameSync, rmSync, symlinkSync } from 'node:fs';
import { readdir, rm } from 'node:fs/promises';
import { join, relative, resolve } from 'node:path';
import type { Readable } from 'node:stream';
import { diskUsage } from './disk-usage.js';
import type { SandboxSpec } from '../seam/runtime.js';
import type { DataLayout } from '../lib/data-layout.js';
import { packTree, unpackTree } from './pack.js';
import { PreparedCopy } from './upper-copy.js';
import { run } from './run.js';
import type { NodeDisk } from '../seam/runtime.js';
import type { LimitedDisks } from './limited-disks.js';

// What the core names layers and checkpoints (store/ids.ts); anything else in their directories
// (a half-written import, a hibernation image) is not for a sweep to touch.
const LAYER_ID = /^lyr_[0-9a-z]{16}$/;
const CHECKPOINT_ID = /^ckpt_[0-9a-z]{16}$/;

/**
 * What the engine keeps on this node's disk: instances' upper and work directories (in a volume
 * when their size is limited), frozen layers and memory images, their copies to and from the
 * object store. Nothing is deleted in place: it is renamed into a trash on its own filesystem
 * and removed in the background.
 */
export class Disk implements NodeDisk {
  constructor(
    private readonly layout: DataLayout,
    private readonly volumes: LimitedDisks,
    private readonly agentPath: string,
  ) {}

  /** The instance's upper and work dirs: in its volume when it has a disk limit. */
  upperOf(id: string): string {
    return this.volumes.has(id) ? this.volumes.upper(id) : this.layout.upper(id);
  }

  workOf(id: string): string {
    return this.volumes.has(id) ? this.volumes.work(id) : this.layout.work(id);
  }

  /** Makes (or mounts) the instance's volume, when it has a disk limit. Before any pause. */
  async ensureVolume(spec: SandboxSpec): Promise<void> {
    if (spec.diskMb) await this.volumes.create(spec.id, spec.diskMb);
  }

  /** Readies the instance's disk directories; the helper that starts the sandbox mounts them
   * (in place of what is mounted there now). Synchronous: a handful of quick syscalls on the
   * path of every restore, not worth a trip each through the thread pool. */
  prepareDisk(spec: SandboxSpec, freshUpper: boolean): void {
    const l = this.layout;
    const upper = this.upperOf(spec.id);
    const work = this.workOf(spec.id);
    if (freshUpper) this.discard(upper);
    mkdirSync(upper, { recursive: true });
    this.discard(work);
    for (const dir of [work, l.merged(spec.id), l.run(spec.id)]) mkdirSync(dir, { recursive: true });
  }

  /** Moves a directory to a trash on its own filesystem (a rename) and deletes it in the
   * background. */
  discard(dir: string): void {
    if (!existsSync(dir)) return;
    const volume = this.volumeOf(dir);
    const dest = join(volume ? this.volumes.trash(volume) : this.layout.trash, `${Date.now()}-${Math.random().toString(36).slice(2)}`);
    renameSync(dir, dest);
    void rm(dest, { recursive: true, force: true }).catch(() => {});
  }

  /** The volume a path lies in, if any. */
  private volumeOf(path: string): string | undefined {
    const prefix = this.layout.limitedDisks + '/';
    return path.startsWith(prefix) ? path.slice(prefix.length).split('/')[0] : undefined;
  }

  async emptyTrash(): Promise<void> {
    for (const e of await readdir(this.layout.trash)) await rm(join(this.layout.trash, e), { recursive: true, force: true });
  }

  /** Freezes the upper into a layer by rename. An instance with a volume keeps the layer in
   * it (a rename cannot leave a filesystem) and `layers/<id>` points there. */
  freezeUpper(id: string, layerId: string): void {
    const l = this.layout;
    if (this.volumes.has(id)) {
      const frozen = join(this.volumes.layers(id), layerId);
      renameSync(this.volumes.upper(id), frozen);
      symlinkSync(relative(l.layers, frozen), l.layer(layerId));
    } else {
      renameSync(l.upper(id), l.layer(layerId));
    }
    mkdirSync(this.upperOf(id));
    this.discard(this.workOf(id));
    mkdirSync(this.workOf(id));
  }

  /** A copy of a running instance's upper into a new layer, ready to run once its sandbox is
   * frozen; the instance stays on its upper. Like a rename, the copy lands in the instance's
   * volume when it has one, so its disk limit covers it. If it fails or is cancelled, nothing of
   * the layer is left. */
  prepareUpperCopy(id: string, layerId: string): { run(deadlineMs: number): Promise<void>; cancel(): void } {
    const l = this.layout;
    const inVolume = this.volumes.has(id);
    const dest = inVolume ? join(this.volumes.layers(id), layerId) : l.layer(layerId);
    const copy = new PreparedCopy(this.upperOf(id), dest);
    return {
      run: async (deadlineMs) => {
        try {
          await copy.run(deadlineMs);
        } catch (err) {
          this.discard(dest);
          throw err;
        }
        if (inVolume) symlinkSync(relative(l.layers, dest), l.layer(layerId));
      },
      cancel: () => copy.cancel(),
    };
  }

  /** Whether a layer frozen just before a crash is there (mending its link into a volume if
   * the crash came between the rename and the link). */
  recoverFrozenLayer(layerId: string, instanceId: string): boolean {
    if (existsSync(this.layout.layer(layerId))) return true;
    const inVolume = join(this.volumes.layers(instanceId), layerId);
    if (!this.volumes.has(instanceId) || !existsSync(inVolume)) return false;
    symlinkSync(relative(this.layout.layers, inVolume), this.layout.layer(layerId));
    return true;
  }

  /** Makes a frozen layer durable: its data reaches the disk before the checkpoint is `ready`. */
  async syncLayer(layerId: string): Promise<void> {
    await run(this.agentPath, ['syncfs', this.layout.layer(layerId)]);
  }

  async removeLayer(layerId: string): Promise<void> {
    const link = this.layout.layer(layerId);
    const st = lstatSync(link, { throwIfNoEntry: false });
    if (!st?.isSymbolicLink()) return this.discard(link);
    // A layer in a volume: it goes from there, and the volume with it once nothing is left.
    const frozen = resolve(this.layout.layers, readlinkSync(link));
    const volume = this.volumeOf(frozen);
    this.discard(frozen);
    rmSync(link, { force: true });
    if (volume) await this.volumes.releaseIfEmpty(volume);
  }

  async removeCheckpointImages(checkpointId: string): Promise<void> {
    this.discard(this.layout.checkpoint(checkpointId));
  }

  hasCheckpointImages(checkpointId: string): boolean {
    return existsSync(this.layout.checkpoint(checkpointId));
  }

  /** Whether CRIU finished dumping into the images: it writes the inventory last, after every
   * task's image (criu/cr-dump.c, cr_dump_tasks). */
  dumpComplete(imagesId: string): boolean {
    return existsSync(join(this.layout.checkpoint(imagesId), 'inventory.img'));
  }

  async checkpointImageBytes(checkpointId: string): Promise<number> {
    return diskUsage(this.layout.checkpoint(checkpointId));
  }

  async layerBytes(layerId: string): Promise<number> {
    return diskUsage(this.layout.layer(layerId));
  }

  exportLayer(layerId: string): Readable {
    return packTree(this.layout.layer(layerId));
  }

  exportCheckpointImages(checkpointId: string): Readable {
    return packTree(this.layout.checkpoint(checkpointId));
  }

  hasLayer(layerId: string): boolean {
    return existsSync(this.layout.layer(layerId));
  }

  async localLayers(): Promise<string[]> {
    return (await readdir(this.layout.layers).catch(() => [] as string[])).filter((n) => LAYER_ID.test(n));
  }

  async localCheckpointImages(): Promise<string[]> {
    return (await readdir(this.layout.checkpoints).catch(() => [] as string[])).filter((n) => CHECKPOINT_ID.test(n));
  }

  async importLayer(layerId: string, tar: Readable): Promise<void> {
    await unpackTree(tar, this.layout.layer(layerId));
    await this.syncLayer(layerId);
  }

  async importCheckpointImages(checkpointId: string, tar: Readable): Promise<void> {
    await unpackTree(tar, this.layout.checkpoint(checkpointId));
  }
}
