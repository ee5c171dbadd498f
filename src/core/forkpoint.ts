import { untilDeadline } from '../lib/deadline.js';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import { DataLayout } from '../lib/data-layout.js';
import type { SandboxRuntime, SystemImages } from '../seam/runtime.js';
import { openStore, type Store } from '../store/index.js';
import type { InstanceRecord } from '../store/instances.js';
import { SandboxAccess } from './access.js';
import { CheckpointService } from './checkpoints.js';
import { CommandService } from './commands.js';
import { EventBus } from './events.js';
import { ExecutionService } from './executions.js';
import { FileService, instanceFileHosts } from './files.js';
import { ImageCatalog } from './images.js';
import { LayerCollector } from './layers.js';
import { ImagePulls } from './pulls.js';
import { RegistryLogins } from './registry-logins.js';
import { SecretsKey } from './secrets-key.js';
import { ExpiryService } from './expiry.js';
import { DurableCheckpoints } from './durable.js';
import { ObjectStore } from '../store/object-store.js';
import { BundledTemplates } from './bundled-templates.js';
import { BuildService } from './build/builder.js';
import { TemplateService } from './templates.js';
import { parseHostPortRange, PortService } from './ports.js';
import { PreviewLinks } from './previews.js';
import { requireRoom } from './space.js';
import { Metrics } from './metrics.js';
import { HostLocks } from '../lib/host-locks.js';
import { linkPrefixOf } from '../lib/ipv4.js';
import { retryUntil } from '../lib/backoff.js';
import { isStoreAway } from './errors.js';
import { Credentials } from './credentials.js';
import { InstanceService } from './instances.js';
import { VolumeService } from './volumes.js';
import { EgressSecretService } from './egress-secrets.js';
import { SecretStoreService } from './secret-stores.js';
import { ChainSquasher } from './squash.js';
import { InstanceRecovery } from './instance-recovery.js';
import { JobQueue, KeyedLock } from './jobs.js';
import { Cluster, nodeIdOf } from './cluster.js';
import { isStandby, rollbackCheckpointOf, standbyKeyOf, WarmStandbys } from './warm-standbys.js';

export interface HealthReport {
  ok: boolean;
  version: string;
  engine: {
    criu: { path: string; version: string | null; ok: boolean; error?: string };
    overlay: boolean;
    cgroups: 1 | 2;
    root: boolean;
    user_namespaces: 'on' | 'off';
    lazy_restores: 'on' | 'host-ids' | 'off';
    incremental_checkpoints: 'on' | 'off';
  };
}

/** What `/readyz` says: whether this node should be sent work, and why not. */
export interface Readiness {
  ready: boolean;
  checks: {
    engine: boolean;
    database: boolean;
    /** Absent without an object store. */
    object_store?: boolean;
    draining: boolean;
    /** Present while the node's lease is in doubt and its sandboxes are frozen. */
    fenced?: boolean;
  };
}

/** What a drain did: the instances handed over, the ones kept here, and why all were kept. */
export interface DrainReport {
  handedOver: string[];
  kept: string[];
  reason: 'NO_OBJECT_STORE' | 'NO_OTHER_NODE' | null;
}

/** A handover checkpoint's label: this, then the state the instance was in. */
const HANDOVER = 'handover:';

/** How long a handover waits for its checkpoint to be durable. */
const HANDOVER_WAIT_MS = 10 * 60_000;

/** How long a readiness check waits for the database or the object store. */
const READY_TIMEOUT_MS = 2000;

const BUILD_CACHE_DAYS = 7;
/** Where the servers of this host lock their subnets (one live server per subnet). */
const NETWORK_LOCKS = '/run/forkpoint/networks';

