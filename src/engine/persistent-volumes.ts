import { existsSync } from 'node:fs';
import { chmod, mkdir, readdir, rm, rmdir, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';
import { EngineError } from '../seam/errors.js';
import type { AgentPort } from '../seam/agent.js';
import type { VolumeDisks } from '../seam/runtime.js';
import { makeExt4Image, mountExt4Image } from './ext4-image.js';
import { isMounted } from './overlay.js';
import type { VolumeFileAgents } from './volume-file-agents.js';

/**
 * Owners' persistent volumes: a sparse ext4 image each (its size is the volume's limit: ENOSPC
 * inside), loop-mounted under `persistent-volumes/<id>`. Sandboxes see its `data` directory (not
 * the filesystem's root, which holds `lost+found`), through a mount made by `fp-agent boot` or
 * CRIU's worker: idmapped to the sandbox's uid range, so that the files stay in canonical ids,
 * like layers, and sandboxes of different ranges share them.
 */
export class PersistentVolumes implements VolumeDisks {
  constructor(
    private readonly root: string,
    private readonly fileAgents: VolumeFileAgents,
  ) {}

  private image(id: string): string {
    return join(this.root, `${id}.img`);
  }

  private mountpoint(id: string): string {
    return join(this.root, id);
  }

  /** The directory a sandbox mounts. */
  dataDir(id: string): string {
    return join(this.mountpoint(id), 'data');
  }

  /** What a sandbox mounts in place of a volume it was asked not to have: empty and read-only. */
  get placeholder(): string {
    return join(this.root, '.empty');
  }

  has(id: string): boolean {
    return existsSync(this.image(id));
  }

  async init(): Promise<void> {
    await mkdir(this.placeholder, { recursive: true, mode: 0o555 });
    await chmod(this.placeholder, 0o555);
    // After a reboot nothing is mounted; a crash mid-create leaves a `.tmp` image, never a real one.
    for (const name of await readdir(this.root)) {
      if (name.endsWith('.img.tmp')) await rm(join(this.root, name), { force: true });
      else if (name.endsWith('.img')) await this.mount(name.slice(0, -'.img'.length));
    }
  }

  async create(id: string, sizeMb: number): Promise<void> {
    if (!this.has(id)) await makeExt4Image(this.image(id), sizeMb, `volume ${id}`);
    await this.mount(id);
  }

  private async mount(id: string): Promise<void> {
    await mountExt4Image(this.image(id), this.mountpoint(id), `volume ${id}`);
    // Root's, 0755, as Docker makes a new named volume; owned by id 0 of whichever range mounts it.
    await mkdir(this.dataDir(id), { mode: 0o755 }).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'EEXIST') throw err;
    });
  }

  withFiles<T>(id: string, request: (agent: AgentPort) => Promise<T>): Promise<T> {
    if (!this.has(id)) throw new EngineError('VOLUME_NOT_HERE', `volume ${id} is not on this node`);
    return this.fileAgents.call(id, this.dataDir(id), request);
  }

  async remove(id: string): Promise<void> {
    // Its file agent holds a mount of it.
    await this.fileAgents.whileRemoving(id, () => this.unmountAndDelete(id));
  }

  private async unmountAndDelete(id: string): Promise<void> {
    const dir = this.mountpoint(id);
    if (await isMounted(dir)) {
      // Not lazily: a file held open on the host's mount fails this, rather than leaving it half-gone.
      const r = await execa('umount', [dir], { reject: false });
      if (r.exitCode !== 0) throw new EngineError('VOLUME_BUSY', `volume ${id} is still mounted by a sandbox: ${r.stderr.trim()}`);
    }
    await rm(this.image(id), { force: true });
    await rmdir(dir).catch(() => {});
  }

  async usedBytes(id: string): Promise<number> {
    const s = await statfs(this.mountpoint(id));
    return (s.blocks - s.bfree) * s.bsize;
  }
}
