import { UidRangePool, UidRangesExhaustedError } from './uid-ranges.js';
import { checkAgainstHost, checkOwnerQuota, hostCapacity, ownerQuotaOf, type HostCapacity, type OwnerUsage } from './quotas.js';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import type { SandboxEnd, SandboxRuntime, SandboxSpec } from '../seam/runtime.js';
import type { SandboxHandle } from '../seam/sandbox.js';
import type { Store } from '../store/index.js';
import { newId } from '../store/ids.js';
import { ownMountsOf } from '../lib/volume-path.js';
import type { ExpiryAction, InstancePatch, InstanceRecord, Limits, Page } from '../store/instances.js';
import { Lifecycle } from './lifecycle.js';
import { DEFAULT_POLICY, parseEntry, type EgressPolicy } from '../lib/egress-policy.js';
import { macOf } from '../lib/ipv4.js';
import { engineFailure } from './engine-failure.js';
import type { EventBus } from './events.js';
import type { ImageCatalog, ResolvedImage } from './images.js';
import { requireRoom } from './space.js';
import { AddressesExhaustedError, ConflictError, InsufficientStorageError, InvalidRequestError, isStoreAway, NotFoundError, QuotaExceededError } from './errors.js';
import { ownerRecordsLock, type KeyedLock } from './jobs.js';
import { isStandby, standbyKeyOf, standbyOwnerOf, StandbyUnfitError, type Standby, type WarmStandbys } from './warm-standbys.js';
import type { VolumeRequest, VolumeService } from './volumes.js';
import type { EgressSecretService, SecretRequest } from './egress-secrets.js';

/** How long CPU use is measured over for a usage reading. */
const USAGE_WINDOW_MS = 250;

export interface InstanceUsage {
  at: Date;
  cpuCount: number;
  /** Of the CPUs its limit allows (`cpuCount`), over the reading's window. */
  cpuUsedPercent: number;
  memoryBytes: number;
  memoryLimitBytes: number;
  diskBytes: number;
  /** Its disk limit or, with none, what it wrote and the room left under the data directory. */
  diskTotalBytes: number;
}

export interface CreateInstance {
  name?: string | undefined;
  image?: string | undefined;
  env?: Record<string, string> | undefined;
  limits?: Partial<Limits> | undefined;
  metadata?: Record<string, string> | undefined;
  maxCheckpoints?: number | undefined;
  /** Seconds without activity after which it hibernates by itself (0 or none: never). */
  idleTimeoutS?: number | undefined;
  /** Where it may open connections to (default: anywhere public). */
  egress?: EgressPolicy | undefined;
  /** A user namespace of its own (default: the server's `userNamespaces`); false: the host's
   * ids, weaker, for images that need them. */
  userNamespace?: boolean | undefined;
  /** Persistent volumes to mount (the owner's, on this node). */
  volumes?: VolumeRequest[] | undefined;
  /** Secrets its requests to some hosts carry (it sees placeholders). */
  secrets?: SecretRequest[] | undefined;
  /** A secret store (by name) whose secrets it gets, each in a variable of its name, and whose
   * egress allowlist it gets unless `egress` says otherwise. */
  secretStore?: string | undefined;
}

const BASE_ENV: Record<string, string> = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  HOME: '/root',
  TERM: 'xterm-256color',
  LANG: 'C.UTF-8',
};
export const INSTANCE_NAME = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
const MAX_POLICY_ENTRIES = 256;

/** A policy whose every entry is an address, a CIDR or a host name (else 400). */
function checkEgress(p: EgressPolicy): EgressPolicy {
  const all = [...p.allow, ...p.deny];
  if (all.length > MAX_POLICY_ENTRIES) throw new InvalidRequestError(`at most ${MAX_POLICY_ENTRIES} allow and deny entries`);
  const bad = all.find((e) => !parseEntry(e));
  if (bad !== undefined) throw new InvalidRequestError(`not an IPv4 address, CIDR or host name: ${bad}`, { entry: bad });
  return { egress: p.egress, allow: [...p.allow], deny: [...p.deny] };
}

/** Instances: their records and lifecycle (create, start, stop, hibernate, wake, delete). */
export class InstanceService {
  /** Instances whose deletion is under way: no new checkpoint job may queue behind it. */
  private readonly deleting = new Set<string>();
  /** Records of the sandboxes running here, as last read: what answers while the store is away. */
  private readonly lastRead = new Map<string, InstanceRecord>();

  constructor(
    private readonly store: Store,
    private readonly engine: SandboxRuntime,
    private readonly images: ImageCatalog,
    private readonly locks: KeyedLock,
    private readonly config: Config,
    private readonly events: EventBus,
    private readonly log: Logger,
    /** The node this server is: instances it makes are its, and only its are its to run. */
    readonly nodeId: string,
    readonly volumes: VolumeService,
    readonly secrets: EgressSecretService,
    /** Sandboxes booted ahead for the next creates from images created from. */
    private readonly warm: WarmStandbys,
  ) {
    this.lifecycle = new Lifecycle(store, nodeId);
  }

  /** Every status change of this node's instances goes through it. */
  readonly lifecycle: Lifecycle;

  /** An address no instance (of any node) has; a named 503 when the subnet is full. */
  freeAddress(used: Iterable<string>): string {
    const net = this.engine.network.allocate(new Set(used));
    if (!net) throw new AddressesExhaustedError();
    return net.address;
  }

