import type { Logger } from 'pino';
import { nestedVolumePaths, volumePathProblem } from '../lib/volume-path.js';
import type { SandboxRuntime, VolumeMount } from '../seam/runtime.js';
import type { Store } from '../store/index.js';
import { newId } from '../store/ids.js';
import type { VolumeRecord } from '../store/volumes.js';
import type { InstanceVolume } from '../store/instances.js';
import type { FileHosts } from './file-hosts.js';
import { ConflictError, InsufficientStorageError, InvalidRequestError, NotFoundError, QuotaExceededError } from './errors.js';
import { ownerRecordsLock, type KeyedLock } from './jobs.js';

/** Docker's named volumes' pattern (E2B's names fit it too). */
export const VOLUME_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
/** The smallest volume (an ext4 filesystem's own metadata and journal take a few MiB). */
export const MIN_VOLUME_MB = 64;
/** How many volumes one owner may have, and one instance mount. */
export const VOLUMES_PER_OWNER = 32;
export const VOLUMES_PER_INSTANCE = 16;

export interface VolumeLimits {
  /** The largest volume, in MiB. */
  maxMb: number;
  /** All of an owner's volumes together, in MiB (as declared: a volume's size is reserved). */
  ownerMaxMb: number;
}

/** A volume an instance asks to mount. */
export interface VolumeRequest {
  name: string;
  path: string;
  readOnly?: boolean | undefined;
}

export interface VolumeView extends VolumeRecord {
  /** What its files take now; null when it is on another node. */
  usedBytes: number | null;
  /** The instances that mount it. */
  instances: string[];
}

/**
 * Owners' persistent volumes: made and deleted here, mounted by instances (which name them at
 * creation), never part of a checkpoint. A volume lives on the disk of the node it was made on,
 * and only instances there mount it.
 */
export class VolumeService {
  constructor(
    private readonly store: Store,
    private readonly engine: SandboxRuntime,
    private readonly locks: KeyedLock,
    private readonly limits: VolumeLimits,
    private readonly nodeId: string,
    private readonly log: Logger,
  ) {}

  async create(owner: string, input: { name: string; sizeMb: number }): Promise<VolumeView> {
    const { name, sizeMb } = input;
    if (!VOLUME_NAME.test(name)) throw new InvalidRequestError('a volume name is 1-63 letters, digits, ., _ or -, starting with a letter or digit', { name });
    if (!Number.isInteger(sizeMb) || sizeMb < MIN_VOLUME_MB || sizeMb > this.limits.maxMb) {
      throw new InvalidRequestError(`size_mb must be a whole number from ${MIN_VOLUME_MB} to ${this.limits.maxMb}`, { size_mb: sizeMb });
    }
    // One owner's volumes are made one at a time, so that two cannot both fit the last of its quota.
    return this.locks.run(`volumes:${owner}`, async () => {
      const mine = await this.store.volumes.list(owner);
      if (mine.some((v) => v.name === name)) throw new ConflictError(`volume ${name} exists`, { reason: 'VOLUME_EXISTS', volume: name });
      if (mine.length >= VOLUMES_PER_OWNER) throw new QuotaExceededError(`at most ${VOLUMES_PER_OWNER} volumes per owner`, { reason: 'VOLUMES_PER_OWNER', limit: VOLUMES_PER_OWNER });
      const total = mine.reduce((n, v) => n + v.sizeMb, 0);
      if (total + sizeMb > this.limits.ownerMaxMb) {
        throw new QuotaExceededError(`the owner's volumes would take ${total + sizeMb} MiB, over its ${this.limits.ownerMaxMb} MiB`, { reason: 'VOLUME_MB_PER_OWNER', limit_mb: this.limits.ownerMaxMb, used_mb: total });
      }
      // Sparse, so not taken at once; but a volume the disk could never hold is refused now.
      if ((await this.engine.freeBytes()) < sizeMb * 1024 * 1024) throw new InsufficientStorageError(`the data directory's disk has less than ${sizeMb} MiB free`);
      const rec: VolumeRecord = { id: newId('vol'), owner, name, sizeMb, node: this.nodeId, createdAt: new Date().toISOString() };
      await this.engine.volumes.create(rec.id, sizeMb);
      try {
        await this.store.volumes.insert(rec);
      } catch (err) {
        await this.engine.volumes.remove(rec.id).catch(() => {});
        throw err;
      }
      this.log.info({ volume: rec.id, owner, name, sizeMb }, 'volume created');
      return { ...rec, usedBytes: await this.engine.volumes.usedBytes(rec.id), instances: [] };
    });
  }

  private async record(owner: string, name: string): Promise<VolumeRecord> {
    const v = VOLUME_NAME.test(name) ? await this.store.volumes.byName(owner, name) : undefined;
    if (!v) throw new NotFoundError('volume', name);
    return v;
  }