/** The core: store, engine and services, wired once. Routes talk to this and nothing below. */
export class Forkpoint {
  readonly store: Store;
  /** The machine's sandboxes, through the engine seam (the composition root made it). */
  readonly engine: SandboxRuntime;
  /** Where this server's files are: its database, tokens, secrets, spill and contexts. */
  readonly layout: DataLayout;
  readonly images: SystemImages;
  /** The images an owner can use: system rootfs directories and built ones. */
  readonly catalog: ImageCatalog;
  /** The one collector of unused layers on this node. */
  readonly layers: LayerCollector;
  /** Owners' credentials for private registries. */
  readonly registryLogins: RegistryLogins;
  readonly volumes: VolumeService;
  readonly secrets: EgressSecretService;
  /** OpenComputer's secret stores: named groups of secrets an instance is made with. */
  readonly secretStores: SecretStoreService;
  readonly instances: InstanceService;
  readonly checkpoints: CheckpointService;
  /** Sandboxes restored or booted ahead for the next forks and creates (warm-standbys.ts). */
  readonly warm: WarmStandbys;
  readonly files: FileService;
  /** Persistent volumes' own files, with no instance (E2B's volume content API). */
  readonly volumeFiles: FileService;
  /** Commands run and waited for, shell sessions, background processes. */
  readonly commands: CommandService;
  /** Commands streamed and attached to: exec sessions, async runs, terminals. */
  readonly executions: ExecutionService;
  readonly events: EventBus;
  readonly metrics: Metrics;
  /** How services reach a sandbox: hibernated instances wake, idle ones hibernate. */
  readonly access: SandboxAccess;
  /** Port forwards, and how the HTTP proxy reaches an instance's port. */
  readonly ports: PortService;
  /** What the clients' tokens and links speak for. */
  readonly credentials: Credentials;
  /** Images built from Dockerfiles and manifests, step by step on sandboxes. */
  readonly builds: BuildService;
  /** Memory checkpoints new instances start from, servers running. */
  readonly templates: TemplateService;
  /** Templates forkpoint ships (E2B's code interpreter), made for an owner on first use. */
  readonly bundled: BundledTemplates;
  /** Checkpoints copied to the object store, when one is configured. */
  readonly durable: DurableCheckpoints;
  /** Instances with a lifetime end when it is over. */
  readonly expiry: ExpiryService;
  /** The nodes sharing the store, and where each instance is. */
  readonly cluster: Cluster;
  private previewLinks: PreviewLinks | undefined;
  /** Stops the engine telling of sandboxes that ended on their own (see start). */
  private stopWatchingEnds: (() => void) | undefined;
  private hostLocks: HostLocks | undefined;
  /** Shutting down: not ready for new work. */
  private draining = false;
  private readonly jobs: JobQueue;
  /** Per-key locks the services share (an owner's records, an instance's transitions): tests
   * hold one to open a race's window. */
  readonly locks = new KeyedLock();