  private host: Promise<HostCapacity> | undefined;

  /** Refuses limits beyond the host's size, and `count` more instances with them that would take
   * the owner past its quota (quotas.ts). Creates and forks check again, one at a time per owner,
   * as they take their records. */
  async checkQuota(owner: string, limits: Limits, count: number, used?: OwnerUsage): Promise<void> {
    this.host ??= hostCapacity(this.config.dataDir);
    const host = await this.host;
    checkAgainstHost(limits, host);
    checkOwnerQuota(ownerQuotaOf(this.config, host), used ?? (await this.store.instances.usageOf(owner)), limits, count, this.networking);
  }

  /** The host uid ranges of the sandboxes' user namespaces (uid-ranges.ts). */
  get uidRanges(): UidRangePool {
    return new UidRangePool(this.config.uidRangeStart, this.config.uidRanges, this.config.uidRangesPerOwner);
  }

  /** The instances whose disk and processes are on this node. */
  local(): Promise<InstanceRecord[]> {
    return this.store.instances.forNode(this.nodeId);
  }

  isLocal(rec: InstanceRecord): boolean {
    return rec.node === null || rec.node === this.nodeId;
  }

  private get networking(): boolean {
    return this.config.networking === 'on';
  }

  isBeingDeleted(id: string): boolean {
    return this.deleting.has(id);
  }

  /** What a running instance uses now: CPU over a short window, memory and disk, beside its
   * limits. Undefined when it does not run here (hibernated, stopped). */
  async usage(owner: string, id: string, windowMs = USAGE_WINDOW_MS): Promise<InstanceUsage | undefined> {
    const inst = await this.get(owner, id);
    if (inst.status !== 'running' || !this.engine.sandbox(id)) return undefined;
    const before = await this.engine.usage(id);
    await new Promise((r) => setTimeout(r, windowMs));
    const now = await this.engine.usage(id);
    const cpuCount = Math.max(1, Math.round(inst.limits.cpuPercent / 100));
    return {
      at: new Date(),
      cpuCount,
      cpuUsedPercent: Math.min(100, Math.max(0, ((now.cpuUs - before.cpuUs) / (windowMs * 1000 * cpuCount)) * 100)),
      memoryBytes: now.memoryBytes,
      memoryLimitBytes: inst.limits.memoryMb * 1024 * 1024,
      diskBytes: now.diskBytes,
      diskTotalBytes: inst.limits.diskMb ? inst.limits.diskMb * 1024 * 1024 : now.diskBytes + (await this.engine.freeBytes()),
    };
  }

  async get(owner: string, id: string): Promise<InstanceRecord> {
    let rec: InstanceRecord | undefined;
    try {
      rec = await this.store.instances.get(id);
    } catch (err) {
      // The database away: a sandbox running here is served from its record as last read, so
      // calls that need only this node (exec, files, streams) go on meanwhile.
      const known = this.lastRead.get(id);
      if (!isStoreAway(err) || !known || !this.engine.sandbox(id)) throw err;
      rec = known;
    }
    if (!rec || rec.owner !== owner) throw new NotFoundError('instance', id);
    if (this.isLocal(rec) && this.engine.sandbox(id)) this.lastRead.set(id, rec);
    else this.lastRead.delete(id);
    return rec;
  }

  /** The instance's record as it is now, for a call that holds its lock: one deleted while the
   * call waited for the lock is a 404 (the owner was checked before). */
  async recordOf(id: string): Promise<InstanceRecord> {
    const rec = await this.store.instances.get(id);
    if (!rec) throw new NotFoundError('instance', id);
    return rec;
  }

  async list(owner: string, limit: number, cursor?: string): Promise<Page<InstanceRecord>> {
    if (cursor && (await this.store.instances.get(cursor))?.owner !== owner) throw new InvalidRequestError('unknown cursor');
    return this.store.instances.page(owner, limit, cursor);
  }

  spec(rec: InstanceRecord): SandboxSpec {
    return {
      id: rec.id,
      hostname: rec.name,
      image: rec.image,
      layers: rec.layers,
      baseLayer: rec.baseLayer,
      agentLayer: rec.agentLayer,
      limits: rec.limits,
      diskMb: rec.limits.diskMb ?? null,
      network: rec.address && this.networking ? { address: rec.address, mac: macOf(rec.address) } : null,
      uidBase: rec.uidBase,
      volumes: rec.volumes.map(({ volumeId, path, readOnly }) => ({ volumeId, path, readOnly })),
      ownMounts: ownMountsOf(rec.imageVolumes, rec.volumes.map((v) => v.path)),
    };
  }

  limitsFrom(input: Partial<Limits> | undefined): Limits {
    return {
      memoryMb: input?.memoryMb ?? this.config.defaultMemoryMb,
      pids: input?.pids ?? this.config.defaultPids,
      cpuPercent: input?.cpuPercent ?? this.config.defaultCpuPercent,
      diskMb: input?.diskMb ?? (this.config.defaultDiskMb || null),
    };
  }