  /** By its id (E2B's `volumeID`): the owner's, or not found. */
  private async recordById(owner: string, id: string): Promise<VolumeRecord> {
    const v = /^vol_[a-z0-9]{1,32}$/.test(id) ? await this.store.volumes.get(id) : undefined;
    if (!v || v.owner !== owner) throw new NotFoundError('volume', id);
    return v;
  }

  async getById(owner: string, id: string): Promise<VolumeView> {
    return this.view(await this.recordById(owner, id));
  }

  async deleteById(owner: string, id: string): Promise<void> {
    await this.delete(owner, (await this.recordById(owner, id)).name);
  }

  /** A volume's own files (by id), with no instance: served by the engine's file agent rooted in
   * it, on the node that holds it. */
  readonly fileHosts: FileHosts = {
    host: async (owner, id) => {
      const v = await this.recordById(owner, id);
      this.requireHere(v);
      if (!this.engine.volumes.has(v.id)) throw new ConflictError(`volume ${v.name} is missing from this node's disk`, { reason: 'VOLUME_MISSING', volume: v.name });
      return { call: (request) => this.engine.volumes.withFiles(v.id, request) };
    },
  };

  private async view(v: VolumeRecord): Promise<VolumeView> {
    const here = v.node === this.nodeId && this.engine.volumes.has(v.id);
    return { ...v, usedBytes: here ? await this.engine.volumes.usedBytes(v.id) : null, instances: await this.store.instances.usingVolume(v.id) };
  }

  async get(owner: string, name: string): Promise<VolumeView> {
    return this.view(await this.record(owner, name));
  }

  async list(owner: string): Promise<VolumeView[]> {
    return Promise.all((await this.store.volumes.list(owner)).map((v) => this.view(v)));
  }

  /** Deletes a volume and its files; refused while an instance mounts it (delete those first). */
  async delete(owner: string, name: string): Promise<void> {
    const v = await this.record(owner, name);
    // Under the lock new instance records are made under, so that no create records a mount of
    // the volume between the check for its users and its deletion.
    await this.locks.run(`volumes:${owner}`, () => this.locks.run(ownerRecordsLock(owner), async () => {
      const users = await this.store.instances.usingVolume(v.id);
      if (users.length) throw new ConflictError(`volume ${name} is mounted by ${users.join(', ')}; delete those instances first`, { reason: 'VOLUME_IN_USE', volume: name, instances: users });
      this.requireHere(v);
      await this.engine.volumes.remove(v.id);
      await this.store.volumes.delete(v.id);
    }));
    this.log.info({ volume: v.id, owner, name }, 'volume deleted');
  }

  private requireHere(v: VolumeRecord): void {
    if (v.node !== this.nodeId) throw new ConflictError(`volume ${v.name} is on node ${v.node}, not this one (${this.nodeId})`, { reason: 'VOLUME_ON_OTHER_NODE', volume: v.name, node: v.node });
  }

  /** The mounts a new instance asks for, checked: the owner's volumes, on this node, at paths a
   * volume may have, none inside another. */
  async mounts(owner: string, requested: VolumeRequest[] | undefined): Promise<InstanceVolume[]> {
    if (!requested?.length) return [];
    if (requested.length > VOLUMES_PER_INSTANCE) throw new InvalidRequestError(`at most ${VOLUMES_PER_INSTANCE} volumes per instance`);
    for (const r of requested) {
      const problem = volumePathProblem(r.path);
      if (problem) throw new InvalidRequestError(`volume path ${JSON.stringify(r.path)}: ${problem}`, { path: r.path });
    }
    const nested = nestedVolumePaths(requested.map((r) => r.path));
    if (nested) throw new InvalidRequestError(`volume paths ${nested[0]} and ${nested[1]} overlap`, { paths: nested });
    const out: InstanceVolume[] = [];
    for (const r of requested) {
      const v = await this.record(owner, r.name);
      this.requireHere(v);
      if (!this.engine.volumes.has(v.id)) throw new ConflictError(`volume ${v.name} is missing from this node's disk`, { reason: 'VOLUME_MISSING', volume: v.name });
      out.push({ volumeId: v.id, name: v.name, path: r.path, readOnly: r.readOnly ?? false });
    }
    return out;
  }

  /** An instance's volumes are all on this node (a recovery elsewhere cannot take them along). */
  async requireAllHere(mounts: VolumeMount[]): Promise<void> {
    for (const m of mounts) {
      if (m.volumeId === null) continue;
      const v = await this.store.volumes.get(m.volumeId);
      if (!v) throw new ConflictError(`a volume mounted at ${m.path} was deleted`, { reason: 'VOLUME_MISSING', path: m.path });
      this.requireHere(v);
    }
  }
}

/** The same mounts with every volume replaced by an empty, read-only placeholder. */
export const placeholdersFor = (mounts: VolumeMount[]): InstanceVolume[] => mounts.map((m) => ({ volumeId: null, name: null, path: m.path, readOnly: true }));