  private constructor(
    readonly config: Config,
    readonly log: Logger,
    readonly version: string,
    store: Store,
    nodeId: string,
    runtime: SandboxRuntime,
  ) {
    this.engine = runtime;
    this.layout = new DataLayout(config.dataDir);
    this.store = store;
    this.images = runtime.images;
    const locks = this.locks;
    this.jobs = new JobQueue(locks, config.checkpointConcurrency);
    this.events = new EventBus();
    const secretsKey = new SecretsKey(config.secretsKeyFile ?? this.layout.secretsKey);
    this.registryLogins = new RegistryLogins(this.store, secretsKey);
    const pulls = new ImagePulls(
      runtime.puller,
      { insecureRegistries: config.insecureRegistries.split(',').filter(Boolean), maxPullBytes: config.maxPullMb * 1024 * 1024, ownerMaxPulledBytes: config.ownerMaxPulledMb * 1024 * 1024, cacheBytes: config.imageCacheMb * 1024 * 1024 },
      (owner, registry) => this.registryLogins.forPull(owner, registry),
      (owner, except) => this.store.images.pulledBytes(owner, except),
    );
    this.layers = new LayerCollector(this.store, runtime.disk, nodeId);
    this.catalog = new ImageCatalog(this.store, this.images, pulls, this.layers, (id) => runtime.disk.hasLayer(id));
    this.volumes = new VolumeService(this.store, this.engine, locks, { maxMb: config.maxVolumeMb, ownerMaxMb: config.ownerMaxVolumeMb }, nodeId, log);
    this.secrets = new EgressSecretService(this.store, secretsKey, log);
    this.secretStores = new SecretStoreService(this.store, secretsKey, log);
    // One pool of standbys for forks and creates; made by the service whose call it stands in for.
    this.warm = new WarmStandbys({ count: config.warmForks, memoryBytes: config.warmForksMemoryMb * 1024 * 1024 }, {
      make: (recipe, owner) =>
        recipe.kind === 'fork' ? this.checkpoints.makeStandby(recipe, owner) : recipe.kind === 'rollback' ? this.checkpoints.makeRollbackStandby(recipe) : this.instances.makeStandby(recipe.image, owner),
      // A rollback's standby has no record: its instance's is the instance's own.
      // (and one of another checkpoint's may have taken its place in the engine since).
      discard: (s) => (s.kind === 'rollback' ? this.engine.dropRollback(s.id, rollbackCheckpointOf(s.key)) : this.instances.discard(s.id)),
      memoryOf: (id) => this.engine.memoryInUse(id),
    }, log);
    this.catalog.whenDeleted((name) => this.warm.drop(standbyKeyOf({ kind: 'create', image: name })));
    this.instances = new InstanceService(this.store, this.engine, this.catalog, locks, config, this.events, log, nodeId, this.volumes, this.secrets, this.warm);
    this.cluster = new Cluster(this.store, nodeId, { heartbeatMs: config.nodeHeartbeatS * 1000, deadAfterMs: config.nodeDeadAfterS * 1000 }, log, (id) => this.engine.sandbox(id) !== undefined);
    this.access = new SandboxAccess(this.instances, this.store, log, () => this.cluster.fenced);
    this.commands = new CommandService(this.instances, this.access, this.layout.spill, this.events, log);
    this.executions = new ExecutionService(this.store, this.instances, this.access, this.layout.spill, this.events, log);
    this.files = new FileService(instanceFileHosts(this.access), log, this.access);
    this.volumeFiles = new FileService(this.volumes.fileHosts, log);
    this.credentials = new Credentials(this.store, () => this.previews, new Set(config.operators.split(',').map((o) => o.trim()).filter(Boolean)), config.tokenGraceS * 1000);
    this.ports = new PortService(this.store, this.instances, this.access, config.host, parseHostPortRange(config.hostPortRange), log);
    const squasher = new ChainSquasher(this.store, this.engine, this.instances, locks, {
      after: config.squashAfterLayers,
      keep: Math.min(config.squashKeepLayers, config.squashAfterLayers - 1),
    }, log);
    this.checkpoints = new CheckpointService(this.store, this.engine, this.instances, locks, this.jobs, config.maxCheckpointsPerInstance, squasher, this.events, this.executions, log, this.warm);
    this.templates = new TemplateService(this.store, this.instances, this.checkpoints, this.commands, this.executions, this.catalog, log);
    this.durable = new DurableCheckpoints(this.store, this.engine, objectStoreOf(config), join(this.layout.spill, 'blobs'), log);
    this.metrics = new Metrics({
      instancesByStatus: async () => {
        const by: Record<string, number> = {};
        for (const r of await this.instances.local()) if (!isStandby(r)) by[r.status] = (by[r.status] ?? 0) + 1;
        return by;
      },
      jobQueueDepth: () => this.jobs.depth,
      durableBacklog: async () => (this.durable.enabled ? (await this.store.durable.pending()).length : 0),
      diskFreeBytes: () => this.engine.freeBytes(),
      standbys: () => {
        const held = this.warm.held();
        const byKind = { fork: 0, create: 0, rollback: 0 };
        for (const s of held) byKind[s.kind]++;
        return { byKind, memoryBytes: held.reduce((n, s) => n + s.memoryBytes, 0) };
      },
    });
    this.metrics.watch(this.events);
    this.checkpoints.observe({
      ready: (id) => this.durable.schedule(id),
      removed: (id) => void this.durable.forget(id).catch((err: unknown) => log.warn({ err, checkpoint: id }, 'could not forget a durable checkpoint')),
      // What a checkpoint stands on, here: its layers and memory (the object store's), and the
      // tree of the image its owner pulled on another node (the registry's, by digest).
      needed: async (c) => {
        await this.durable.ensureLocal(c);
        if (!c.baseLayer) await this.catalog.ensurePulledTree(c.owner, c.image);
      },
      durable: async (id) => (await this.durable.state(id)).durable,
    });
    this.expiry = new ExpiryService(this.store, (rec) => this.expire(rec), log);
    this.builds = new BuildService(this.store, this.catalog, this.instances, this.executions, this.files, (o, n) => this.templates.filesOf(o, n), this.layout.contexts, {
      maxSent: 2 * 1024 ** 3,
      maxUnpacked: config.buildContextMaxMb * 1048576,
      maxEntries: config.buildContextMaxEntries,
      room: (bytes) => requireRoom(this.engine, bytes),
    }, log);
    this.bundled = new BundledTemplates(this.builds, this.templates, this.catalog, log);
  }