  /** Renames an instance or replaces its metadata. A new name is its hostname from its next
   * boot or fork on (a running sandbox keeps the one it has). */
  async update(owner: string, id: string, patch: { name?: string | undefined; metadata?: Record<string, string> | undefined }): Promise<InstanceRecord> {
    await this.get(owner, id);
    if (patch.name !== undefined && !INSTANCE_NAME.test(patch.name)) {
      throw new InvalidRequestError('name must be 1-63 lowercase letters, digits or hyphens, not starting or ending with a hyphen', { name: patch.name });
    }
    return this.store.instances.update(id, {
      ...(patch.name !== undefined ? { name: patch.name } : {}),
      ...(patch.metadata !== undefined ? { metadata: patch.metadata } : {}),
    });
  }

  /** A new record in `starting`, with its disk and layer references; not yet booted. */
  async newRecord(owner: string, input: CreateInstance, from?: Partial<InstanceRecord>, image?: ResolvedImage): Promise<InstanceRecord> {
    // A fork or a template names its layers and directory itself (`from`); a build names the
    // image it stands on (`image`), whoever owns it.
    const resolved: ResolvedImage =
      image ??
      (from
        ? { ref: from.imageRef ?? null, base: input.image ?? this.config.defaultImage, layers: [], config: { ...this.images.emptyConfig, workdir: from.workdir ?? null, user: from.defaultUser ?? null, volumes: from.imageVolumes ?? [] }, key: '' }
        : await this.images.resolve(owner, input.image ?? this.config.defaultImage));
    // A fork or template brings its source's (`from`): the owner's request is a new instance's.
    const volumes = from ? [] : await this.volumes.mounts(owner, input.volumes);
    if (!from && (input.secrets?.length || input.secretStore !== undefined) && !this.networking) throw new InvalidRequestError('secrets reach their hosts through the sandboxes\' network, which this server runs without (FORKPOINT_NETWORKING)');
    const bound = from ? { secrets: [], env: {}, egressCa: null, egressAllowlist: [] } : await this.secrets.bind(owner, input.secrets, input.secretStore);
    const egress = input.egress ?? (bound.egressAllowlist.length ? { egress: 'deny' as const, allow: bound.egressAllowlist, deny: [] } : DEFAULT_POLICY);
    const id = newId('inst');
    const name = input.name ?? id.replace('_', '-');
    if (!INSTANCE_NAME.test(name)) {
      throw new InvalidRequestError('name must be 1-63 lowercase letters, digits or hyphens, not starting or ending with a hyphen', { name });
    }
    const now = new Date().toISOString();
    const rec: InstanceRecord = {
      id,
      owner,
      name,
      image: resolved.base,
      status: 'starting',
      layers: resolved.layers,
      baseLayer: false,
      agentLayer: this.engine.currentAgentLayer,
      env: { ...resolved.config.env, ...input.env, ...bound.env },
      limits: this.limitsFrom(input.limits),
      metadata: input.metadata ?? {},
      pid: null,
      pidStart: null,
      sourceInstanceId: null,
      sourceCheckpointId: null,
      maxCheckpoints: input.maxCheckpoints ?? null,
      headCheckpointId: null,
      hibernationId: null,
      idleTimeoutS: input.idleTimeoutS && input.idleTimeoutS > 0 ? input.idleTimeoutS : null,
      address: null,
      egress: checkEgress(egress),
      imageRef: resolved.ref,
      workdir: resolved.config.workdir,
      expiresAt: null,
      onExpiry: null,
      error: null,
      createdAt: now,
      updatedAt: now,
      restoringFrom: null,
      volumes,
      secrets: bound.secrets,
      egressCa: bound.egressCa,
      warmFork: false,
      defaultUser: resolved.config.user,
      imageVolumes: resolved.config.volumes ?? [],
      ...from,
      node: this.nodeId,
      uidBase: null,
      version: 0,
    };
    // One owner's records are taken one at a time on a node, so that two creates cannot both
    // fit the last of its quota.
    const take = () => this.locks.run(ownerRecordsLock(owner), () => this.store.transaction(async (tx) => {
      await this.checkQuota(owner, rec.limits, 1, await tx.instances.usageOf(owner));
      // Checked before, but a deletion may have come in between; deletions take this lock too.
      for (const v of rec.volumes) {
        if (v.volumeId !== null && !(await tx.volumes.get(v.volumeId))) throw new ConflictError(`volume ${v.name} was deleted`, { reason: 'VOLUME_MISSING', volume: v.name });
      }
      // A fresh address for every new instance, forks included (a fork is a new machine).
      if (this.networking) rec.address = this.freeAddress(await tx.instances.addresses());
      // A range of its own, forks included: no two sandboxes ever share one.
      if (input.userNamespace ?? this.config.userNamespaces === 'on') rec.uidBase = this.uidRanges.allocate(await tx.instances.uidRanges(), rec.owner);
      await tx.instances.insert(rec);
      await tx.layers.setRefs(`instance:${rec.id}`, rec.layers);
    }));
    try {
      await take();
    } catch (err) {
      // Standbys hold addresses and uid ranges of the pools every owner shares: an instance
      // someone asked for comes first, so they give theirs up and the record is taken again.
      const exhausted = err instanceof AddressesExhaustedError || err instanceof UidRangesExhaustedError;
      if (!exhausted || isStandby(rec) || !(await this.warm.release())) throw err;
      rec.address = null;
      rec.uidBase = null;
      await take();
    }
    return rec;
  }

