import { untilDeadline } from '../lib/deadline.js';
import type { Logger } from 'pino';
import type { SandboxRuntime } from '../seam/runtime.js';
import type { Store } from '../store/index.js';
import { newId } from '../store/ids.js';
import type { CheckpointRecord } from '../store/checkpoints.js';
import type { InstanceRecord, Page } from '../store/instances.js';
import { ConflictError, isNoSpace, NotFoundError, QuotaExceededError } from './errors.js';
import { EngineError } from '../seam/errors.js';
import { placeholdersFor } from './volumes.js';
import type { EventBus } from './events.js';
import type { ExecutionService } from './executions.js';
import type { CreateInstance, InstanceService } from './instances.js';
import type { JobQueue, KeyedLock } from './jobs.js';
import type { ChainSquasher } from './squash.js';
import { requireRoom, shortOfRoom } from './space.js';
import { watchesResumed } from './file-watch.js';
import { failpoint } from '../lib/failpoints.js';
import { templateOwner } from '../store/templates.js';
import { standbyKeyOf, standbyOwnerOf, StandbyUnfitError, type Standby, type StandbyRecipe, type WarmStandbys } from './warm-standbys.js';

export interface CreateCheckpoint {
  label?: string | undefined;
  memory?: boolean | undefined;
  retention?: { mode: 'delete_oldest' } | undefined;
  /** The label names one checkpoint of the instance (OpenComputer's names): another that is
   * not failed answers 409, reason LABEL_TAKEN. */
  uniqueLabel?: boolean | undefined;
}

export interface ForkInput {
  name?: string | undefined;
  checkpointId?: string | undefined;
  count?: number | undefined;
  /** Variables added to (or replacing) the source's, for the new instances' commands. */
  env?: Record<string, string> | undefined;
  /** `same` (default): the source's volumes, shared; `none`: an empty, read-only directory in
   * each one's place. */
  volumes?: 'same' | 'none' | undefined;
}

/** Who follows checkpoints: told when one is ready or gone, and asked to make sure one's data
 * is on this node before it is restored (durable checkpoints fetch what is missing). */
export interface CheckpointObserver {
  ready(id: string): void;
  removed(id: string): void;
  /** The caller's record of it, as it read it (its layers, memory and image are fixed). */
  needed(c: CheckpointRecord): Promise<void>;
  /** Whether the checkpoint is in the object store (another node can restore it). */
  durable(id: string): Promise<boolean>;
}

/** Forks made for someone else than the source's owner (a template's instances): their owner
 * and what they are created with instead of the source's name, metadata and limits. */
export interface ForkAs {
  owner?: string | undefined;
  create?: CreateInstance | undefined;
  /** Keep a standby of the checkpoint for the owner's next such fork (warm-standbys.ts): a
   * template's instances are made again and again; an owner's own forks always are. */
  warm?: boolean | undefined;
}

export interface LineageNode {
  kind: 'instance' | 'checkpoint';
  id: string;
  label: string | null;
  status: string;
  children: LineageNode[];
}

const FORK_WAIT_MS = 120_000;
const PERSIST_ATTEMPTS = 150;
const PERSIST_RETRY_MS = 2000;

async function bestEffort(step: () => unknown, log: Logger): Promise<void> {
  try {
    await step();
  } catch (err) {
    log.warn({ err }, 'a clean-up step failed');
  }
}

/** A checkpoint's new layer, and the layers its instance stands on afterwards (the same as before
 * when the upper was copied; the new one on top of them when it was frozen by rename). */
interface Frozen {
  layerId: string;
  pauseMs: number | null;
  instanceLayers: string[];
}

/** Whether two lists of layers hold the same layers (order and repeats aside). */
const sameSet = (a: readonly string[], b: readonly string[]) => {
  const inA = new Set(a);
  const inB = new Set(b);
  return inA.size === inB.size && [...inA].every((x) => inB.has(x));
};

/** Checkpoints: freezing an instance's state, rolling back to it, forking from it. */
export class CheckpointService {
  /** Checkpoints forks are being made from, with the waiters for each to be free again: a
   * pinned checkpoint's images and layers stay until its forks are running. */
  private readonly pins = new Map<string, { count: number; waiters: (() => void)[] }>();

  /** Told when a checkpoint is ready and when one is gone (durable checkpoints follow). */
  private observer: CheckpointObserver = { ready: () => {}, removed: () => {}, needed: async () => {}, durable: async () => false };

  observe(o: CheckpointObserver): void {
    this.observer = o;
  }

  constructor(
    private readonly store: Store,
    private readonly engine: SandboxRuntime,
    private readonly instances: InstanceService,
    private readonly locks: KeyedLock,
    private readonly jobs: JobQueue,
    private readonly defaultMax: number,
    private readonly squasher: ChainSquasher,
    private readonly events: EventBus,
    private readonly executions: ExecutionService,
    private readonly log: Logger,
    /** Sandboxes restored ahead for the next forks of checkpoints forked from. */
    private readonly warm: WarmStandbys,
  ) {}

  async get(owner: string, instanceId: string, id: string): Promise<CheckpointRecord> {
    return this.checkpointOf(await this.instances.get(owner, instanceId), id);
  }

  /** The checkpoint of an instance its caller has read (as its owner). */
  private async checkpointOf(inst: InstanceRecord, id: string): Promise<CheckpointRecord> {
    const c = await this.store.checkpoints.get(id);
    if (!c || c.instanceId !== inst.id) throw new NotFoundError('checkpoint', id);
    return this.view(c);
  }

  /** A checkpoint by id alone, for callers that do not name its instance. */
  async find(owner: string, id: string): Promise<CheckpointRecord> {
    const c = await this.store.checkpoints.get(id);
    if (!c || c.owner !== owner) throw new NotFoundError('checkpoint', id);
    return this.view(c);
  }