  /** Opens the store and wires the services over the runtime `makeRuntime` makes (the local
   * engine: src/local.ts; a fake one in the unit tests). */
  static async open(config: Config, log: Logger, version: string, makeRuntime: (nodeId: string) => SandboxRuntime): Promise<Forkpoint> {
    await mkdir(config.dataDir, { recursive: true, mode: 0o700 });
    const nodeId = await nodeIdOf(config.nodeId, new DataLayout(config.dataDir).nodeIdFile);
    const store = await openConfiguredStore(config, log);
    try {
      return new Forkpoint(config, log, version, store, nodeId, makeRuntime(nodeId));
    } catch (err) {
      await store.close();
      throw err;
    }
  }

  /** Starts the engine side: agent layer, images, and recovery of what a previous run left. */
  async start(): Promise<void> {
    // Before anything is touched: one live server per data directory and per subnet (a second
    // one would adopt the first's sandboxes, or replace its firewall and gateway), and per link
    // prefix (two subnets may hash to one: the second would replace the first's firewall table).
    this.hostLocks = await HostLocks.take([
      { path: join(this.config.dataDir, 'server.lock'), what: `the data directory ${this.config.dataDir}` },
      ...(this.config.networking === 'on'
        ? [
            { path: join(NETWORK_LOCKS, `${this.config.networkCidr.replace('/', '_')}.lock`), what: `the sandboxes' subnet ${this.config.networkCidr}` },
            { path: join(NETWORK_LOCKS, `${linkPrefixOf(this.config.networkCidr)}.lock`), what: `the host links' prefix ${linkPrefixOf(this.config.networkCidr)} (a hash of the subnet ${this.config.networkCidr}: choose another subnet)` },
          ]
        : []),
    ]).catch(async (err: unknown) => {
      await this.store.close();
      throw err;
    });
    try {
      await this.startParts();
    } catch (err) {
      // A start that fails half-way leaves nothing of itself on the host (the network of a
      // server with no instance, the engine's workers).
      await this.close().catch((e: unknown) => this.log.warn({ err: e }, 'clean-up after a failed start failed'));
      throw err;
    }
  }

  private async startParts(): Promise<void> {
    // A sandbox's root must never be a host account: refuse a pool that holds one.
    const clashes = await this.instances.uidRanges.overlapsWithHost();
    if (clashes.length) throw new Error(`the uid range pool (FORKPOINT_UID_RANGE_START, FORKPOINT_UID_RANGES) holds host ids: ${clashes.slice(0, 5).join('; ')}`);
    await this.engine.init();
    await this.store.instances.adoptUnplaced(this.cluster.nodeId);
    const recovery = new InstanceRecovery(this.instances, this.store, this.engine, this.config.networking === 'on', this.log);
    await recovery.initNetwork();
    // Contexts of builds a stop cut short.
    await rm(this.layout.contexts, { recursive: true, force: true });
    await this.checkpoints.recover();
    await recovery.recover();
    // Standbys a previous run held: the next forks and creates make them again.
    for (const rec of await this.instances.local()) if (isStandby(rec)) await this.instances.discard(rec.id);
    await this.builds.recover();
    // Build steps nobody built again for a week: their layers are kept for nothing.
    await this.builds.prune(new Date(Date.now() - BUILD_CACHE_DAYS * 86400_000));
    await this.templates.recover();
    // Layers pulls held when a server was killed in them, then what nothing holds.
    await this.layers.releaseAbandonedPulls();
    await this.layers.collect();
    // Pulled trees whose last user went while this node was down (or on another node).
    const collected = await this.catalog.collectPulled();
    if (collected.length) this.log.info({ trees: collected }, 'removed pulled images nothing stands on any more');
    await this.durable.recover(this.config.startupWaitS);
    this.previewLinks = await PreviewLinks.open(this.layout.previewSecretFile, (proposed) => this.store.nodes.sharedSecret('preview', proposed));
    await this.ports.restore();
    this.access.startIdleMonitor();
    this.expiry.start();
    this.stopWatchingEnds = this.engine.onSandboxEnded((end) => {
      void this.instances.sandboxEnded(end).catch((err: unknown) => this.log.error({ err, instance: end.id }, 'could not stop an instance whose sandbox ended'));
    });
  }