  /** A warm fork's standby (held by `from`, warm-standbys.ts) becomes `owner`'s instance, as
   * `newRecord(owner, input, fields)` would have made it: within the owner's quota, with the
   * fork's own name, variables, settings and policy. STANDBY_UNFIT (409) when it was made with
   * other limits than these; STANDBY_GONE when it is no longer `from`'s. Answers the record and
   * whether its policy or secret rules are other than the standby's (to be put in force). */
  async takeStandby(id: string, from: string, owner: string, input: CreateInstance, fields: Partial<InstanceRecord>): Promise<{ rec: InstanceRecord; policyChanged: boolean }> {
    if (input.name !== undefined && !INSTANCE_NAME.test(input.name)) {
      throw new InvalidRequestError('name must be 1-63 lowercase letters, digits or hyphens, not starting or ending with a hyphen', { name: input.name });
    }
    const limits = this.limitsFrom(input.limits);
    const patch: InstancePatch = {
      env: { ...input.env },
      metadata: input.metadata ?? {},
      maxCheckpoints: input.maxCheckpoints ?? null,
      idleTimeoutS: input.idleTimeoutS && input.idleTimeoutS > 0 ? input.idleTimeoutS : null,
      egress: fields.egress ?? checkEgress(input.egress ?? DEFAULT_POLICY),
      secrets: fields.secrets ?? [],
      warmFork: true,
      ...(input.name !== undefined ? { name: input.name } : {}),
    };
    return this.locks.run(ownerRecordsLock(owner), () => this.store.transaction(async (tx) => {
      const rec = await tx.instances.get(id);
      if (!rec || rec.owner !== from) throw new ConflictError(`standby ${id} is gone`, { reason: 'STANDBY_GONE' });
      const l = rec.limits;
      if (l.memoryMb !== limits.memoryMb || l.pids !== limits.pids || l.cpuPercent !== limits.cpuPercent || (l.diskMb ?? null) !== (limits.diskMb ?? null)) throw new StandbyUnfitError(id);
      await this.checkQuota(owner, rec.limits, 1, await tx.instances.usageOf(owner));
      // The standby keeps its range: only the owner's share is checked (not every range read).
      if (rec.uidBase !== null) this.uidRanges.requireRoomFor(await tx.instances.uidRangesHeldBy(owner));
      const taken = await tx.instances.handOver(id, from, owner, patch);
      if (!taken) throw new ConflictError(`standby ${id} is gone`, { reason: 'STANDBY_GONE' });
      return { rec: taken, policyChanged: JSON.stringify([rec.egress, rec.secrets]) !== JSON.stringify([taken.egress, taken.secrets]) };
    }));
  }

  /**
   * Takes a lost instance for this node, standing on `from` (a durable checkpoint's chain,
   * fetched here): a new address on this node's network, no memory image of its old node. Only
   * one node wins a race for it; the others get 409.
   */
  async claimLost(id: string, from: Pick<InstanceRecord, 'layers' | 'baseLayer' | 'agentLayer' | 'headCheckpointId'>): Promise<InstanceRecord> {
    if (!(await this.store.instances.claimLost(id, this.nodeId))) throw new ConflictError(`instance ${id} is not lost (any more)`);
    return this.store.transaction(async (tx) => {
      const address = this.networking ? this.freeAddress(await tx.instances.addresses()) : null;
      await tx.layers.setRefs(`instance:${id}`, from.layers);
      return tx.instances.update(id, { ...from, address, hibernationId: null, pid: null, pidStart: null, error: null });
    });
  }

  /** Takes back this node's instances the others marked lost while it lived on: each as what
   * it is here (running if its sandbox runs), unless another node recovered it meanwhile. */
  async reclaimLost(recs: InstanceRecord[]): Promise<void> {
    for (const rec of recs) {
      if (!this.isLocal(rec)) continue;
      const status = this.engine.sandbox(rec.id) ? 'running' : rec.hibernationId ? 'hibernated' : 'stopped';
      if (await this.store.instances.reclaimLost(rec.id, this.nodeId, status)) this.log.warn({ instance: rec.id, status }, 'took back an instance marked lost while this node lived on');
    }
  }

  /** The lease is in doubt: every sandbox here stops where it stands (see Cluster). */
  async freezeAll(): Promise<void> {
    for (const id of this.engine.liveIds()) {
      await this.engine.freeze(id).catch((err: unknown) => this.log.error({ err, instance: id }, 'could not freeze a sandbox'));
    }
  }

  /** The lease holds again: what is still this node's thaws (taken back if it was marked lost
   * meanwhile); what another node took over is stopped here, its disk and address let go, its
   * record left to its new node. Answers the instances let go of. */
  async settleLease(): Promise<string[]> {
    const letGo: string[] = [];
    for (const id of this.engine.liveIds()) {
      const rec = await this.store.instances.get(id);
      if (rec?.node === this.nodeId) {
        if (rec.status === 'lost') await this.store.instances.reclaimLost(id, this.nodeId, 'running');
        await this.engine.thaw(id).catch((err: unknown) => this.log.error({ err, instance: id }, 'could not thaw a sandbox'));
        continue;
      }
      this.log.warn({ instance: id, node: rec?.node ?? null }, 'an instance this node ran is another node\'s now (or gone): its sandbox here is stopped');
      await this.engine.destroy(id).catch((err: unknown) => this.log.error({ err, instance: id }, 'could not stop a sandbox taken over by another node'));
      await this.engine.network.forget(id).catch((err: unknown) => this.log.warn({ err, instance: id }, 'could not let go of an address'));
      this.lastRead.delete(id);
      letGo.push(id);
    }
    return letGo;
  }

