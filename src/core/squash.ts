import type { Logger } from 'pino';
import type { SandboxRuntime } from '../seam/runtime.js';
import type { Store } from '../store/index.js';
import { newId } from '../store/ids.js';
import type { InstanceService } from './instances.js';
import type { KeyedLock } from './jobs.js';

/** How deep an instance's chain may grow (`after` layers), and how many of its newest layers a
 * squash leaves as they are (`keep`). */
export interface SquashLimits {
  after: number;
  keep: number;
}

/**
 * Keeps deep chains inside the kernel's limits: when a checkpoint leaves an instance standing on
 * more than `after` layers, its oldest layers (and the image under them) become one full-root
 * layer for the instance's future mounts, in the background. Checkpoints keep the chains they
 * were taken on, so none of them sees anything change; the old layers go when nothing uses them.
 */
export class ChainSquasher {
  private readonly running = new Set<Promise<void>>();

  constructor(
    private readonly store: Store,
    private readonly engine: SandboxRuntime,
    private readonly instances: InstanceService,
    private readonly locks: KeyedLock,
    private readonly limits: SquashLimits,
    private readonly log: Logger,
  ) {}

  /** Told the depth of an instance's chain after a checkpoint: squashes it if it is too deep. */
  consider(instanceId: string, depth: number): void {
    if (depth <= this.limits.after) return;
    const p = this.squashOldest(instanceId);
    this.running.add(p);
    p.catch((err: unknown) => this.log.warn({ err, instance: instanceId }, 'squash failed; the chain stays as it was')).finally(() => this.running.delete(p));
  }

  /** Resolves when no squash is under way (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.running.size) await Promise.allSettled([...this.running]);
  }

  private async squashOldest(instanceId: string): Promise<void> {
    const inst = await this.store.instances.get(instanceId);
    if (!inst || inst.layers.length <= this.limits.after) return;
    const old = inst.layers.slice(this.limits.keep);
    const into = newId('lyr');
    // Held from the moment it exists: with a shared store, another node collects any time.
    await this.store.transaction(async (tx) => {
      await tx.layers.add(into);
      await tx.layers.setRefs(`squash:${into}`, [into]); // not garbage while it is being built
    });
    try {
      await this.engine.squash(old, inst.baseLayer ? null : inst.image, into);
      await this.locks.run(instanceId, async () => {
        const cur = await this.store.instances.get(instanceId);
        const suffix = cur?.layers.slice(cur.layers.length - old.length);
        if (!cur || suffix?.join() !== old.join() || cur.baseLayer !== inst.baseLayer) return; // the chain moved on
        const layers = [...cur.layers.slice(0, cur.layers.length - old.length), into];
        // The mounted overlay still uses the old layers until its next mount: keep them too.
        await this.store.transaction(async (tx) => {
          await tx.layers.setRefs(`instance:${instanceId}`, [...layers, ...old]);
          await tx.instances.update(instanceId, { layers, baseLayer: true });
        });
        this.log.info({ instance: instanceId, squashed: old.length, into }, 'squashed old layers');
      });
    } finally {
      await this.store.layers.dropHolder(`squash:${into}`);
      await this.instances.collectLayers();
    }
  }
}