  /** Ends an instance whose lifetime is over, as it asked: hibernated or stopped (a running
   * one; it lives on, with no lifetime, until woken or started) or deleted. */
  private async expire(rec: InstanceRecord): Promise<void> {
    if (!this.instances.isLocal(rec)) return; // its own node ends it
    if (rec.onExpiry === 'hibernate' && (rec.status === 'running' || rec.status === 'hibernated')) {
      if (rec.status === 'running') await this.instances.hibernate(rec.owner, rec.id);
      await this.instances.setExpiry(rec.owner, rec.id, null);
      return;
    }
    // Its files kept, its processes not: the next start boots it on its files.
    if (rec.onExpiry === 'stop' && (rec.status === 'running' || rec.status === 'hibernated' || rec.status === 'stopped')) {
      if (rec.status === 'running') await this.instances.stop(rec.owner, rec.id);
      await this.instances.setExpiry(rec.owner, rec.id, null);
      return;
    }
    await this.deleteInstance(rec.owner, rec.id);
  }

  /** Preview links to instances' ports (after start). */
  get previews(): PreviewLinks {
    if (!this.previewLinks) throw new Error('the server has not started');
    return this.previewLinks;
  }

  /** The first token, when there is none: printed once and kept in a 0600 file. */
  async ensureInitialToken(): Promise<string | undefined> {
    if ((await this.store.tokens.countActive()) > 0) return undefined;
    const { token } = await this.store.tokens.create('default', 'initial');
    await writeFile(this.layout.initialTokenFile, token + '\n', { mode: 0o600 });
    return token;
  }

  /** Whether this node should be sent work: its engine's parts are there, the database and the
   * object store (when configured) answer within a moment, and it is not shutting down. */
  async readiness(): Promise<Readiness> {
    const within = <T>(p: Promise<T>): Promise<T> => untilDeadline(p, READY_TIMEOUT_MS, () => {
      throw new Error('timed out');
    });
    const [health, database, objects] = await Promise.all([
      this.health(),
      within(this.store.ping()).then(() => true, () => false),
      within(this.durable.reachable()).catch(() => false),
    ]);
    const checks: Readiness['checks'] = { engine: health.ok, database, draining: this.draining, ...(objects === undefined ? {} : { object_store: objects }), ...(this.cluster.fenced ? { fenced: true } : {}) };
    return { ready: checks.engine && checks.database && checks.object_store !== false && !checks.draining && !checks.fenced, checks };
  }

  async health(): Promise<HealthReport> {
    const { criu, cgroups, overlay, root, agent, lazyRestores, incrementalCheckpoints } = await this.engine.health();
    return {
      ok: criu.ok && overlay && root && agent,
      version: this.version,
      engine: {
        criu: { path: this.config.criuPath, version: criu.version, ok: criu.ok, ...(criu.error ? { error: criu.error } : {}) },
        overlay,
        cgroups,
        root,
        user_namespaces: this.config.userNamespaces,
        lazy_restores: lazyRestores,
        incremental_checkpoints: incrementalCheckpoints,
      },
    };
  }