  async list(owner: string, instanceId: string, limit: number, cursor?: string): Promise<Page<CheckpointRecord>> {
    await this.instances.get(owner, instanceId);
    const page = await this.store.checkpoints.page(instanceId, limit, cursor);
    return { ...page, items: await Promise.all(page.items.map((c) => this.view(c))) };
  }

  /** Takes a checkpoint: answers at once with it `processing`; `done` settles when it is
   * `ready` or `failed`. A hibernated instance is woken first. */
  async create(owner: string, instanceId: string, input: CreateCheckpoint): Promise<{ checkpoint: CheckpointRecord; done: Promise<void> }> {
    let inst = await this.instances.get(owner, instanceId);
    if (this.instances.isBeingDeleted(instanceId)) throw new ConflictError(`instance ${instanceId} is being deleted`);
    if (inst.status === 'hibernated') inst = await this.instances.wake(owner, instanceId);
    if (inst.status !== 'running' && inst.status !== 'stopped') {
      throw new ConflictError(`instance ${instanceId} is ${inst.status}`, { status: inst.status });
    }
    const memory = input.memory ?? true;
    if (memory && inst.status !== 'running') {
      throw new ConflictError('a memory checkpoint needs a running instance; use "memory": false', { status: inst.status });
    }
    if (input.uniqueLabel && input.label !== undefined) await this.refuseTakenLabel(inst.id, input.label);
    await this.enforceLimit(inst, input.retention?.mode === 'delete_oldest');
    const c: CheckpointRecord = {
      id: newId('ckpt'),
      instanceId,
      owner,
      label: input.label ?? null,
      status: 'processing',
      memory,
      parentId: inst.headCheckpointId,
      layers: [],
      baseLayer: inst.baseLayer,
      image: inst.image,
      agentLayer: inst.agentLayer,
      hostname: inst.name,
      userNamespace: inst.uidBase !== null,
      deltaBytes: null,
      memoryBytes: null,
      pauseMs: null,
      error: null,
      createdAt: new Date().toISOString(),
      readyAt: null,
    };
    await this.store.checkpoints.insert(c);
    this.events.emit(instanceId, 'checkpoint.processing', { checkpoint_id: c.id, memory });
    // From now on the instance's callers wait for the dump: the checkpoint is of this moment.
    const release = this.engine.sandbox(instanceId)?.hold() ?? (() => {});
    const done = this.jobs.enqueue(c.id, instanceId, () =>
      this.run(c, release)
        .catch((err: Error) => this.fail(c, err.message))
        .finally(release),
    );
    done.catch(() => {});
    return { checkpoint: c, done };
  }