  /** Puts a new instance's egress policy in force, before it boots. */
  async admit(rec: InstanceRecord): Promise<void> {
    if (rec.address) await this.engine.network.setPolicy(rec.id, rec.address, rec.egress, await this.secrets.forEngine(rec));
  }

  /** A secret's value changed or it went (an owner's own, or one of a secret store's; any of the
   * store's when no name is given): the instances here that use it get their rules again. How
   * many did. */
  async refreshSecret(owner: string, name: string | undefined, store?: string): Promise<number> {
    let renewed = 0;
    for (const rec of await this.local()) {
      if (rec.owner !== owner || !rec.secrets.some((s) => s.store === store && (name === undefined || s.name === name))) continue;
      await this.admit(rec).then(
        () => renewed++,
        (err: unknown) => this.log.warn({ err, instance: rec.id }, 'could not renew an instance\'s secret rules'),
      );
    }
    return renewed;
  }

  /** Replaces an instance's egress policy; in force at once, for connections opened from now on. */
  async setEgress(owner: string, id: string, policy: EgressPolicy): Promise<InstanceRecord> {
    const rec = await this.get(owner, id);
    const egress = checkEgress(policy);
    if (rec.address) await this.engine.network.setPolicy(id, rec.address, egress).catch((err: unknown) => Promise.reject(this.engineFailure(err)));
    return this.store.instances.update(id, { egress });
  }

  /** Bytes the instance sent and received over its network since its node's server started;
   * null on another node than the instance's (the counters live in its node's memory). */
  networkCounters(rec: InstanceRecord): { sentBytes: number; receivedBytes: number } | null {
    return this.isLocal(rec) ? this.engine.network.counters(rec.id) : null;
  }

  async create(owner: string, input: CreateInstance, image?: ResolvedImage): Promise<InstanceRecord> {
    await requireRoom(this.engine);
    // A create from an image with nothing of its own to mount or bind: a standby booted ahead
    // (warm-standbys.ts) stands in for it when there is one, and one is made for the next.
    const warmFrom = !image && !input.volumes?.length && !input.secrets?.length && input.secretStore === undefined && (input.userNamespace ?? this.userNamespacesByDefault) === this.userNamespacesByDefault ? input.image ?? this.config.defaultImage : undefined;
    const refill = () => warmFrom !== undefined && this.warm.refill({ kind: 'create', image: warmFrom }, owner);
    const standby = warmFrom !== undefined ? this.warm.take(standbyKeyOf({ kind: 'create', image: warmFrom }), owner) : undefined;
    const taken = standby && warmFrom !== undefined && (await this.takeBootedStandby(standby, owner, warmFrom, input));
    if (taken) {
      refill();
      return taken;
    }
    const rec = await this.newRecord(owner, input, undefined, image);
    try {
      // The policy goes in while the sandbox boots: until it is in, the firewall lets nothing of
      // the new address out (no entry: dropped), so nothing escapes meanwhile.
      const admitted = this.admit(rec);
      admitted.catch(() => {});
      let booted = await this.locks.run(rec.id, () => this.bootRecord(rec, { freshUpper: true }));
      await admitted;
      // Its tools trust its egress CA before anything of the caller's runs (forks have it already).
      const sb = this.engine.sandbox(rec.id);
      if (rec.egressCa && sb) booted = await this.store.instances.update(rec.id, { env: { ...booted.env, ...(await this.secrets.installCa(rec, sb)) } });
      refill();
      return booted;
    } catch (err) {
      // Out of space is not the instance's fault: nothing of it stays for a retry to trip on.
      if (err instanceof InsufficientStorageError) await this.discard(rec.id);
      throw this.engineFailure(err);
    }
  }

  private get userNamespacesByDefault(): boolean {
    return this.config.userNamespaces === 'on';
  }

  /** A standby for `owner`'s next create from `image` with nothing asked: booted on its own
   * record (under standbyOwnerOf), held frozen. */
  async makeStandby(image: string, owner: string): Promise<Pick<Standby, 'id' | 'processes' | 'imageKey'>> {
    await requireRoom(this.engine);
    const resolved = await this.images.resolve(owner, image);
    const rec = await this.newRecord(standbyOwnerOf(owner), { image }, undefined, resolved);
    try {
      await this.admit(rec);
      await this.locks.run(rec.id, async () => {
        await this.bootRecord(rec, { freshUpper: true });
        await this.engine.hold(rec.id);
      });
      return { id: rec.id, processes: [], imageKey: resolved.key };
    } catch (err) {
      await this.discard(rec.id);
      throw err;
    }
  }

