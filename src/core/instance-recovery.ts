import type { Logger } from 'pino';
import type { SandboxRuntime } from '../seam/runtime.js';
import type { InstanceRecord } from '../store/instances.js';
import type { Store } from '../store/index.js';
import type { InstanceService } from './instances.js';

/**
 * What a node does with its instances when it starts: the network they had back in force, the
 * sandboxes that survived the server re-adopted, the rest marked for what they are, and nothing
 * left mounted or running that the store does not know.
 */
export class InstanceRecovery {
  constructor(
    private readonly instances: InstanceService,
    private readonly store: Store,
    private readonly engine: SandboxRuntime,
    private readonly networking: boolean,
    private readonly log: Logger,
  ) {}

  /** The firewall and the DNS with every instance's address and policy in them. An instance
   * from before networking gets its address here. */
  async initNetwork(): Promise<void> {
    if (!this.networking) return;
    const used = new Set(await this.store.instances.addresses());
    for (const rec of await this.instances.local()) {
      if (rec.address) continue;
      const address = this.instances.freeAddress(used);
      used.add(address);
      await this.store.instances.update(rec.id, { address });
    }
    const local = await this.instances.local();
    await this.engine.network.init(await Promise.all(local.map(async (r) => ({ id: r.id, address: r.address!, policy: r.egress, secrets: await this.instances.secrets.forEngine(r) }))));
  }

  /** Re-adopts what still runs and marks the rest stopped. An instance cut short while it was
   * being created or forked is adopted if its sandbox came up, and is an `error` otherwise. */
  async recover(): Promise<void> {
    const known = new Set<string>();
    for (const rec of await this.instances.local()) {
      known.add(rec.id);
      // A node back after the others marked its instances lost: they are its, as they were.
      const wasLost = rec.status === 'lost';
      if (wasLost) {
        rec.status = rec.hibernationId ? 'hibernated' : rec.pid ? 'running' : 'stopped';
        if (!(await this.store.instances.reclaimLost(rec.id, rec.node!, rec.status))) continue; // another node took it meanwhile
      }
      if (rec.status !== 'running' && rec.status !== 'starting') continue;
      if (this.engine.sandbox(rec.id)) continue; // taken back already (a checkpoint finished after a stop)
      // The sandbox the store names, or, if that one is gone, the one run/pid names: a restore
      // (rollback, checkpoint) the server stopped after, before it could record the new pid.
      const spec = this.instances.spec(rec);
      // A server stopped while its lease was in doubt left its sandboxes frozen: they are its own
      // (this loop is of its instances), and a frozen agent cannot be reached to adopt it.
      await this.engine.thaw(rec.id).catch(() => {});
      let sb = rec.status === 'running' && rec.pid && rec.pidStart ? await this.engine.adopt(spec, rec.pid, rec.pidStart) : undefined;
      if (!sb) {
        const launched = await this.engine.leftoverPid(rec.id);
        sb = launched ? await this.engine.adopt(spec, launched.pid, launched.startTime) : undefined;
      }
      if (sb) {
        if (rec.status === 'starting' || wasLost || sb.pid !== rec.pid || rec.restoringFrom) await this.instances.running(rec.id, sb, { restoringFrom: null });
        this.log.info({ instance: rec.id, pid: sb.pid }, 're-adopted running sandbox');
        continue;
      }
      await this.killLeftover(rec.id);
      await this.engine.stop(rec.id).catch((err: unknown) => this.log.warn({ err, instance: rec.id }, 'cleanup failed'));
      if (rec.restoringFrom && (await this.redoRestore(rec))) continue;
      if (rec.status === 'starting') {
        const what = rec.sourceCheckpointId ? `forked from checkpoint ${rec.sourceCheckpointId}` : 'created';
        await this.instances.failed(rec.id, `the server stopped while the instance was being ${what}`);
        this.log.warn({ instance: rec.id }, 'instance cut short by a server stop; marked error');
      } else {
        await this.instances.lifecycle.move(rec.id, 'stop', { pid: null, pidStart: null });
        this.log.info({ instance: rec.id }, 'sandbox did not survive; marked stopped');
      }
    }
    for (const id of await this.engine.mountedInstances()) {
      if (known.has(id)) continue;
      await this.killLeftover(id);
      await this.engine.destroy(id).catch((err: unknown) => this.log.warn({ err, instance: id }, 'could not remove a sandbox the store does not know'));
    }
  }

  /**
   * A rollback or a fork the server stopped in the middle of, its old sandbox gone and its new
   * one not there: done again from its checkpoint (the record already stands on its layers), so
   * that the instance is as the call would have left it.
   */
  private async redoRestore(rec: InstanceRecord): Promise<boolean> {
    const c = await this.store.checkpoints.get(rec.restoringFrom!);
    if (!c || c.status !== 'ready') return false;
    try {
      const spec = this.instances.spec(rec);
      const sb = c.memory && this.engine.disk.hasCheckpointImages(c.id)
        ? await this.engine.restore(spec, c.id, { setHostname: rec.status === 'starting', connections: 'close' })
        : await this.engine.boot(spec, { freshUpper: true });
      await this.instances.running(rec.id, sb, { restoringFrom: null });
      this.log.warn({ instance: rec.id, checkpoint: c.id }, 'finished a restore a server stop cut short');
      return true;
    } catch (err) {
      this.log.error({ err, instance: rec.id, checkpoint: c.id }, 'could not finish a restore a server stop cut short');
      await this.store.instances.update(rec.id, { restoringFrom: null });
      return false;
    }
  }

  /** A sandbox booted or restored while the server went down has its pid only in run/pid. */
  private async killLeftover(id: string): Promise<void> {
    const leftover = await this.engine.leftoverPid(id);
    if (leftover) await this.engine.killStray(leftover.pid, leftover.startTime);
  }
}