  private pin(id: string): () => void {
    const p = this.pins.get(id) ?? { count: 0, waiters: [] };
    p.count++;
    this.pins.set(id, p);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      if (--p.count > 0) return;
      this.pins.delete(id);
      for (const w of p.waiters.splice(0)) w();
    };
  }

  private pinned(id: string): boolean {
    return this.pins.has(id);
  }

  /** Resolves once no fork reads from the checkpoint (at once if none does), or after `ms`. */
  private async unpinned(id: string, ms: number): Promise<boolean> {
    const p = this.pins.get(id);
    if (!p) return true;
    return untilDeadline(new Promise<boolean>((r) => p.waiters.push(() => r(true))), ms, () => false);
  }

  private async refuseTakenLabel(instanceId: string, label: string): Promise<void> {
    const taken = (await this.store.checkpoints.forInstance(instanceId)).some((c) => c.label === label && c.status !== 'failed');
    if (taken) throw new ConflictError(`a checkpoint named ${label} already exists for this instance`, { reason: 'LABEL_TAKEN', label });
  }

  private async enforceLimit(inst: InstanceRecord, deleteOldest: boolean): Promise<void> {
    const max = inst.maxCheckpoints ?? this.defaultMax;
    const existing = (await this.store.checkpoints.forInstance(inst.id)).filter((c) => c.status !== 'failed');
    if (existing.length < max) return;
    if (!deleteOldest) {
      throw new QuotaExceededError(`instance ${inst.id} has ${existing.length} of ${max} checkpoints; delete one or pass "retention": {"mode": "delete_oldest"}`, {
        reason: 'CHECKPOINTS_PER_INSTANCE',
        limit: max,
      });
    }
    const victims = existing.filter((c) => c.status === 'ready' && !this.pinned(c.id)).slice(0, existing.length - max + 1);
    if (victims.length < existing.length - max + 1) throw new ConflictError('the oldest checkpoints are still processing or being forked from');
    for (const v of victims) await this.removeRecord(v);
  }

  private async run(c: CheckpointRecord, release: () => void): Promise<void> {
    const inst = await this.store.instances.get(c.instanceId);
    if (!inst) return this.fail(c, 'the instance was deleted');
    const short = await this.spaceShortfall(inst, c.memory);
    if (short) return this.fail(c, short);
    let frozen: Frozen;
    try {
      frozen = (inst.status === 'running' && (await this.copyUpper(inst, c, release))) || (await this.freezeUpper(inst, c, release));
    } catch (err) {
      await bestEffort(() => this.engine.disk.removeCheckpointImages(c.id), this.log);
      if (!this.engine.sandbox(inst.id)) {
        await this.instances.failed(inst.id, (err as Error).message);
      }
      return this.fail(c, (err as Error).message);
    }
    const { layerId, pauseMs, instanceLayers } = frozen;
    const sb = this.engine.sandbox(inst.id);
    if (sb) await watchesResumed(sb);
    const layers = [layerId, ...inst.layers];
    // The instance may already run on the new layer: this must be recorded, or a later
    // checkpoint would leave the layer out of the chain. Retried while the disk is full.
    await this.persistFrozen(inst.id, c.id, layers, instanceLayers, inst.baseLayer, pauseMs, layerId);
    // The instance runs again; what follows only makes the checkpoint durable and measured.
    if (!c.memory) await this.engine.disk.removeCheckpointImages(c.id);
    await this.engine.disk.syncLayer(layerId);
    const deltaBytes = await this.engine.disk.layerBytes(layerId);
    const memoryBytes = c.memory ? await this.engine.disk.checkpointImageBytes(c.id) : 0;
    await this.store.layers.markSynced(layerId);
    if (!(await this.store.checkpoints.settle(c.id, { status: 'ready', deltaBytes, memoryBytes, readyAt: new Date().toISOString() }))) {
      this.log.warn({ checkpoint: c.id }, 'a checkpoint was settled (or deleted) before its job recorded it ready');
      return;
    }
    this.observer.ready(c.id);
    this.events.emit(inst.id, 'checkpoint.ready', { checkpoint_id: c.id, pause_ms: pauseMs, delta_bytes: deltaBytes, memory_bytes: memoryBytes });
    this.log.info({ checkpoint: c.id, instance: inst.id, pauseMs, deltaBytes, memoryBytes, upperCopied: instanceLayers === inst.layers }, 'checkpoint ready');
    this.squasher.consider(inst.id, instanceLayers.length);
    // An instance that rolls back (it has a standby for it) gets its standby of this checkpoint
    // instead: the newest is the one a "checkpoint, try, roll back" loop goes back to.
    if (c.memory && this.warm.rollsBack(inst.id)) {
      await this.warm.dropRollbackOf(inst.id);
      this.warm.refill({ kind: 'rollback', instanceId: inst.id, checkpointId: c.id }, inst.owner);
    }
  }

  /**
   * A files-only checkpoint of a running instance whose upper is small: copied into the new
   * layer in a short freeze, the instance staying on its upper (no CRIU, a pause flat in its
   * processes and memory). Undefined when the engine did not copy it (too large for a short
   * freeze); nothing of the attempt is left then.
   */
  private async copyUpper(inst: InstanceRecord, c: CheckpointRecord, release: () => void): Promise<Frozen | undefined> {
    const layerId = newId('lyr');
    // Not pending for the instance: a restart must not put a copy under the upper it was made
    // of (a file deleted since would come back). The checkpoint holds it from the start, so no
    // collection takes it meanwhile, and a failed checkpoint lets go of it.
    await this.store.transaction(async (tx) => {
      await tx.layers.add(layerId);
      await tx.layers.setRefs(`checkpoint:${c.id}`, [layerId]);
    });
    try {
      const { pauseMs } = await this.engine.copyRunningUpper(this.instances.spec(inst), layerId, { imagesId: c.memory ? c.id : undefined, release });
      return { layerId, pauseMs, instanceLayers: inst.layers };
    } catch (err) {
      await bestEffort(() => this.store.layers.dropHolder(`checkpoint:${c.id}`), this.log);
      await bestEffort(() => this.store.layers.remove(layerId), this.log);
      if (err instanceof EngineError && err.code === 'UPPER_NOT_COPIED') {
        this.log.debug({ checkpoint: c.id, reason: err.message }, 'files-only checkpoint: the upper is frozen by rename');
        return undefined;
      }
      throw err;
    }
  }

  /** The upper frozen into a new layer by rename, the instance going on on top of it: a dump
   * and restore when it runs (its memory image kept for a memory checkpoint). */
  private async freezeUpper(inst: InstanceRecord, c: CheckpointRecord, release: () => void): Promise<Frozen> {
    const layerId = newId('lyr');
    await this.store.layers.add(layerId, inst.id);
    try {
      const pauseMs = inst.status === 'running' ? (await this.engine.freezeRunning(this.instances.spec(inst), layerId, c.id, release)).pauseMs : null;
      if (inst.status !== 'running') await this.engine.freezeStopped(inst.id, layerId);
      return { layerId, pauseMs, instanceLayers: [layerId, ...inst.layers] };
    } catch (err) {
      // Each step on its own: a full disk may refuse any of them, and none may stop the others.
      await bestEffort(() => this.store.layers.remove(layerId), this.log);
      throw err;
    }
  }

  /**
   * A memory checkpoint the server stopped in the middle of, if CRIU had dumped it whole: the
   * dump ended the sandbox, so it is finished now as it would have been (the upper frozen into
   * its layer, the sandbox restored from the image or the one restored before the stop taken
   * back) and is ready; the instance's processes go on. Anything less is left to the rest of
   * recovery (the checkpoint failed; the instance adopted, or stopped).
   */
  private async finishInterrupted(c: CheckpointRecord): Promise<void> {
    const inst = await this.store.instances.get(c.instanceId);
    if (!inst || !this.instances.isLocal(inst) || inst.status !== 'running' || !c.memory || !this.engine.disk.dumpComplete(c.id)) return;
    const layer = (await this.store.layers.pending()).find((p) => p.instanceId === inst.id);
    if (!layer) return;
    const leftover = await this.engine.leftoverPid(inst.id);
    // Still the sandbox the dump was of: the dump did not end it, so it was not done.
    if (leftover && leftover.pid === inst.pid && leftover.startTime === inst.pidStart) return;
    try {
      if (!this.engine.disk.recoverFrozenLayer(layer.id, inst.id)) {
        await this.engine.stop(inst.id);
        await this.engine.freezeStopped(inst.id, layer.id);
      }
      const layers = [layer.id, ...inst.layers];
      const spec = { ...this.instances.spec(inst), layers };
      const adopted = leftover ? await this.engine.adopt(spec, leftover.pid, leftover.startTime) : undefined;
      const sb = adopted ?? (await this.engine.restore(spec, c.id, { setHostname: false, connections: 'restore' }));
      await this.persistFrozen(inst.id, c.id, layers, layers, inst.baseLayer, null, layer.id);
      await this.instances.running(inst.id, sb, { layers });
      await this.engine.disk.syncLayer(layer.id);
      await this.store.layers.markSynced(layer.id);
      const [deltaBytes, memoryBytes] = await Promise.all([this.engine.disk.layerBytes(layer.id), this.engine.disk.checkpointImageBytes(c.id)]);
      if (await this.store.checkpoints.settle(c.id, { status: 'ready', deltaBytes, memoryBytes, readyAt: new Date().toISOString() })) this.observer.ready(c.id);
      this.log.warn({ instance: inst.id, checkpoint: c.id, adopted: Boolean(adopted) }, 'finished a checkpoint a server stop cut short; the instance runs on');
    } catch (err) {
      this.log.error({ err, instance: inst.id, checkpoint: c.id }, 'could not finish a checkpoint a server stop cut short');
    }
  }

  /** Why a checkpoint cannot be written now, if it cannot: its memory image needs about the
   * memory the sandbox uses. */
  private async spaceShortfall(inst: InstanceRecord, memory: boolean): Promise<string | undefined> {
    const memoryBytes = memory && inst.status === 'running' ? await this.engine.memoryInUse(inst.id) : 0;
    return shortOfRoom(this.engine, memoryBytes);
  }

  private async persistFrozen(instanceId: string, checkpointId: string, layers: string[], instanceLayers: string[], baseLayer: boolean, pauseMs: number | null, layerId: string): Promise<void> {
    const write = () =>
      this.store.transaction(async (tx) => {
        await tx.layers.settle(layerId);
        await tx.layers.setRefs(`instance:${instanceId}`, instanceLayers);
        await tx.layers.setRefs(`checkpoint:${checkpointId}`, layers);
        const sb = this.engine.sandbox(instanceId);
        await tx.instances.update(instanceId, { layers: instanceLayers, headCheckpointId: checkpointId, ...(sb ? { pid: sb.pid, pidStart: sb.startTime } : {}) });
        await tx.checkpoints.update(checkpointId, { layers, baseLayer, pauseMs });
      });
    for (let attempt = 0; ; attempt++) {
      try {
        return await write();
      } catch (err) {
        if (!isNoSpace(err) || attempt >= PERSIST_ATTEMPTS) throw err;
        if (attempt === 0) this.log.error({ err, checkpoint: checkpointId }, 'disk full: the frozen layer is not recorded yet; retrying');
        await new Promise((r) => setTimeout(r, PERSIST_RETRY_MS));
      }
    }
  }

  /** Resolves when no squash is under way (tests, shutdown). */
  idle(): Promise<void> {
    return this.squasher.idle();
  }

  /** Outcomes the store could not take (a full disk), shown as they are meanwhile. */
  private readonly unrecorded = new Map<string, string>();

  private async fail(c: CheckpointRecord, reason: string): Promise<void> {
    this.log.warn({ checkpoint: c.id, reason }, 'checkpoint failed');
    this.events.emit(c.instanceId, 'checkpoint.failed', { checkpoint_id: c.id, error: reason });
    try {
      // A failed checkpoint stands on nothing (a copied upper it held goes with the next collection).
      await this.store.layers.dropHolder(`checkpoint:${c.id}`);
      await this.store.checkpoints.settle(c.id, { status: 'failed', error: reason });
    } catch (err) {
      this.log.error({ err, checkpoint: c.id }, 'could not record a failed checkpoint; it shows as failed meanwhile');
      this.unrecorded.set(c.id, reason);
    }
  }

  /** The checkpoint as callers see it: a failure the store could not take yet shows as failed,
   * and so does a `processing` record that no job carries any more (it will never finish). */
  private async view(c: CheckpointRecord): Promise<CheckpointRecord> {
    if (c.status !== 'processing') return c;
    // Another node's job: only that node can tell whether it still runs.
    const inst = await this.store.instances.get(c.instanceId);
    if (inst && !this.instances.isLocal(inst)) return c;
    const reason = this.unrecorded.get(c.id) ?? (this.jobs.has(c.id) ? undefined : 'the checkpoint job ended without recording its outcome');
    if (!reason) return c;
    try {
      const settled = await this.store.checkpoints.settle(c.id, { status: 'failed', error: reason });
      this.unrecorded.delete(c.id);
      // Settled otherwise meanwhile (its job recorded it after all): that outcome stands.
      if (!settled) return (await this.store.checkpoints.get(c.id)) ?? { ...c, status: 'failed', error: reason };
    } catch {
      // still no room: try again on the next look
    }
    return { ...c, status: 'failed', error: reason };
  }

  /** A checkpoint's layers stand on its system image, unless its oldest is a squashed full root,
   * and its memory image holds the agent build it was made with: a node without either (another
   * machine's import, another agent build) says so, instead of failing its mount or restore. */
  private requireBaseHere(c: CheckpointRecord): void {
    if (!c.baseLayer && !this.engine.images.present(c.image)) {
      throw new ConflictError(`checkpoint ${c.id} stands on image ${c.image}, which this node does not have: import it here (forkpoint image import), or fork on a node that has it`, { reason: 'IMAGE_NOT_ON_NODE', image: c.image });
    }
    if (c.memory && !this.engine.hasAgentLayer(c.agentLayer)) {
      throw new ConflictError(`checkpoint ${c.id} holds running processes of agent build ${c.agentLayer}, which this node does not have (its nodes run different forkpoint builds): fork on a node of the same build, or from a checkpoint without memory`, { reason: 'AGENT_NOT_ON_NODE', agent_layer: c.agentLayer });
    }
  }

  /** The agent layer a sandbox from `c` gets: its own, or, booting from files only, this node's. */
  private agentLayerFor(c: CheckpointRecord): string {
    return this.engine.hasAgentLayer(c.agentLayer) ? c.agentLayer : this.engine.currentAgentLayer;
  }

  /** Waits (bounded) while the checkpoint is processing; it must end ready. */
  private async ready(c: CheckpointRecord): Promise<CheckpointRecord> {
    if (c.status === 'processing') await this.jobs.wait(c.id, AbortSignal.timeout(FORK_WAIT_MS));
    const raw = await this.store.checkpoints.get(c.id);
    if (!raw) throw new NotFoundError('checkpoint', c.id);
    const now = await this.view(raw);
    if (now.status === 'processing') throw new ConflictError(`checkpoint ${c.id} is still processing`);
    if (now.status === 'failed') throw new ConflictError(`checkpoint ${c.id} failed: ${now.error ?? 'unknown error'}`, { checkpoint: c.id });
    return now;
  }

  /** The checkpoint once it is no longer processing, or as it is when `signal` aborts. */
  async wait(owner: string, instanceId: string, id: string, signal: AbortSignal): Promise<CheckpointRecord> {
    await this.get(owner, instanceId, id);
    await this.jobs.wait(id, signal);
    return this.get(owner, instanceId, id);
  }

  /** Waits until the checkpoint is no longer processing and, once ready, in the object store,
   * or until `signal` aborts. */
  async waitDurable(owner: string, instanceId: string, id: string, signal: AbortSignal, durable: { enabled: boolean; waitFor(id: string, signal: AbortSignal): Promise<boolean> }): Promise<CheckpointRecord> {
    if (!durable.enabled) throw new ConflictError('this server has no object store: no checkpoint becomes durable here', { reason: 'NO_OBJECT_STORE' });
    const c = await this.wait(owner, instanceId, id, signal);
    if (c.status === 'ready') await durable.waitFor(c.id, signal);
    return c;
  }

  async rollback(owner: string, instanceId: string, checkpointId: string): Promise<InstanceRecord> {
    // Pinned from the moment it is chosen: retention (a checkpoint taken meanwhile with
    // delete_oldest) or a delete cannot take it from under the rollback.
    const chosen = await this.get(owner, instanceId, checkpointId);
    const unpin = this.pin(chosen.id);
    try {
      // Read again once pinned (ready): a delete may have come between the read and the pin.
      return await this.rollbackPinned(owner, instanceId, await this.ready(chosen));
    } finally {
      unpin();
    }
  }

  private async rollbackPinned(owner: string, instanceId: string, c: CheckpointRecord): Promise<InstanceRecord> {
    await this.observer.needed(c);
    return this.locks.run(instanceId, async () => {
      const inst = await this.instances.recordOf(instanceId);
      const spec = { ...this.instances.spec(inst), layers: c.layers, baseLayer: c.baseLayer, agentLayer: c.agentLayer };
      const images = c.memory ? c.id : undefined;
      const oldPid = this.engine.sandbox(inst.id)?.pid;
      // A warm standby of this rollback's, if there is one, is the engine's to swap in; one of
      // another checkpoint's goes (the engine holds one per instance).
      const rollbackKey = standbyKeyOf({ kind: 'rollback', instanceId: inst.id, checkpointId: c.id });
      if (!this.warm.take(rollbackKey, owner)) await this.warm.dropRollbackOf(inst.id);
      // Recorded before the old sandbox goes: from then on the instance stands on the
      // checkpoint's layers whatever becomes of the server (a restart takes back the restored
      // sandbox on them). The old layers stay referenced until the new sandbox runs. An
      // instance's references always hold its record's layers: a rollback to the layers it
      // stands on (the same checkpoint again, most rollbacks) has none to change.
      const sameLayers = sameSet(c.layers, inst.layers);
      if (!sameLayers) await this.store.layers.setRefs(`instance:${inst.id}`, [...new Set([...c.layers, ...inst.layers])]);
      const marked = await this.store.instances.update(inst.id, { layers: c.layers, baseLayer: c.baseLayer, agentLayer: c.agentLayer, headCheckpointId: c.id, restoringFrom: c.id });
      try {
        const t = performance.now();
        const { sandbox: sb, warm } = await this.engine.replace(spec, images);
        await watchesResumed(sb);
        if (!sameLayers) await this.store.layers.setRefs(`instance:${inst.id}`, c.layers);
        // A hibernated instance rolled back wakes on the checkpoint; its own memory image goes.
        await this.instances.dropHibernation(inst);
        const rec = await this.instances.running(inst.id, sb, { layers: c.layers, baseLayer: c.baseLayer, agentLayer: c.agentLayer, headCheckpointId: c.id, restoringFrom: null }, 'restore', marked);
        this.events.emit(inst.id, 'rollback', { checkpoint_id: c.id, warm, ms: Math.round((performance.now() - t) * 100) / 100 });
        // The next rollback to it finds one ready.
        if (images && inst.volumes.length === 0) this.warm.refill({ kind: 'rollback', instanceId: inst.id, checkpointId: c.id }, owner);
        return rec;
      } catch (err) {
        if (oldPid !== undefined && (await this.engine.leftoverPid(inst.id))?.pid === oldPid) {
          // Refused before the old sandbox was touched: it runs on, on its own layers.
          if (!sameLayers) await this.store.layers.setRefs(`instance:${inst.id}`, inst.layers);
          await this.store.instances.update(inst.id, { layers: inst.layers, baseLayer: inst.baseLayer, agentLayer: inst.agentLayer, headCheckpointId: inst.headCheckpointId, restoringFrom: null });
        } else {
          await this.store.instances.update(inst.id, { restoringFrom: null });
          await this.instances.failed(inst.id, (err as Error).message);
        }
        throw this.instances.engineFailure(err);
      }
    });
  }

  /**
   * Brings an instance whose node stopped answering back on this node, from its newest durable
   * checkpoint: its files as they were then, and with a memory checkpoint its processes. What it
   * did after that checkpoint is gone with its node.
   */
  async recoverLost(owner: string, id: string): Promise<InstanceRecord> {
    const inst = await this.instances.get(owner, id);
    if (inst.status !== 'lost') throw new ConflictError(`instance ${id} is ${inst.status}, not lost`, { status: inst.status });
    const ready = (await this.store.checkpoints.forInstance(id)).filter((c) => c.status === 'ready').reverse();
    let from: CheckpointRecord | undefined;
    for (const c of ready) if (await this.observer.durable(c.id)) {
      from = c;
      break;
    }
    if (!from) throw new ConflictError(`instance ${id} has no durable checkpoint to recover from`, { instance: id });
    const c = from;
    await this.instances.volumes.requireAllHere(inst.volumes);
    await this.observer.needed(c);
    this.requireBaseHere(c);
    await requireRoom(this.engine);
    return this.locks.run(id, async () => {
      const rec = await this.instances.claimLost(id, { layers: c.layers, baseLayer: c.baseLayer, agentLayer: this.agentLayerFor(c), headCheckpointId: c.id });
      try {
        await this.instances.admit(rec);
        const spec = this.instances.spec(rec);
        const sb = c.memory ? await this.engine.restore(spec, c.id, { setHostname: false, connections: 'close' }) : await this.engine.boot(spec, { freshUpper: true });
        const running = await this.instances.running(id, sb);
        this.log.info({ instance: id, checkpoint: c.id }, 'lost instance recovered on this node');
        return running;
      } catch (err) {
        await this.instances.failed(id, `the recovery failed: ${(err as Error).message}`);
        throw this.instances.engineFailure(err);
      }
    });
  }

  /** New instances from a checkpoint (or from the current state, through an implicit one). The
   * checkpoint is pinned from the moment it is chosen until the forks run: deleting it meanwhile
   * answers 409, deleting its instance waits for them. */
  async fork(owner: string, sourceId: string, input: ForkInput, as: ForkAs = {}): Promise<InstanceRecord[]> {
    const source = await this.instances.get(owner, sourceId);
    const instead = as.create;
    const count = input.count ?? 1;
    // With several forks a name is a prefix: name-1, name-2, ...
    const nameOf = (i: number) => (input.name && count > 1 ? `${input.name}-${i + 1}` : input.name);
    // Past the owner's quota before anything is made, not after a checkpoint and a few forks.
    await this.instances.checkQuota(as.owner ?? owner, instead ? this.instances.limitsFrom({ ...source.limits, ...instead.limits }) : source.limits, count);
    let c: CheckpointRecord;
    let unpin: () => void;
    if (input.checkpointId) {
      c = await this.checkpointOf(source, input.checkpointId);
      unpin = this.pin(c.id);
    } else {
      const made = await this.create(owner, sourceId, { label: 'fork', memory: source.status === 'running' || source.status === 'hibernated', retention: { mode: 'delete_oldest' } });
      unpin = this.pin(made.checkpoint.id);
      c = made.checkpoint;
      await made.done.catch(() => {});
    }
    try {
      c = await this.ready(c);
      // What a restore here needs (a warm fork needs none of it: its standby is here, restored).
      let restorable: Promise<void> | undefined;
      const canRestore = () => (restorable ??= (async () => {
        await this.observer.needed(c);
        this.requireBaseHere(c);
        await requireRoom(this.engine);
      })());
      const images = c.memory ? c.id : undefined;
      const made: string[] = [];
      const warm: string[] = [];
      const forOwner = as.owner ?? owner;
      // Warm forks: an owner's own forks, and a template's instances, of a memory checkpoint of a
      // source that mounts no volume (a standby would hold the owner's data and the volume in use).
      const warmable = images !== undefined && source.volumes.every((v) => v.volumeId === null) && input.volumes !== 'none' && (instead ? as.warm === true : forOwner === owner);
      const t = performance.now();
      const results = await Promise.allSettled(
        Array.from({ length: count }, async (_, i) => {
          const [createInput, from] = this.forkRecordOf(c, source, input, nameOf(i), instead);
          // A warm one first, made as this fork would be.
          const standby = warmable ? this.warm.take(c.id, forOwner) : undefined;
          if (standby) {
            const taken = await this.takeStandby(standby, forOwner, source, createInput, from);
            if (taken) {
              made.push(taken.id);
              warm.push(taken.id);
              return taken;
            }
          }
          await canRestore();
          const rec = await this.instances.newRecord(forOwner, createInput, from);
          made.push(rec.id);
          return this.locks.run(rec.id, async () => {
            const admitted = this.instances.admit(rec); // while it restores: see InstanceService.create
            admitted.catch(() => {});
            const spec = this.instances.spec(rec);
            const sb = images ? await this.engine.restore(spec, images, { setHostname: true, connections: 'close' }) : await this.engine.boot(spec, { freshUpper: true });
            failpoint('fork.restored');
            await admitted;
            if (images) await this.executions.adoptInFork(source.id, rec.id);
            return this.instances.running(rec.id, sb, { restoringFrom: null }, 'restore', rec);
          });
        }),
      );
      const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (!failed) {
        const forks = results.map((r) => (r as PromiseFulfilledResult<InstanceRecord>).value);
        this.events.emit(source.id, 'fork', { checkpoint_id: c.id, instance_ids: forks.map((f) => f.id), warm_ids: warm, ms: Math.round((performance.now() - t) * 100) / 100 });
        // The next fork of it finds one ready.
        if (warmable) this.warm.refill({ kind: 'fork', checkpointId: c.id, sourceId: source.id, template: instead !== undefined }, forOwner);
        return forks;
      }
      // All or nothing: a call that answers with an error leaves no instance of its own behind.
      this.log.warn({ err: failed.reason, checkpoint: c.id, count }, 'fork failed; removing the forks it made');
      await Promise.all(made.map((id) => this.instances.discard(id)));
      throw this.instances.engineFailure(failed.reason);
    } finally {
      unpin();
    }
  }

  /** What a fork's record is made of: its create input and what it takes from its source and
   * checkpoint (InstanceService.newRecord's arguments). */
  private forkRecordOf(c: CheckpointRecord, source: InstanceRecord, input: ForkInput, name: string | undefined, instead: CreateInstance | undefined): [CreateInstance, Partial<InstanceRecord>] {
    return [
      instead
        ? { ...instead, image: c.image, env: { ...source.env, ...instead.env }, limits: { ...source.limits, ...instead.limits }, ...userNamespaceOf(c) }
        : { name, image: c.image, env: { ...source.env, ...input.env }, limits: source.limits, metadata: source.metadata, maxCheckpoints: source.maxCheckpoints ?? undefined, ...userNamespaceOf(c) },
      {
        layers: c.layers, baseLayer: c.baseLayer, agentLayer: this.agentLayerFor(c), sourceInstanceId: source.id, sourceCheckpointId: c.id, headCheckpointId: c.id, imageRef: source.imageRef, workdir: source.workdir, defaultUser: source.defaultUser, imageVolumes: source.imageVolumes, restoringFrom: c.id,
        // A template's instances (`instead`, another owner's) never get the source's volumes.
        volumes: instead || input.volumes === 'none' ? placeholdersFor(source.volumes) : source.volumes,
        // Its processes hold the source's placeholders and trust its CA: a fork of the same
        // owner keeps both; a template's instance (another owner's) gets neither rule.
        secrets: instead ? [] : source.secrets,
        egressCa: instead ? null : source.egressCa,
        // The same machine on the same leash: a fork of a denied instance must not get the
        // default (open) policy. A template's instance takes its create's.
        ...(instead ? {} : { egress: source.egress }),
      },
    ];
  }

  /** A warm fork's standby for `owner`'s next fork of the checkpoint (or, `template`, its next
   * instance of the template whose checkpoint it is), made as that fork would be with nothing
   * asked, restored and held frozen under the server's own owner (warm-standbys.ts). */
  async makeStandby(recipe: Extract<StandbyRecipe, { kind: 'fork' }>, owner: string): Promise<Pick<Standby, 'id' | 'processes' | 'imageKey'>> {
    const { checkpointId, sourceId, template } = recipe;
    const [c, source] = await Promise.all([this.store.checkpoints.get(checkpointId), this.store.instances.get(sourceId)]);
    if (!c || c.status !== 'ready' || !c.memory || !source || source.owner !== (template ? templateOwner(owner) : owner)) throw new NotFoundError('checkpoint', checkpointId);
    this.requireBaseHere(c);
    await requireRoom(this.engine);
    const rec = await this.instances.newRecord(standbyOwnerOf(owner), ...this.forkRecordOf(c, source, {}, undefined, template ? {} : undefined));
    try {
      const processes = await this.locks.run(rec.id, async () => {
        await this.instances.admit(rec);
        const sb = await this.engine.restore(this.instances.spec(rec), c.id, { setHostname: true, connections: 'close' });
        // Listed while it runs (a frozen agent answers nothing), then held where it stands.
        const listed = (await sb.list()).map((p) => p.id);
        await this.engine.hold(rec.id);
        await this.instances.running(rec.id, sb, { restoringFrom: null });
        return listed;
      });
      // Deleted meanwhile (its deletion waits only for standbys it knows are being made).
      if (!(await this.store.checkpoints.get(checkpointId))) throw new NotFoundError('checkpoint', checkpointId);
      return { id: rec.id, processes, imageKey: null };
    } catch (err) {
      await this.instances.discard(rec.id);
      throw err;
    }
  }

  /** A warm rollback's standby: the instance's checkpoint restored beside its running sandbox
   * by the engine, as the rollback to it would restore it (rollbackPinned's spec). No lock: a
   * rollback, stop or hibernate meanwhile is the engine's to order (holdRollback). */
  async makeRollbackStandby(recipe: Extract<StandbyRecipe, { kind: 'rollback' }>): Promise<(Pick<Standby, 'id' | 'processes' | 'imageKey'> & { memoryBytes: number }) | undefined> {
    const [c, inst] = await Promise.all([this.store.checkpoints.get(recipe.checkpointId), this.store.instances.get(recipe.instanceId)]);
    if (!c || c.status !== 'ready' || !c.memory || !inst || inst.volumes.length) return undefined;
    const held = await this.engine.holdRollback({ ...this.instances.spec(inst), layers: c.layers, baseLayer: c.baseLayer, agentLayer: c.agentLayer }, c.id);
    return held && { id: inst.id, processes: [], imageKey: null, memoryBytes: held.memoryBytes };
  }

  /** The standby becomes `owner`'s fork, made of `createInput` and `from` as a new record would
   * be: handed over, its policy put in force if it is another, thawed (its hostname the fork's
   * name, when it has one). Undefined when it cannot be used: the fork restores as usual (a
   * standby of other limits goes back to the pool; a broken one is removed). Its owner's quota
   * refusing it is the fork's answer, and the standby goes back to the pool. */
  private async takeStandby(s: Standby, owner: string, source: InstanceRecord, createInput: CreateInstance, from: Partial<InstanceRecord>): Promise<InstanceRecord | undefined> {
    let taken: { rec: InstanceRecord; policyChanged: boolean };
    try {
      taken = await this.instances.takeStandby(s.id, standbyOwnerOf(owner), owner, createInput, from);
    } catch (err) {
      const unfit = err instanceof StandbyUnfitError && err.reusable;
      if (err instanceof QuotaExceededError || unfit) {
        this.warm.giveBack(s);
        if (unfit) return undefined;
        throw err;
      }
      this.log.warn({ err, instance: s.id }, 'a warm fork could not be taken; restoring instead');
      await this.instances.discard(s.id);
      return undefined;
    }
    const { rec, policyChanged } = taken;
    try {
      return await this.locks.run(rec.id, async () => {
        if (policyChanged) await this.instances.admit(rec);
        await this.engine.activate(rec.id, createInput.name !== undefined ? { hostname: rec.name } : {});
        await this.store.executions.copy(source.id, rec.id, s.processes);
        return rec;
      });
    } catch (err) {
      this.log.warn({ err, instance: s.id }, 'a warm fork could not be started; restoring instead');
      await this.instances.discard(s.id);
      return undefined;
    }
  }

  /** Deletes one checkpoint. Its layers stay while an instance, a fork or another checkpoint
   * stands on them. */
  async delete(owner: string, instanceId: string, id: string): Promise<void> {
    const c = await this.get(owner, instanceId, id);
    if (c.status === 'processing') throw new ConflictError(`checkpoint ${id} is still processing`);
    if (this.pinned(id)) throw new ConflictError(`checkpoint ${id} is being forked from or rolled back to; delete it once that is done`, { checkpoint: id });
    await this.removeRecord(c);
    await this.instances.collectLayers();
  }

  private async removeRecord(c: CheckpointRecord): Promise<void> {
    await this.warm.drop(c.id);
    await this.store.transaction(async (tx) => {
      await tx.layers.dropHolder(`checkpoint:${c.id}`);
      await tx.checkpoints.delete(c.id);
    });
    this.engine.disk.removeCheckpointImages(c.id).catch((err: unknown) => this.log.warn({ err, checkpoint: c.id }, "could not remove memory images"));
    this.observer.removed(c.id);
  }

  /** Every checkpoint of a deleted instance goes with it, once its jobs are over and no fork
   * reads from it any more (nothing is removed if that takes too long: 409). */
  async deleteAllOf(instanceId: string): Promise<void> {
    const all = await this.store.checkpoints.forInstance(instanceId);
    for (const c of all) {
      if (c.status === 'processing') await this.jobs.wait(c.id, AbortSignal.timeout(FORK_WAIT_MS));
      if (!(await this.unpinned(c.id, FORK_WAIT_MS))) {
        throw new ConflictError(`checkpoint ${c.id} of instance ${instanceId} is still being forked from; try again`, { checkpoint: c.id });
      }
    }
    for (const c of all) await this.removeRecord(c);
  }

  /** The tree of an instance: its checkpoints by parent, and the forks made from each. */
  async lineage(owner: string, instanceId: string): Promise<LineageNode> {
    const inst = await this.instances.get(owner, instanceId);
    const owned = (await this.store.instances.all()).filter((f) => f.owner === owner);
    const node = async (i: InstanceRecord): Promise<LineageNode> => {
      const cps = await this.store.checkpoints.forInstance(i.id);
      const cpNode = async (c: CheckpointRecord): Promise<LineageNode> => ({
        kind: 'checkpoint',
        id: c.id,
        label: c.label,
        status: c.status,
        children: [
          ...(await Promise.all(cps.filter((x) => x.parentId === c.id).map(cpNode))),
          ...(await Promise.all(owned.filter((f) => f.sourceCheckpointId === c.id).map(node))),
        ],
      });
      const own = new Set(cps.map((c) => c.id));
      return {
        kind: 'instance',
        id: i.id,
        label: i.name,
        status: i.status,
        children: await Promise.all(cps.filter((c) => !c.parentId || !own.has(c.parentId)).map(cpNode)),
      };
    };
    return node(inst);
  }

  /** After a restart: a job cut short is `failed`; a layer frozen just before the crash is
   * given back to its instance; a layer never frozen is forgotten. */
  async recover(): Promise<void> {
    for (const c of await this.store.checkpoints.withStatus('processing')) await this.finishInterrupted(c);
    for (const rec of await this.instances.local()) {
      await this.instances.finishInterruptedHibernation(rec).catch((err: unknown) => this.log.error({ err, instance: rec.id }, 'could not finish a hibernation a server stop cut short'));
    }
    for (const p of await this.store.layers.pending()) {
      const inst = await this.store.instances.get(p.instanceId);
      if (inst && !this.instances.isLocal(inst)) continue; // another node's, to settle at its start
      if (inst && this.engine.disk.recoverFrozenLayer(p.id, inst.id) && !inst.layers.includes(p.id)) {
        const layers = [p.id, ...inst.layers];
        await this.store.layers.setRefs(`instance:${inst.id}`, layers);
        await this.store.instances.update(inst.id, { layers });
        this.log.warn({ instance: inst.id, layer: p.id }, 'recovered a layer frozen before a crash');
      }
      await this.store.layers.settle(p.id);
    }
    for (const c of await this.store.checkpoints.withStatus('processing')) {
      const inst = await this.store.instances.get(c.instanceId);
      if (inst && !this.instances.isLocal(inst)) continue;
      // Whatever of its memory image the stop left is nobody's.
      await bestEffort(() => this.engine.disk.removeCheckpointImages(c.id), this.log);
      await this.fail(c, 'the server stopped while the checkpoint was being taken');
    }
    // Memory images fetched here of checkpoints another node deleted meanwhile.
    for (const id of await this.engine.disk.localCheckpointImages()) {
      if (!(await this.store.checkpoints.get(id))) await this.engine.disk.removeCheckpointImages(id);
    }
    await this.instances.collectLayers();
  }
}

/** A memory image restores only in the mode it was dumped in (with a user namespace or
 * without); a fork of a disk-only checkpoint boots in the server's default. */
function userNamespaceOf(c: CheckpointRecord): { userNamespace?: boolean } {
  return c.memory ? { userNamespace: c.userNamespace } : {};
}