  /** The booted standby becomes `owner`'s instance as `create(owner, input)` would have made it
   * (takeStandby); undefined, the standby given back or removed, when it cannot stand in: the
   * image is another build now (removed), other limits are asked (given back), it broke. Its
   * owner's quota refusing it is the create's answer. */
  private async takeBootedStandby(s: Standby, owner: string, image: string, input: CreateInstance): Promise<InstanceRecord | undefined> {
    let taken: { rec: InstanceRecord; policyChanged: boolean };
    try {
      const resolved = await this.images.resolve(owner, image);
      if (resolved.key !== s.imageKey) throw new StandbyUnfitError(s.id, 'another build of its image', false);
      taken = await this.takeStandby(s.id, standbyOwnerOf(owner), owner, { ...input, env: { ...resolved.config.env, ...input.env } }, {});
    } catch (err) {
      const unfit = err instanceof StandbyUnfitError;
      if (err instanceof QuotaExceededError || (unfit && err.reusable)) {
        this.warm.giveBack(s);
        if (unfit) return undefined;
        throw err;
      }
      if (!unfit) this.log.warn({ err, instance: s.id }, 'a warm create could not be taken; booting instead');
      await this.discard(s.id);
      return undefined;
    }
    const { rec, policyChanged } = taken;
    try {
      return await this.locks.run(rec.id, async () => {
        if (policyChanged) await this.admit(rec);
        await this.engine.activate(rec.id, input.name !== undefined ? { hostname: rec.name } : {});
        return rec;
      });
    } catch (err) {
      this.log.warn({ err, instance: s.id }, 'a warm create could not be started; booting instead');
      await this.discard(s.id);
      return undefined;
    }
  }

  /** Removes an instance a failed call made (never one a caller has seen running): its sandbox,
   * disk and record. Each step on its own, so that a full disk stops none of the others. */
  async discard(id: string): Promise<void> {
    await this.locks.run(id, async () => {
      await this.engine.destroy(id).catch((err: unknown) => this.log.warn({ err, instance: id }, 'could not remove a failed instance\'s sandbox'));
      await this.releaseNetwork(id);
      try {
        await this.forgetRecord(id);
      } catch (err) {
        this.log.warn({ err, instance: id }, 'could not remove a failed instance\'s record; it stays in error');
      }
    });
    await this.collectLayers().catch(() => {});
  }

  private async bootRecord(rec: InstanceRecord, opts: { freshUpper: boolean }): Promise<InstanceRecord> {
    try {
      const sb = await this.engine.boot(this.spec(rec), opts);
      return await this.lifecycle.move(rec.id, 'boot', { pid: sb.pid, pidStart: sb.startTime, error: null }, this.store, rec);
    } catch (err) {
      this.log.error({ err, instance: rec.id }, 'boot failed');
      await this.failed(rec.id, (err as Error).message);
      throw this.engineFailure(err);
    }
  }

  /** Marks the record as running on the given sandbox, restored (or woken) in its place.
   * `known`: the record as the caller last read or wrote it (Lifecycle.move). */
  running(id: string, sb: SandboxHandle, patch: InstancePatch = {}, how: 'restore' | 'wake' = 'restore', known?: InstanceRecord): Promise<InstanceRecord> {
    return this.lifecycle.move(id, how, { ...patch, pid: sb.pid, pidStart: sb.startTime, error: null }, this.store, known);
  }

  /** Marks the instance failed with its reason; a failure to say so (it moved on meanwhile, or
   * the store is away) is logged, not thrown over the failure itself. */
  async failed(id: string, reason: string): Promise<void> {
    await this.lifecycle.move(id, 'fail', { pid: null, pidStart: null, error: reason }).catch((err: unknown) => this.log.warn({ err, instance: id }, 'could not mark the instance failed'));
  }

  /** Freezes what the instance wrote into a new layer under it, as a disk checkpoint does
   * but with no checkpoint (an image build's step): the sandbox stops, and is not started
   * again. Answers the instance's layers, newest first. */
  async commit(id: string): Promise<string[]> {
    return this.locks.run(id, async () => {
      await this.engine.stop(id);
      const rec = await this.lifecycle.move(id, 'stop', { pid: null, pidStart: null });
      const layerId = newId('lyr');
      await this.store.layers.add(layerId, id);
      try {
        await this.engine.freezeStopped(id, layerId);
      } catch (err) {
        await this.store.layers.remove(layerId);
        throw this.engineFailure(err);
      }
      const layers = [layerId, ...rec.layers];
      await this.store.transaction(async (tx) => {
        await tx.layers.settle(layerId);
        await tx.layers.setRefs(`instance:${id}`, layers);
        await tx.instances.update(id, { layers });
      });
      await this.engine.disk.syncLayer(layerId);
      await this.store.layers.markSynced(layerId);
      return layers;
    });
  }

  /** Stops the sandbox (a hibernated instance forgets its memory); the disk is kept. */
  async stop(owner: string, id: string): Promise<InstanceRecord> {
    await this.get(owner, id);
    const rec = await this.locks.run(id, async () => {
      await this.engine.stop(id);
      await this.dropHibernation(await this.recordOf(id));
      return this.lifecycle.move(id, 'stop', { pid: null, pidStart: null });
    });
    this.events.emit(id, 'instance.stopped');
    return rec;
  }

  /** The instance's sandbox ended on its own (SandboxRuntime.onSandboxEnded): it stops as a stop
   * would stop it, its disk kept, and its `error` says why; a start boots it again. An operation
   * that held the instance when the end was seen (a checkpoint, a rollback, a stop) went first:
   * if it put another PID 1 in place, or the instance is no longer running here, nothing is
   * done. Answers whether the instance was stopped. */
  async sandboxEnded(end: SandboxEnd): Promise<boolean> {
    const stopped = await this.locks.run(end.id, async () => {
      const sb = this.engine.sandbox(end.id);
      if (sb !== end.sandbox || sb.pid !== end.pid || sb.startTime !== end.startTime) return false;
      const rec = await this.store.instances.get(end.id);
      if (!rec || rec.status !== 'running' || !this.isLocal(rec)) return false;
      await this.engine.stop(end.id);
      await this.lifecycle.move(end.id, 'stop', { pid: null, pidStart: null, error: end.reason });
      return true;
    });
    if (stopped) {
      this.log.warn({ instance: end.id, pid: end.pid, reason: end.reason }, 'sandbox ended on its own; instance stopped');
      this.events.emit(end.id, 'instance.stopped', { reason: end.reason });
    }
    return stopped;
  }