  /**
   * Drains this node: it takes no new work (not ready; the others place nothing here) and hands
   * every instance over. With an object store and another live node, each running or stopped
   * instance gets a durable checkpoint of the moment (with memory, if it runs), stops here and is
   * released; the other nodes take it over from that checkpoint by themselves, processes and all.
   * Without, instances stay, to be re-adopted at this node's next start.
   */
  async drain(): Promise<DrainReport> {
    this.draining = true;
    await this.cluster.drain();
    // Standbys are made again on the nodes that take over; none is handed over.
    await this.warm.close();
    const local = await this.instances.local();
    const others = (await this.cluster.nodes()).filter((n) => n.live && !n.self && !n.draining);
    if (!this.durable.enabled || others.length === 0) {
      return { handedOver: [], kept: local.map((r) => r.id), reason: this.durable.enabled ? 'NO_OTHER_NODE' : 'NO_OBJECT_STORE' };
    }
    const report: DrainReport = { handedOver: [], kept: [], reason: null };
    for (const rec of local) {
      try {
        await this.handOver(rec);
        report.handedOver.push(rec.id);
      } catch (err) {
        this.log.warn({ err, instance: rec.id }, 'an instance could not be handed over; it stays on this node');
        report.kept.push(rec.id);
      }
    }
    return report;
  }

  private async handOver(rec: InstanceRecord): Promise<void> {
    // The state it is in goes with it, in its checkpoint's label (see takeOver).
    const was = rec.status;
    // Its volumes are this node's disk: no other node could mount them.
    if (rec.volumes.some((v) => v.volumeId !== null)) throw new Error(`instance ${rec.id} mounts volumes of this node`);
    if (rec.status === 'hibernated') rec = await this.instances.wake(rec.owner, rec.id);
    if (rec.status !== 'running' && rec.status !== 'stopped') throw new Error(`instance ${rec.id} is ${rec.status}`);
    const { checkpoint } = await this.checkpoints.create(rec.owner, rec.id, { label: `${HANDOVER}${was}`, memory: rec.status === 'running', retention: { mode: 'delete_oldest' } });
    const done = await this.checkpoints.waitDurable(rec.owner, rec.id, checkpoint.id, AbortSignal.timeout(HANDOVER_WAIT_MS), this.durable);
    if (done.status !== 'ready') throw new Error(`its handover checkpoint is ${done.status}: ${done.error ?? ''}`);
    await this.instances.release(rec.owner, rec.id);
  }

  /** Takes over an instance a draining node handed over, from its handover checkpoint, and
   * puts it in the state it was in there (a stopped one stopped, a hibernated one hibernated). */
  private async takeOver(rec: InstanceRecord): Promise<void> {
    let taken: InstanceRecord;
    try {
      taken = await this.checkpoints.recoverLost(rec.owner, rec.id);
    } catch (err) {
      this.log.debug({ err, instance: rec.id }, 'did not take over a handed-over instance (another node did, or it failed)');
      return;
    }
    this.log.info({ instance: rec.id, from: rec.node }, 'took over an instance a draining node handed over');
    const label = taken.headCheckpointId ? (await this.store.checkpoints.get(taken.headCheckpointId))?.label : undefined;
    const was = label?.startsWith(HANDOVER) ? label.slice(HANDOVER.length) : 'running';
    if (was === 'stopped') await this.instances.stop(rec.owner, rec.id);
    if (was === 'hibernated') await this.instances.hibernate(rec.owner, rec.id);
  }

  /** Stops serving once queued jobs are done; sandboxes keep running and are re-adopted by
   * the next start. */
  /** Joins the nodes sharing the store, reachable at `url` (unless the configuration says
   * where): called once the server listens. */
  async join(url: string): Promise<void> {
    this.cluster.whenOwnLost((recs) => this.instances.reclaimLost(recs));
    // Instances a draining node handed over: each node tries, the store lets one take each.
    this.cluster.whenHandedOver(async (recs) => {
      for (const rec of recs) await this.takeOver(rec);
    });
    this.cluster.holdLeaseWith({
      fence: () => this.instances.freezeAll(),
      settle: async () => {
        // What another node took over: nothing of it is kept here (its records are that node's).
        for (const id of await this.instances.settleLease()) {
          this.executions.forget(id);
          this.commands.forget(id);
        }
      },
    });
    await this.cluster.join(this.config.nodeUrl ?? url);
  }

