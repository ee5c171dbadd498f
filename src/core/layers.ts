import { randomUUID } from 'node:crypto';
import type { NodeDisk } from '../seam/runtime.js';
import type { Store } from '../store/index.js';

/** The holders pulls hold their images' layers by until the images are recorded. */
const PULL_HOLDER = 'pull:';

/** A pull's hold on its image's layers. */
export interface PullHold {
  hold(layers: readonly string[]): Promise<void>;
  release(): Promise<void>;
}

/**
 * The one collector of unused layers on this node, and the one way to hold layers that have no
 * holder yet: a pull holds its image's layers before it looks for them on the disk, in turn with
 * a collection, so a layer it finds here is not one a collection is deleting.
 */
export class LayerCollector {
  private turn: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly store: Store,
    private readonly disk: Pick<NodeDisk, 'removeLayer' | 'localLayers'>,
    /** This node: a pull's holder names it, so that a restart lets go of its own pulls' only. */
    private readonly nodeId: string,
  ) {}

  private exclusive<T>(work: () => Promise<T>): Promise<T> {
    const run = this.turn.then(work, work);
    this.turn = run.catch(() => {});
    return run;
  }

  /** Deletes layers nothing stands on any more; also this node's copies of layers another node
   * collected (a shared store has one row per layer, and any node may take it). */
  collect(): Promise<void> {
    return this.exclusive(async () => {
      for (const layer of await this.store.layers.takeUnreferenced()) await this.disk.removeLayer(layer);
      const known = new Set(await this.store.layers.all());
      for (const layer of await this.disk.localLayers()) if (!known.has(layer)) await this.disk.removeLayer(layer);
    });
  }

  /** A hold for one pull: `hold` records the layers if they were not and holds them, in turn
   * with collections; `release` once the image holds them (or the pull failed). */
  pullHold(): PullHold {
    const holder = `${PULL_HOLDER}${this.nodeId}:${randomUUID()}`;
    return {
      hold: (layers) =>
        this.exclusive(() =>
          this.store.transaction(async (tx) => {
            for (const id of layers) await tx.layers.add(id);
            await tx.layers.setRefs(holder, layers);
          }),
        ),
      release: () => this.store.layers.dropHolder(holder),
    };
  }

  /** What this node's pulls held when a server was killed in them (one server per data
   * directory: none of them runs now). */
  async releaseAbandonedPulls(): Promise<void> {
    await this.store.layers.dropHoldersStartingWith(`${PULL_HOLDER}${this.nodeId}:`);
  }
}