  /** Lets go of the instance for another node to take (a drain, once a durable checkpoint of
   * the moment is taken): its sandbox stops, its disk and address here go, it is `lost`. */
  async release(owner: string, id: string): Promise<InstanceRecord> {
    await this.get(owner, id);
    const rec = await this.locks.run(id, async () => {
      await this.engine.destroy(id);
      await this.releaseNetwork(id);
      return this.lifecycle.move(id, 'release', { pid: null, pidStart: null });
    });
    this.events.emit(id, 'instance.stopped', { reason: 'handed over to another node' });
    return rec;
  }

  /** Boots a stopped instance on its disk; a hibernated one wakes instead. */
  async start(owner: string, id: string): Promise<InstanceRecord> {
    if ((await this.get(owner, id)).status === 'hibernated') return this.wake(owner, id);
    const started = await this.locks.run(id, async () => {
      let rec = await this.recordOf(id);
      if (rec.status === 'running') return rec;
      // A fresh boot maps no file of the old agent: it gets the newest one.
      if (rec.agentLayer !== this.engine.currentAgentLayer) rec = await this.store.instances.update(id, { agentLayer: this.engine.currentAgentLayer });
      return this.bootRecord(rec, { freshUpper: false });
    });
    this.events.emit(id, 'instance.started');
    return started;
  }

  /** Removes the instance, its disk and its checkpoints. Forks keep running: each holds its
   * own references to the layers it stands on, which go when the last holder goes. */
  async delete(owner: string, id: string, onCheckpoints: (instanceId: string) => Promise<void>): Promise<void> {
    await this.get(owner, id);
    this.deleting.add(id);
    const deleted = await this.locks.run(id, async () => {
      // A delete that waited here behind another of the same instance finds it gone: done.
      if (!(await this.store.instances.get(id))) return false;
      // Checkpoints first: that may have to wait for forks reading from them, or refuse.
      await onCheckpoints(id);
      await this.engine.destroy(id);
      await this.releaseNetwork(id);
      const rec = await this.store.instances.get(id);
      if (rec) await this.dropHibernation(rec);
      await this.forgetRecord(id);
      this.lastRead.delete(id);
      return true;
    }).finally(() => this.deleting.delete(id));
    if (!deleted) return;
    this.events.emit(id, 'instance.deleted');
    await this.collectLayers();
  }

  /** The instance's record, its executions' and its hold on its layers go, together. */
  private async forgetRecord(id: string): Promise<void> {
    await this.store.transaction(async (tx) => {
      await tx.layers.dropHolder(`instance:${id}`);
      await tx.executions.removeAllOf(id);
      await tx.instances.delete(id);
    });
  }

  private async releaseNetwork(id: string): Promise<void> {
    const address = (await this.store.instances.get(id))?.address;
    if (!address) return;
    await this.engine.network.release(id, address).catch((err: unknown) => this.log.warn({ err, instance: id }, 'could not remove an instance\'s firewall rules'));
  }

  /** Deletes layers nothing stands on any more (the node's one collector: core/layers.ts). */
  collectLayers(): Promise<void> {
    return this.images.collectLayers();
  }

  /** The live sandbox of the instance, if it runs (SandboxAccess is how services reach it). */
  live(id: string): SandboxHandle | undefined {
    return this.engine.sandbox(id);
  }

  /** The environment of commands in the instance: the base, its own, and the call's. */
  /** A process's variables: the defaults, the user's login variables (`login`), the
   * instance's, then the call's own. */
  envOf(rec: InstanceRecord, extra?: Record<string, string>, login?: Record<string, string>): string[] {
    const env = { ...BASE_ENV, HOSTNAME: rec.name, ...login, ...rec.env, ...extra };
    return Object.entries(env).map(([k, v]) => `${k}=${v}`);
  }

  /** Sets when the instance ends by itself, and how: deleted, hibernated with its memory or
   * stopped with its files (then it lives on until woken or started). `null` clears the time
   * and keeps the how, for a later lifetime to be set with again (an E2B sandbox paused by its
   * timeout pauses again at the next one once resumed). */
  async setExpiry(owner: string, id: string, at: Date | null, onExpiry: ExpiryAction = 'delete'): Promise<InstanceRecord> {
    await this.get(owner, id);
    return this.store.instances.update(id, at ? { expiresAt: at.toISOString(), onExpiry } : { expiresAt: null });
  }

  /** Sets (or, with null, clears) the seconds without activity after which the instance
   * hibernates by itself. */
  async setIdleTimeout(owner: string, id: string, seconds: number | null): Promise<InstanceRecord> {
    await this.get(owner, id);
    return this.store.instances.update(id, { idleTimeoutS: seconds && seconds > 0 ? seconds : null });
  }