  async close(): Promise<void> {
    this.draining = true;
    this.metrics.close();
    await this.cluster.leave();
    this.access.stopIdleMonitor();
    this.expiry.stop();
    this.stopWatchingEnds?.();
    await this.durable.idle();
    this.durable.close();
    this.ports.closeAll();
    this.executions.forget();
    await this.jobs.drain();
    await this.checkpoints.idle();
    await this.warm.close();
    await this.engine.shutdown();
    // With no instance left, nothing of this server stays on the host's network.
    if (this.config.networking === 'on' && (await this.instances.local()).length === 0) {
      await this.engine.network.destroy().catch((err: unknown) => this.log.warn({ err }, 'could not remove the sandboxes\' network'));
    }
    await this.store.close();
    this.hostLocks?.release();
    this.hostLocks = undefined;
  }

  /** Deletes an instance with its checkpoints (forks of them live on). */
  async deleteInstance(owner: string, id: string): Promise<void> {
    await this.instances.delete(owner, id, (i) => this.checkpoints.deleteAllOf(i));
    await this.ports.forget(id);
    this.executions.forget(id);
    this.commands.forget(id);
  }

  /** Deletes every instance, after the jobs under way: for tests and benchmarks. */
  async destroyAll(): Promise<void> {
    await this.jobs.drain();
    await this.checkpoints.idle();
    await this.warm.clear();
    for (const rec of await this.instances.local()) await this.deleteInstance(rec.owner, rec.id);
    for (const v of await this.store.volumes.forNode(this.instances.nodeId)) await this.volumes.delete(v.owner, v.name);
    // Nothing of this server's is left on the host's network either.
    if (this.config.networking === 'on') await this.engine.network.destroy();
  }

  /** Stops every sandbox and unmounts every disk: for tests and `serve --stop-on-exit`. */
  async stopAll(): Promise<void> {
    for (const rec of await this.instances.local()) {
      if (this.engine.sandbox(rec.id) || (await this.engine.isMounted(rec.id))) {
        await this.engine.stop(rec.id).catch(() => {});
        await this.instances.lifecycle.move(rec.id, 'stop', { pid: null, pidStart: null });
      }
    }
  }
}

/** The store the configuration names: its PostgreSQL database, or the data directory's SQLite. */
export function openConfiguredStore(config: Config, log?: Logger): Promise<Store> {
  const open = () => openStore(config.databaseUrl ?? new DataLayout(config.dataDir).db, (err) => log?.warn({ err }, 'a pooled database connection broke'));
  if (!config.databaseUrl) return open();
  // A shared database may come up after the nodes (a cluster booting, a failover): wait for it.
  return retryUntil(open, {
    policy: STARTUP_RETRY,
    deadlineMs: config.startupWaitS * 1000,
    retryable: (err) => isStoreAway(err) || isUnreachable(err),
    onRetry: (err, delayMs, failures) => log?.warn({ err, retryInMs: delayMs, failures }, 'the database is not answering yet; waiting for it'),
  });
}

/** A service not there (yet): refused, no such socket, no route, no name, timed out. */
function isUnreachable(err: unknown): boolean {
  for (let e = err, depth = 0; e && depth < 5; e = (e as Error).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && /^(ECONNREFUSED|ENOENT|ECONNRESET|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|EAI_AGAIN|ENOTFOUND)$/.test(code)) return true;
    if (e instanceof AggregateError && e.errors.some(isUnreachable)) return true;
  }
  return false;
}

/** How a starting node waits for its database and object store. */
const STARTUP_RETRY = { firstMs: 250, lastMs: 10_000 };

/** The object store of the configuration, if it names one (all of it or nothing). */
function objectStoreOf(c: Config): ObjectStore | undefined {
  const { s3Endpoint: endpoint, s3Bucket: bucket, s3AccessKeyId: accessKeyId, s3SecretAccessKey: secretAccessKey } = c;
  if (!endpoint && !bucket) return undefined;
  if (!endpoint || !bucket || !accessKeyId || !secretAccessKey) {
    throw new Error('an object store needs FORKPOINT_S3_ENDPOINT, FORKPOINT_S3_BUCKET, FORKPOINT_S3_ACCESS_KEY_ID and FORKPOINT_S3_SECRET_ACCESS_KEY');
  }
  return new ObjectStore({ endpoint, bucket, region: c.s3Region, accessKeyId, secretAccessKey, prefix: c.s3Prefix });
}