  /**
   * Hibernates a running instance: its memory and processes go to an image, its changes are
   * frozen into a layer (as for a checkpoint), and its processes end, their memory freed. Its
   * wake brings all of it back. `ifIdle`, checked under the instance's lock, lets the idle
   * monitor give up if the instance was used meanwhile.
   */
  async hibernate(owner: string, id: string, opts: { ifIdle?: () => boolean } = {}): Promise<InstanceRecord> {
    await this.get(owner, id);
    return this.locks.run(id, async () => {
      const rec = await this.recordOf(id);
      if (rec.status === 'hibernated') return rec;
      if (rec.status !== 'running') throw new ConflictError(`instance ${id} is ${rec.status}, not running`, { status: rec.status });
      if (opts.ifIdle && !opts.ifIdle()) return rec;
      await requireRoom(this.engine, await this.engine.memoryInUse(id));
      const layerId = newId('lyr');
      const hibernationId = newId('hib');
      await this.store.layers.add(layerId, id);
      // Recorded before the dump: a server stopped during it finds which image it was writing
      // (finishInterruptedHibernation).
      await this.store.instances.update(id, { hibernationId });
      let pauseMs: number;
      try {
        ({ pauseMs } = await this.engine.hibernate(this.spec(rec), layerId, hibernationId));
      } catch (err) {
        await this.store.layers.remove(layerId);
        await this.engine.disk.removeCheckpointImages(hibernationId);
        await this.store.instances.update(id, { hibernationId: null });
        if (!this.engine.sandbox(id)) await this.failed(id, (err as Error).message);
        throw this.engineFailure(err);
      }
      const layers = [layerId, ...rec.layers];
      const next = await this.store.transaction(async (tx) => {
        await tx.layers.settle(layerId);
        await tx.layers.setRefs(`instance:${id}`, layers);
        return this.lifecycle.move(id, 'hibernate', { layers, hibernationId, pid: null, pidStart: null }, tx);
      });
      await this.engine.disk.syncLayer(layerId);
      await this.store.layers.markSynced(layerId);
      this.events.emit(id, 'instance.hibernated', { pause_ms: pauseMs });
      return next;
    });
  }

  /**
   * A hibernation the server stopped in the middle of (the record names the image it was
   * writing). If CRIU dumped it whole, the sandbox went into it: the hibernation is finished as
   * it would have been (the upper frozen into its layer) and the instance is hibernated, its
   * next use waking it, processes and all. Otherwise the image goes and the rest of recovery
   * takes the sandbox back, or says it is gone.
   */
  async finishInterruptedHibernation(rec: InstanceRecord): Promise<void> {
    if (rec.status !== 'running' || !rec.hibernationId || !this.isLocal(rec)) return;
    const layer = (await this.store.layers.pending()).find((p) => p.instanceId === rec.id);
    const leftover = await this.engine.leftoverPid(rec.id);
    const stillThere = leftover && leftover.pid === rec.pid && leftover.startTime === rec.pidStart;
    if (stillThere || !layer || !this.engine.disk.dumpComplete(rec.hibernationId)) {
      await this.engine.disk.removeCheckpointImages(rec.hibernationId);
      await this.store.instances.update(rec.id, { hibernationId: null });
      return;
    }
    await this.engine.stop(rec.id);
    if (!this.engine.disk.recoverFrozenLayer(layer.id, rec.id)) await this.engine.freezeStopped(rec.id, layer.id);
    const layers = [layer.id, ...rec.layers];
    await this.store.transaction(async (tx) => {
      await tx.layers.settle(layer.id);
      await tx.layers.setRefs(`instance:${rec.id}`, layers);
      await this.lifecycle.move(rec.id, 'hibernate', { layers, pid: null, pidStart: null }, tx);
    });
    await this.engine.disk.syncLayer(layer.id);
    await this.store.layers.markSynced(layer.id);
    this.log.warn({ instance: rec.id, hibernation: rec.hibernationId }, 'finished a hibernation a server stop cut short; the next use wakes the instance');
  }

  /** Wakes a hibernated instance exactly as it was: memory, processes, sessions. */
  async wake(owner: string, id: string): Promise<InstanceRecord> {
    await this.get(owner, id);
    return this.locks.run(id, async () => {
      const rec = await this.recordOf(id);
      if (rec.status !== 'hibernated' || !rec.hibernationId) return rec;
      const t = performance.now();
      let sb: SandboxHandle;
      try {
        sb = await this.engine.restore(this.spec(rec), rec.hibernationId, { setHostname: false, connections: 'restore' });
      } catch (err) {
        this.log.error({ err, instance: id }, 'wake failed');
        await this.failed(id, `the wake failed: ${(err as Error).message}`);
        throw this.engineFailure(err);
      }
      await this.engine.disk.removeCheckpointImages(rec.hibernationId);
      const next = await this.running(id, sb, { hibernationId: null }, 'wake');
      this.events.emit(id, 'instance.woken', { ms: Math.round((performance.now() - t) * 100) / 100 });
      return next;
    });
  }

  /** A hibernated instance's memory image goes (stop, delete): its files stay in its layers. */
  async dropHibernation(rec: InstanceRecord): Promise<void> {
    if (!rec.hibernationId) return;
    await this.engine.disk.removeCheckpointImages(rec.hibernationId);
    await this.store.instances.update(rec.id, { hibernationId: null });
  }

  engineFailure(err: unknown): Error {
    return engineFailure(err);
  }
}
