import { existsSync, mkdirSync, renameSync, rmSync } from 'node:fs';
import type { Socket } from 'node:net';
import { mkdir, readFile, rm, stat, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { ensureAgentLayer } from './agent-layer.js';
import { Cgroups, type ResourceLimits } from './cgroups.js';
import { Criu, lastError, tail } from './criu.js';
import { EngineError } from '../seam/errors.js';
import { criuEnv, isAlive, isAliveSync, isLastingSync, launchUnderShim, processStartTime, worker, workerUnderShim, type Launched } from './launcher.js';
import { registerSpawner, Spawner } from './spawner.js';
import { RestorerPool, type Restorer } from './restorers.js';
import { DataLayout } from '../lib/data-layout.js';
import { failpoint, faultArmed } from '../lib/failpoints.js';
import { isMounted, Mounter, mounts } from './overlay.js';
import { connectToAgent, Sandbox } from './sandbox.js';
import { LimitedDisks } from './limited-disks.js';
import { PersistentVolumes } from './persistent-volumes.js';
import { VolumeFileAgents } from './volume-file-agents.js';
import { Images } from './images.js';
import { RegistryPuller } from './registry-pull.js';
import { checkRestoredRange, imagesForRange, RANGE_SIZE } from './userns-image.js';
import { raiseInotifyCeilings } from './kernel-limits.js';
import { inotifyWatchPaths } from './watch-paths.js';
import { Disk } from './disk.js';
import { run, Steps } from './run.js';
import { diskUsage } from './disk-usage.js';
import { DumpStaging, type StagedDump } from './dump-staging.js';
import { spreadAcrossGroups } from './inode-groups.js';
import { favourCgroupMoves } from './cgroup-moves.js';
import { MemoryTracking } from './memory-tracking.js';
import { COPY_LIMITS, MEMORY_COPY_LIMITS, treeSize } from './upper-copy.js';
import { killTree, waitGone } from './process-tree.js';
import { squashLayers } from './squash.js';
import { forgetLazyTransfer, lazyPagesFiles, lazyTransferLeftBehind, pagesBytes, recordLazyTree, startLazyPages, type FollowedTransfer, type LazyPages } from './lazy-pages.js';
import { untilDeadline } from '../lib/deadline.js';
import { AgentError } from './agent/client.js';
import type { Connections, CriuWorker } from './criu-worker.js';
import type { FreezeResult, RuntimeHealth, SandboxEnd, SandboxRuntime, SandboxSpec, SandboxUsage, VolumeMount } from '../seam/runtime.js';
import { EndWatch } from './end-watch.js';
import { EMPTY_BASE } from '../seam/runtime.js';

import { Network, type SandboxNetwork } from './network/index.js';

export interface EngineOptions {
  dataDir: string;
  criuPath: string;
  /** A tmpfs directory for CRIU's kernel-probe cache, shared by every data directory. */
  criuCacheDir: string;
  /** A tmpfs where memory checkpoints' images are written during the freeze (DumpStaging). */
  dumpStagingDir?: string | undefined;
  /** Restores of images with at least this many MiB of pages are lazy (lazy-pages.ts); 0: none. */
  lazyRestoreMb?: number;
  /** Memory checkpoints of sandboxes left running that use at least this many MiB track what is
   * written until the next one, which copies only that (memory-tracking.ts); 0: none. */
  incrementalCheckpointMb?: number;
  agentPath: string;
  /** Set-up's images (FORKPOINT_IMAGE_SEED_DIR), linked into the data directory when first mounted. */
  imageSeedDir?: string;
  logger: Logger;
  /** Benchmarks only (never from configuration): boot sandboxes without the /proc masks and
   * the seccomp filter, to measure what they cost in the same run. */
  unconfinedForBenchmarks?: boolean;
  /** The sandboxes' subnet, and the resolvers their DNS asks (default: the host's). */
  network: { cidr: string; dnsServers?: string[] | undefined; upstreamCa?: string | undefined };
  /** How many uid ranges sandboxes' user namespaces may hold at once (kernel-limits.ts). */
  uidRanges: number;
  /** The node this engine is: its sandboxes' cgroups are under `forkpoint/<node>/`. */
  nodeId: string;
  /** Whether init remounts the host's cgroup hierarchy `favordynmods` (cgroup-moves.ts). */
  favourCgroupMoves?: boolean;
}

export type { FreezeResult, SandboxSpec } from '../seam/runtime.js';

interface PreparedRestore {
  imagesFd: number;
  workFd: number;
  /** The range CRIU maps the restored user namespace to, when it does that itself. */
  usernsRange: { base: number; size: number } | undefined;
}

/** A rollback's warm standby (holdRollback): the instance's checkpoint restored beside it under
 * `${id}~rollback`, held frozen, with the CRIU worker that restored it (it moves the host's
 * route to the standby's link when a rollback takes it). */
interface RollbackStandby {
  imagesId: string;
  /** The spec it was restored as, but for its id and hostname (a rollback restores the
   * checkpoint's own hostname): a rollback takes it only to the same. */
  fits: string;
  pid: number;
  startTime: string;
  restorer: Restorer;
  /** A connection to its agent, made before it froze: the swap's reconnection is then no wait
   * for the thawed agent to accept one (0.45-0.65 ms inside a warm rollback's pause). */
  agent: Socket | undefined;
}

const rollbackStandbyId = (id: string) => `${id}~rollback`;
const fitOf = (spec: SandboxSpec) => JSON.stringify({ ...spec, id: '', hostname: '' });


/** Sandboxes on this host: overlay disks, CRIU, namespaces, cgroups. Holds the live
 * `Sandbox` of each running instance; everything else is the caller's to remember. */
export class Engine implements SandboxRuntime {
  readonly layout: DataLayout;
  readonly criu: Criu;
  readonly cgroups: Cgroups;
  readonly network: Network;
  readonly images: Images;
  readonly puller: RegistryPuller;
  private readonly limitedDisks: LimitedDisks;
  readonly volumes: PersistentVolumes;
  /** Uppers, layers and memory images on this node's disk. */
  readonly disk: Disk;
  private readonly mounter: Mounter;
  private readonly live = new Map<string, Sandbox>();
  /** Live sandboxes whose PID 1 ends unasked (standbys are the warm pool's to judge). */
  private readonly ends = new EndWatch(() => [...this.live.values()].filter((sb) => !this.standing.has(sb.id)));
  private readonly restorers = new RestorerPool(() => this.startRestorer());
  /** Starts the engine's processes without stalling the event loop (spawner.ts). */
  private readonly spawner: Spawner;
  private unregisterSpawner: () => void = () => {};
  private agentLayerId = '';
  private readonly volumeFileAgents: VolumeFileAgents;
  private staging: DumpStaging | undefined;
  /** Incremental memory checkpoints of sandboxes left running (memory-tracking.ts). */
  private readonly tracking: MemoryTracking;

  constructor(private readonly opts: EngineOptions) {
    this.layout = new DataLayout(opts.dataDir);
    this.spawner = new Spawner(opts.agentPath, join(this.layout.root, '.spawner', 'socket'), join(this.layout.root, 'spawner.log'), criuEnv());
    this.images = new Images(this.layout.images, opts.imageSeedDir);
    this.cgroups = new Cgroups(`forkpoint/${opts.nodeId}`);
    this.limitedDisks = new LimitedDisks(this.layout.limitedDisks);
    this.volumeFileAgents = new VolumeFileAgents(opts.agentPath, opts.logger);
    this.volumes = new PersistentVolumes(this.layout.persistentVolumes, this.volumeFileAgents);
    this.disk = new Disk(this.layout, this.limitedDisks, opts.agentPath);
    this.criu = new Criu(opts.criuPath, opts.criuCacheDir);
    this.mounter = new Mounter(opts.agentPath);
    this.puller = new RegistryPuller(this.images, this.layout.layers, join(this.layout.images, '.oci-cache'));
    this.network = new Network({ agentPath: opts.agentPath, cidr: opts.network.cidr, dnsServers: opts.network.dnsServers, upstreamCa: opts.network.upstreamCa, log: opts.logger, spoolDir: this.layout.spill });
    this.tracking = new MemoryTracking({ agentPath: opts.agentPath, spawner: this.spawner, runDir: (id) => this.layout.run(id), log: opts.logger });
  }

  get log(): Logger {
    return this.opts.logger;
  }

  async init(): Promise<void> {
    await this.spawner.start();
    if (!this.spawner.available) this.log.warn({ log: join(this.layout.root, 'spawner.log') }, 'the process spawner did not start: the server spawns its processes itself, each a pause of its event loop');
    this.unregisterSpawner = registerSpawner(this.spawner);
    await rm(this.layout.spill, { recursive: true, force: true });
    await this.puller.sweep();
    await this.images.sweep();
    for (const d of [this.layout.images, this.layout.layers, this.layout.agents, this.layout.trash, this.layout.spill, this.layout.limitedDisks, this.layout.persistentVolumes, join(this.opts.dataDir, 'instances'), join(this.opts.dataDir, 'checkpoints')]) {
      await mkdir(d, { recursive: true });
    }
    // Where directories come and go all day (inode-groups.ts).
    const spread = await spreadAcrossGroups([join(this.opts.dataDir, 'instances'), join(this.opts.dataDir, 'checkpoints'), this.layout.layers, this.layout.spill]);
    if (spread.failed) this.log.warn({ reason: spread.failed }, 'the data directory\'s instances and checkpoints could not be marked top directories (chattr +T): on an ext4 without a journal, creating files slows down as sandboxes come and go');
    if (this.opts.favourCgroupMoves) {
      const moves = await favourCgroupMoves();
      if (moves.state === 'set') this.log.info({ mount: moves.mount }, 'the cgroup hierarchy is mounted favordynmods now: a restore joins its sandbox\'s cgroups without waiting out an RCU grace period (host-wide, until the next boot)');
      if (moves.state === 'unavailable') this.log.warn({ mount: moves.mount, reason: moves.reason }, 'the cgroup hierarchy could not be mounted favordynmods: a restore after a quiet moment waits out an RCU grace period (~8 ms) to join its sandbox\'s cgroups');
    }
    this.images.copyAheadAcrossFilesystems((image, err) => this.log.warn({ image, err }, 'a set-up image could not be copied into the data directory; sandboxes on it cannot boot here'));
    // After a reboot the volumes are not mounted, and the layers in them not reachable.
    await this.limitedDisks.mountAll();
    await this.volumes.init();
    this.agentLayerId = await ensureAgentLayer(this.layout.agents, this.opts.agentPath);
    for (const change of await raiseInotifyCeilings(this.opts.uidRanges)) this.log.info({ change }, 'raised a host-wide inotify ceiling to hold every sandbox\'s bound');
    await this.criu.ensureCache().catch((err: Error) => this.log.warn({ err }, 'no tmpfs cache for criu; every call will re-probe the kernel'));
    const [check, lazy] = await Promise.all([this.criu.check(), (this.opts.lazyRestoreMb ?? 0) > 0 ? this.criu.lazyPagesWork() : false, this.tracking.init()]);
    this.criuCheck = check;
    this.lazyRestores = lazy;
    // A tree in a user namespace gets its userfaultfd through the device (deploy/criu/0008-*).
    this.lazyIntoUserns = lazy && existsSync('/dev/userfaultfd');
    if ((this.opts.lazyRestoreMb ?? 0) > 0 && !lazy) this.log.warn("'criu check --feature uffd-noncoop' fails here: large memory images are restored whole");
    const staged = await DumpStaging.open(this.opts.dumpStagingDir, `forkpoint-dumps-${this.opts.nodeId}`);
    if (staged.unusable) this.log.warn({ reason: staged.unusable }, 'memory checkpoints are written straight to disk: the staging directory cannot be used');
    this.staging = staged.staging;
    if (!this.criuCheck.ok) this.log.error({ criu: this.opts.criuPath, output: this.criuCheck.output }, "'criu check' fails here: checkpoints, rollbacks and forks will fail, and the node is not ready (/readyz 503). In a container, the node needs the privileges deploy/kubernetes/base/daemonset.yaml gives it");
    await this.disk.emptyTrash();
    this.restorers.refill();
  }

  /** Whether restores of large memory images are lazy here (lazy-pages.ts): asked at start. */
  private lazyRestores = false;
  private lazyIntoUserns = false;
  /** What the last restorer to start said of its CRIU (deploy/criu/0008-*), for health(). */
  private criuLazyUserns = false;
  private criuTracksWrites = false;

  /** The lazy-pages daemons of sandboxes whose memory is still coming in, by instance. */
  private readonly lazyTransfers = new Map<string, { done: Promise<void>; kill(): void }>();

  /** Restores made lazily since the engine started. */
  private lazyRestored = 0;

  get lazyRestoreCount(): number {
    return this.lazyRestored;
  }

  /** Memory checkpoints since start that copied only the pages written since the one before. */
  get incrementalDumpCount(): number {
    return this.tracking.incrementalCount;
  }

  /** What `criu check` said at start (until then, nothing is known against it). */
  private criuCheck: { ok: boolean; output: string } = { ok: true, output: '' };

  get currentAgentLayer(): string {
    return this.agentLayerId;
  }

  hasAgentLayer(id: string): boolean {
    return existsSync(join(this.layout.agentLayer(id), '.fp', 'agent'));
  }

  sandbox(id: string): Sandbox | undefined {
    return this.live.get(id);
  }

  onSandboxEnded(listener: (end: SandboxEnd) => void): () => void {
    return this.ends.listen(listener);
  }

  liveIds(): string[] {
    return [...this.live.keys()];
  }

  async freeze(id: string): Promise<void> {
    this.fenced.add(id);
    await this.cgroups.freeze(id);
  }

  async thaw(id: string): Promise<void> {
    this.fenced.delete(id);
    // A checkpoint's copy under way thaws it when it is done; a standby waits to be taken.
    if (!this.copying.has(id) && !this.standing.has(id)) await this.cgroups.thaw(id);
  }

  /** Sandboxes held frozen until a fork or a create takes them (`activate`): warm standbys. */
  private readonly standing = new Set<string>();

  async hold(id: string): Promise<void> {
    if (!this.live.has(id)) throw new EngineError('NOT_RUNNING', `sandbox ${id} is not running`);
    this.standing.add(id);
    await this.cgroups.freeze(id);
  }

  async activate(id: string, opts: { hostname?: string } = {}): Promise<void> {
    const sb = this.live.get(id);
    if (!sb || !this.standing.has(id)) throw new EngineError('NOT_RUNNING', `sandbox ${id} is not held in standby`);
    // A standby whose PID 1 died, or was killed, while held (from the host) is not handed out:
    // the caller removes it and boots or restores instead.
    if (!isLastingSync(sb.pid, sb.startTime)) throw new EngineError('NOT_RUNNING', `the standby ${id}'s PID 1 (host pid ${sb.pid}) is gone`);
    if (opts.hostname !== undefined) {
      // The hostname is the instance's name, known only now; any warm restorer can set it.
      const r = this.restorers.take();
      try {
        await r.ready;
        await r.worker.setHostname(sb.pid, opts.hostname);
      } finally {
        r.worker.end();
        this.restorers.finished();
      }
    }
    this.standing.delete(id);
    if (!this.fenced.has(id)) await this.cgroups.thaw(id);
  }

  /** Sandboxes frozen because their node's lease is in doubt: a checkpoint's own freeze, ending,
   * must not thaw them. */
  private readonly fenced = new Set<string>();
  /** Sandboxes frozen while a checkpoint copies their upper. */
  private readonly copying = new Set<string>();

  /** Where the sandbox's processes' inotify watches are, for CRIU (watch-paths.ts); found while
   * it still runs, before the pause. */
  private async watchedPaths(spec: SandboxSpec): Promise<string[]> {
    const l = this.layout;
    const roots = [this.disk.upperOf(spec.id), ...this.lowers(spec).map((r) => join(l.root, r))];
    return inotifyWatchPaths(await this.cgroups.pids(spec.id), roots, l.root, this.opts.agentPath).catch((err: unknown) => {
      this.log.warn({ err, instance: spec.id }, 'could not place the sandbox\'s inotify watches');
      return [];
    });
  }

  private lowers(spec: Pick<SandboxSpec, 'layers' | 'baseLayer' | 'image' | 'agentLayer'>): string[] {
    const l = this.layout;
    return [
      ...spec.layers.map((id) => l.relative(l.layer(id))),
      ...(mountsImage(spec) ? [l.relative(l.image(spec.image))] : []),
      l.relative(l.agentLayer(spec.agentLayer)),
    ];
  }

  /** The image's tree in the data directory before a disk is mounted on it. */
  private async imageTreeFor(spec: Pick<SandboxSpec, 'layers' | 'baseLayer' | 'image'>): Promise<void> {
    if (mountsImage(spec)) await this.images.materialize(spec.image);
  }

  /** Squashes layers (newest first), and the image under them unless `image` is null, into
   * one new full-root layer (squash.ts). */
  async squash(layers: string[], image: string | null, into: string): Promise<void> {
    const under = image === EMPTY_BASE ? null : image;
    if (under) await this.images.materialize(under);
    await squashLayers({ layout: this.layout, mounter: this.mounter, agentPath: this.opts.agentPath }, layers, under, into);
  }

  private overlay(spec: SandboxSpec, withTarget: boolean): string[] {
    const l = this.layout;
    return Mounter.helperArgs(
      {
        lowers: this.lowers(spec),
        upper: l.relative(this.disk.upperOf(spec.id)),
        work: l.relative(this.disk.workOf(spec.id)),
        target: l.merged(spec.id),
        cwd: l.root,
      },
      withTarget,
    );
  }

  /** Boots the sandbox under a shim; `fp-agent boot` mounts its disk on the way. */
  private async launchBoot(spec: SandboxSpec): Promise<Launched> {
    const l = this.layout;
    const run = l.run(spec.id);
    await Promise.all([rm(join(run, 'pid'), { force: true }), this.imageTreeFor(spec)]);
    const launched = await launchUnderShim({
      agentPath: this.opts.agentPath,
      command: [
        this.opts.agentPath, 'boot', '--root', l.merged(spec.id), '--hostname', spec.hostname, '--pidfile', join(run, 'pid'),
        ...(this.opts.unconfinedForBenchmarks ? ['--unconfined'] : []),
        ...(spec.uidBase !== null ? ['--userns', String(spec.uidBase)] : []),
        ...spec.volumes.flatMap((v) => ['--volume', this.volumeSource(v), v.path, this.volumeReadOnly(v) ? 'ro' : 'rw']),
        ...spec.ownMounts.flatMap((p) => ['--own-mount', p]),
        ...this.overlay(spec, false),
      ],
      pidfile: join(run, 'pid'),
      statusFile: join(run, 'status'),
      logFile: join(run, 'shim.log'),
      cgroupProcs: await this.cgroups.create(spec.id, spec.limits),
      failure: 'BOOT_FAILED',
      spawner: this.spawner,
    });
    if (spec.network) await this.network.connectBooted(launched.pid, await this.network.newLink(spec.id, spec.network));
    return launched;
  }

  /** The host directory a sandbox mounts for a volume (its placeholder for none). */
  private volumeSource(v: VolumeMount): string {
    return v.volumeId === null ? this.volumes.placeholder : this.volumes.dataDir(v.volumeId);
  }

  private volumeReadOnly(v: VolumeMount): boolean {
    return v.readOnly || v.volumeId === null;
  }

  /** Each volume, made by the restorer (criu_run.c 'V') where CRIU binds it from: what its
   * external mounts (named by their path in the sandbox, see dump) are restored from. */
  private async volumesForRestore(r: Restorer, spec: SandboxSpec): Promise<{ key: string; val: string }[]> {
    return Promise.all(spec.volumes.map(async (v, i) => {
      const target = this.criu.volumeSlot(i);
      await r.worker.mountVolume(this.volumeSource(v), target, spec.uidBase, this.volumeReadOnly(v));
      return { key: v.path, val: target };
    }));
  }

  /** A CRIU dump worker: in the sandbox's netns (CRIU then leaves it out of the image, and the
   * restore puts the tree in its worker's), or, for a sandbox in a user namespace, whose netns
   * is its own, outside it (see CriuWorker.dump). */
  private dumper(spec: SandboxSpec, pid: number) {
    const where = spec.uidBase === null ? { netnsOf: pid } : ({ fresh: true } as const);
    return worker(this.opts.agentPath, this.criu.workerCommand(where), join(this.layout.run(spec.id), 'dump-worker.log'));
  }

  /** A CRIU restore worker under a shim of its own, warming up; it belongs to no instance yet. */
  private startRestorer(): Restorer {
    const w = workerUnderShim({
      agentPath: this.opts.agentPath,
      command: [this.opts.agentPath, ...this.criu.workerCommand({ fresh: true })],
      logFile: join(this.layout.root, 'restorers.log'),
      cgroupProcs: [],
      spawner: this.spawner,
    });
    const ready = w.ready();
    ready.then(() => {
      this.criuLazyUserns = w.lazyIntoUserns;
      this.criuTracksWrites = w.tracksWrites;
    }, () => {});
    return { worker: w, ready };
  }

  /** The images to restore `spec` from with `worker`: `images`, or a copy whose user namespace is
   * the spec's range when the worker's CRIU cannot move the maps itself (userns-image.ts). */
  private inRange(spec: SandboxSpec, images: string, worker: CriuWorker): string {
    return imagesForRange(images, spec.uidBase, this.rangeCopyOf(spec.id), worker.rebasesUserns);
  }

  /** Where a restore into another range finds its images (inRange): needed only while CRIU
   * restores, then removed (its hard links would keep a deleted checkpoint's image on disk). */
  private rangeCopyOf(id: string): string {
    return join(this.layout.run(id), 'images-in-range');
  }

  /** What a restore needs that can be had before the old sandbox is gone: CRIU warm and in the
   * sandbox's cgroups, the directories open in its relay, the pidfile named (the relay writes
   * it the moment CRIU answers). `ownImages`: the images are the ones a dump is about to write
   * of this very sandbox (a checkpoint frozen by rename), in its range already. */
  private async prepareRestore(r: Restorer, spec: SandboxSpec, images: string, opts: { routeHeld?: boolean; ownImages?: boolean } = {}): Promise<PreparedRestore> {
    const run = this.layout.run(spec.id);
    const work = join(run, 'criu');
    mkdirSync(work, { recursive: true });
    const [cgroupProcs] = await Promise.all([this.cgroups.create(spec.id, spec.limits), r.ready]);
    // Joining the cgroups early is safe: a move charges no memory already in use (and pids
    // limits bind forks, not moves). It is not cheap: the first attach after a while waits out
    // an RCU grace period (5-15 ms here), which the worker waits out beside the rest of the
    // restore's preparation (criu_run.c, 'C'), the images in the sandbox's range among it.
    const joined = r.worker.joinCgroups(cgroupProcs);
    joined.catch(() => {}); // awaited below, unless the images fail first
    const imagesDir = opts.ownImages ? images : this.inRange(spec, images, r.worker);
    const [imagesFd, workFd] = await Promise.all([
      r.worker.openDir(imagesDir),
      r.worker.openDir(work),
      r.worker.setPidfile(join(run, 'pid')),
      joined,
      // The link exists before CRIU restores sockets bound to the sandbox's address.
      spec.network && this.network.newLink(spec.id, spec.network).then((link) => r.worker.setUpNetwork(link, spec.uidBase !== null, opts.routeHeld)),
    ]);
    return { imagesFd, workFd, usernsRange: spec.uidBase !== null && r.worker.rebasesUserns ? { base: spec.uidBase, size: RANGE_SIZE } : undefined };
  }

  /** Restores with a prepared restorer: mounts the disk in place of the old one, restores,
   * fixes up the new namespaces, lets CRIU go. */
  private async restoreWith(
    r: Restorer,
    spec: SandboxSpec,
    prepared: Promise<PreparedRestore>,
    opts: { connections: Connections; hostname?: string; oldGone?: Promise<void>; keepWorker?: boolean; lazyFrom?: string },
  ): Promise<Launched> {
    const l = this.layout;
    const { hostname, oldGone } = opts;
    const boosted = this.cgroups.boost(spec.id, true);
    const steps = new Steps();
    // Started beside the restore's preparation: its start-up is a CRIU's.
    const lazyStart = opts.lazyFrom !== undefined ? this.lazyPagesFor(r, spec, opts.lazyFrom) : Promise.resolve(undefined);
    lazyStart.catch(() => {});
    try {
      const p = await prepared;
      await Promise.all([boosted, this.imageTreeFor(spec)]);
      steps.mark('prepared');
      const [, dir, target, options] = this.overlay(spec, true);
      // The sandbox this one replaces must be gone before CRIU forks into the same cgroups
      // (their limits would count both); mounting the disk need not wait for it.
      const [, externalMounts] = await Promise.all([r.worker.mountOverlay(dir!, target!, options!, spec.uidBase), this.volumesForRestore(r, spec), oldGone]);
      steps.mark('mounted');
      // CRIU's own log says why a restore failed better than what failed after it (the relay's
      // answer to a notification about a namespace CRIU already gave up on, say).
      const failed = async (why: string, cause?: unknown) => {
        const log = await tail(join(l.run(spec.id), 'criu', 'restore.log'));
        return new EngineError('RESTORE_FAILED', lastError(log) ?? why, log, { cause });
      };
      const lazy = await lazyStart;
      await lazy?.listening;
      const resp = await r.worker
        .restore({ imagesFd: p.imagesFd, workFd: p.workFd, root: l.merged(spec.id), connections: opts.connections, ownNetns: spec.uidBase !== null, usernsRange: p.usernsRange, externalMounts, lazy: lazy !== undefined })
        .catch(async (err: unknown) => {
          throw err instanceof EngineError && err.code === 'CRIU_FAILED' ? await failed(err.message, err) : err;
        });
      steps.mark('criu');
      this.log.debug({ instance: spec.id, userNamespace: spec.uidBase !== null, rangeByCriu: p.usernsRange !== undefined, lazy: lazy !== undefined, steps: steps.ms }, 'criu restore');
      const pid = resp.restore?.pid;
      if (!resp.success || !pid) throw await failed(resp.cr_errmsg ?? 'criu restore failed');
      // Whatever CRIU was asked or carries, a tree that came back in any range but its own is
      // never handed out: it is killed with the launch.
      if (spec.uidBase !== null) checkRestoredRange(pid, spec.uidBase);
      // A tree in a user namespace had its per-user counters bounded by the relay before any of
      // it ran (criu_run.c, "setup-namespaces").
      if (hostname) await r.worker.setHostname(pid, hostname);
      const startTime = await processStartTime(pid);
      if (lazy) {
        this.lazyRestored++;
        this.followLazy(spec.id, pid, startTime, lazy);
      }
      return { pid, startTime };
    } catch (err) {
      // A daemon that would wait for a restore that is not coming (or serve one that failed).
      void lazyStart.then((d) => d?.kill(), () => {});
      throw err instanceof EngineError && (err.code === 'RESTORE_FAILED' || err.code === 'LAYER_LIMIT' || err.code === 'TIMEOUT')
        ? err
        : new EngineError('RESTORE_FAILED', (err as Error).message, undefined, { cause: err });
    } finally {
      if (!opts.keepWorker) r.worker.end();
      rmSync(this.rangeCopyOf(spec.id), { recursive: true, force: true });
      await this.cgroups.boost(spec.id, false);
    }
  }

  /** A lazy-pages daemon for restoring `spec` from `images`, when lazy restores work here, the
   * image's pages reach `lazyRestoreMb`, and (for a tree in a user namespace) the restorer's CRIU
   * can make the tree's userfaultfd there. */
  private async lazyPagesFor(r: Restorer, spec: SandboxSpec, images: string): Promise<LazyPages | undefined> {
    const min = (this.opts.lazyRestoreMb ?? 0) * 1024 * 1024;
    if (!this.lazyRestores || min <= 0 || pagesBytes(images) < min) return undefined;
    if (spec.uidBase !== null) {
      if (!this.lazyIntoUserns) return undefined;
      await r.ready;
      if (!r.worker.lazyIntoUserns) return undefined;
    }
    const workDir = this.criuWorkDir(spec.id);
    const files = lazyPagesFiles(workDir);
    return startLazyPages({ agentPath: this.opts.agentPath, command: [this.opts.agentPath, ...this.criu.lazyPagesCommand(images, workDir, files.ready)], files, logFile: join(this.layout.run(spec.id), 'lazy-pages-shim.log'), spawner: this.spawner });
  }

  /** Where a restore of the instance works (CRIU's work directory, its lazy transfer's files). */
  private criuWorkDir(id: string): string {
    return join(this.layout.run(id), 'criu');
  }

  /** Watches a lazily restored sandbox's daemon (this server's, or one a server before it
   * started): one that ends without every page in takes the tree with it (its missing pages
   * would read as zeros); one that ends with every page in leaves nothing to find. */
  private followLazy(id: string, pid: number, startTime: string, lazy: FollowedTransfer): void {
    const workDir = this.criuWorkDir(id);
    recordLazyTree(workDir, { pid, startTime });
    const done: Promise<void> = lazy.done.then(async (code) => {
      if (code === 0) return forgetLazyTransfer(workDir, lazy.exitFile);
      // A tree stopped or deleted meanwhile ends its daemon's work too.
      if (!isAliveSync(pid, startTime)) return;
      this.log.error({ instance: id, code, log: join(workDir, 'lazy-pages.log') }, 'the lazy-pages daemon ended before all of the sandbox\'s memory was in: the sandbox is killed');
      const sb = this.live.get(id);
      if (sb?.pid === pid && sb.startTime === startTime) {
        sb.lose(new EngineError('MEMORY_LOST', `the memory of ${id} could not all be restored (its lazy-pages daemon ended with code ${code}): its processes were killed rather than read zeros; roll the instance back, or stop and start it`));
      }
      await killTree(pid, startTime).catch(() => {});
    }).finally(() => {
      if (this.lazyTransfers.get(id)?.done === done) this.lazyTransfers.delete(id);
    });
    this.lazyTransfers.set(id, { done, kill: lazy.kill });
  }

  /** A dump reads all of a sandbox's memory: of a lazily restored one, once it is all in (a fault
   * the daemon would serve while CRIU holds the tree stopped waits on it). */
  private async memoryIn(id: string): Promise<void> {
    const t = this.lazyTransfers.get(id);
    if (!t) return;
    await untilDeadline(t.done, LAZY_TRANSFER_DEADLINE_MS, () => {
      throw new EngineError('TIMEOUT', `the sandbox's memory is still being restored after ${LAZY_TRANSFER_DEADLINE_MS / 1000} s`);
    });
  }

  private async attach(spec: SandboxSpec, launched: Launched): Promise<Sandbox> {
    const sb = new Sandbox(spec.id, launched.pid, launched.startTime, this.log);
    await sb.connect();
    this.live.set(spec.id, sb);
    return sb;
  }

  /** Boots a sandbox on the instance's disk (a fresh upper when `fresh`). */
  async boot(spec: SandboxSpec, opts: { freshUpper: boolean }): Promise<Sandbox> {
    await this.disk.ensureVolume(spec);
    this.disk.prepareDisk(spec, opts.freshUpper);
    try {
      const launched = await this.launchBoot(spec);
      injectedLaunchFault();
      const sb = await this.attach(spec, launched);
      if (spec.network) await sb.call((a) => a.writeFile('/etc/resolv.conf', this.network.resolvConf, 0o644)).catch((err: unknown) => this.log.warn({ err, instance: spec.id }, 'could not write the sandbox\'s resolv.conf'));
      return sb;
    } catch (err) {
      await this.abandonLaunch(spec.id);
      throw err;
    }
  }

  /** After a boot or restore failed past its launch (the link, the agent's connection, the
   * hostname): its processes are killed before its disk and groups go, so that none outlives
   * the failure, the instance's deletion or a restart. */
  private async abandonLaunch(id: string): Promise<void> {
    this.live.delete(id);
    this.standing.delete(id);
    const launched = await this.leftoverPid(id);
    if (launched) await killTree(launched.pid, launched.startTime).catch((err: unknown) => this.log.warn({ err, instance: id, pid: launched.pid }, 'could not kill what a failed launch started'));
    await this.teardown(id);
  }

  /** Restores a memory image onto a fresh upper over the spec's layers (an image of an older
   * format boots fresh on those layers instead: see Criu.isCurrentFormat). */
  async restore(spec: SandboxSpec, imagesId: string, opts: { setHostname: boolean; connections: Connections }): Promise<Sandbox> {
    const images = this.layout.checkpoint(imagesId);
    if (!this.criu.isCurrentFormat(images)) {
      this.log.warn({ instance: spec.id, images }, 'memory image of an older format: booting on its files instead');
      return this.boot(spec, { freshUpper: true });
    }
    await this.disk.ensureVolume(spec);
    const steps = new Steps();
    const restorer = this.restorers.take();
    try {
      this.disk.prepareDisk(spec, true);
      steps.mark('disk');
      const prepared = this.prepareRestore(restorer, spec, images);
      const launched = await this.restoreWith(restorer, spec, prepared, { connections: opts.connections, lazyFrom: images, ...(opts.setHostname ? { hostname: spec.hostname } : {}) });
      steps.mark('restore');
      injectedLaunchFault();
      const sb = await this.attach(spec, launched);
      steps.mark('connect');
      this.log.debug({ instance: spec.id, steps: steps.ms }, 'restore');
      return sb;
    } catch (err) {
      restorer.worker.end();
      await this.abandonLaunch(spec.id);
      throw err;
    } finally {
      this.restorers.finished();
    }
  }

  /** Finds a sandbox that outlived the server: alive with the same start time, and standing on
   * the disk the host has mounted for the instance (the same superblock at its root). */
  async adopt(spec: SandboxSpec, pid: number, startTime: string): Promise<Sandbox | undefined> {
    if (!(await isAlive(pid, startTime))) return undefined;
    const [root, disk] = await Promise.all([stat(`/proc/${pid}/root`).catch(() => undefined), stat(this.layout.merged(spec.id)).catch(() => undefined)]);
    if (!root || !disk || root.dev !== disk.dev || !(await isMounted(this.layout.merged(spec.id)))) return undefined;
    // A server stopped in a pause left its CPU group weighed up for it.
    await this.cgroups.boost(spec.id, false);
    const transfer = await lazyTransferLeftBehind(this.criuWorkDir(spec.id), { pid, startTime });
    if (transfer.state === 'ended' && !transfer.ok) {
      // What the server before would have done, had it seen the daemon end.
      this.log.error({ instance: spec.id }, 'the lazy-pages daemon of a sandbox restored by an earlier server ended before all of its memory was in: the sandbox is killed');
      await killTree(pid, startTime).catch(() => {});
      return undefined;
    }
    if (transfer.state === 'ended') forgetLazyTransfer(this.criuWorkDir(spec.id), transfer.exitFile);
    let sb: Sandbox;
    try {
      sb = await this.attach(spec, { pid, startTime });
    } catch {
      return undefined;
    }
    // Its dumps wait for the transfer, as they would have under the server that started it.
    if (transfer.state === 'running') this.followLazy(spec.id, pid, startTime, transfer.follow());
    return sb;
  }

  /** Kills the sandbox's processes and unmounts its disk; the upper stays. */
  async stop(id: string): Promise<void> {
    await this.dropRollback(id);
    const sb = this.live.get(id);
    this.live.delete(id);
    this.standing.delete(id);
    if (sb) {
      await sb.close();
      sb.loseAll(new AgentError(0, 'the sandbox stopped'));
      // SIGKILL first, then thaw (a frozen sandbox's, its node fenced): the kill is taken on
      // the way out of the freezer, before any of its code runs again.
      const gone = killTree(sb.pid, sb.startTime);
      await this.cgroups.thaw(id).catch(() => {});
      await gone;
    }
    await this.teardown(id);
  }

  private async teardown(id: string): Promise<void> {
    this.tracking.forget(id);
    await this.mounter.unmount(this.layout.merged(id));
    await this.cgroups.remove(id);
  }

  /** Stops and removes everything of the instance but the frozen layers. */
  async destroy(id: string): Promise<void> {
    await this.stop(id);
    // Its daemon would end by itself once the tree is gone; it has nothing left to serve.
    this.lazyTransfers.get(id)?.kill();
    this.disk.discard(this.layout.instance(id));
    if (this.limitedDisks.has(id)) {
      this.disk.discard(this.limitedDisks.upper(id));
      this.disk.discard(this.limitedDisks.work(id));
      await this.limitedDisks.releaseIfEmpty(id);
    }
  }

  /** Kills a stray sandbox the store does not know, by pid. */
  async killStray(pid: number, startTime: string): Promise<void> {
    // One left frozen (its server stopped while fenced) takes the kill once thawed.
    const gone = killTree(pid, startTime);
    await this.cgroups.thawHolderOf(pid).catch(() => {});
    await gone;
  }

  /** Overlay mounts under the data directory's instances, for finding leftovers. */
  async mountedInstances(): Promise<string[]> {
    const prefix = join(this.opts.dataDir, 'instances') + '/';
    return (await mounts())
      .filter((m) => m.fsType === 'overlay' && m.mountPoint.startsWith(prefix) && m.mountPoint.endsWith('/merged'))
      .map((m) => m.mountPoint.slice(prefix.length, -'/merged'.length));
  }

  /** What a dump needs before the pause: its image directory (marked with the image format), a
   * CRIU dumper ready with that directory open, the sandbox's inotify watches placed; and
   * whatever else is `alongside`. The dumper is ended if any of it fails. */
  private async readyDumper(spec: SandboxSpec, pid: number, imagesId: string, alongside: Promise<unknown>[] = [], staged?: StagedDump) {
    const images = this.layout.checkpoint(imagesId);
    await mkdir(images, { recursive: true });
    this.criu.markFormat(images);
    const dumper = this.dumper(spec, pid);
    try {
      const [imagesFd, watchedPaths] = await Promise.all([dumper.ready().then(() => dumper.openDir(staged?.dir ?? images)), this.watchedPaths(spec), ...alongside]);
      return { dumper, images, imagesFd, watchedPaths };
    } catch (err) {
      dumper.end();
      throw err;
    }
  }

  /**
   * The checkpoint cycle on a running sandbox: dump (which stops it), freeze the upper into a
   * new layer by rename, mount a fresh upper over it in place of the old overlay, restore. Callers see a
   * pause; their commands go on afterwards. On a failed dump the sandbox runs on untouched.
   * `images` receives the memory image; `spec.layers` are the layers before the freeze.
   */
  async freezeRunning(spec: SandboxSpec, layerId: string, imagesId: string, release?: () => void): Promise<FreezeResult> {
    const sb = this.live.get(spec.id);
    if (!sb) throw new EngineError('NOT_RUNNING', `sandbox ${spec.id} is not running`);
    await this.memoryIn(spec.id);
    let pauseMs = 0;
    let dumpError: unknown;
    const steps = new Steps();
    // Both CRIUs start while the sandbox still runs; the pause pays for their work only.
    // The restorer opens the image directory as it gets ready: it is there first.
    await mkdir(this.layout.checkpoint(imagesId), { recursive: true });
    const restorer = this.restorers.take();
    const next = { ...spec, layers: [layerId, ...spec.layers] };
    const prepared = this.prepareRestore(restorer, next, this.layout.checkpoint(imagesId), { ownImages: true });
    prepared.catch(() => {}); // handled with the dumper's readiness, below
    let ready: Awaited<ReturnType<Engine['readyDumper']>>;
    try {
      // Unmounting flushes the upper's dirty data; flushing it first, while the sandbox still
      // runs, leaves only what is written in the meantime to the background.
      ready = await this.readyDumper(spec, sb.pid, imagesId, [run(this.opts.agentPath, ['syncfs', this.disk.upperOf(spec.id)]), prepared]);
    } catch (err) {
      restorer.worker.end();
      this.restorers.finished();
      throw err instanceof EngineError && err.code === 'CGROUP_FAILED' ? err : new EngineError('DUMP_FAILED', `CRIU did not start: ${(err as Error).message}`);
    }
    const { dumper, images, imagesFd, watchedPaths } = ready;
    steps.mark('warm-up');
    // The dump's parasite runs in the sandbox's tasks, so in its CPU group (restoreWith weighs
    // the restore the same way and puts the weight back).
    await this.cgroups.boost(spec.id, true);
    await sb.pause(async () => {
      const t0 = performance.now();
      steps.mark('close');
      failpoint('checkpoint.paused');
      const dumped = await dumper.dump({ pid: sb.pid, imagesFd, ownNetns: spec.uidBase !== null, watchedPaths, externalMounts: spec.volumes.map((v) => v.path) }).catch((err: Error) => ({ success: false, cr_errmsg: err.message }));
      dumper.end();
      if (!dumped.success) {
        restorer.worker.end();
        const log = await tail(join(images, 'dump.log'));
        const reason = lastError(log) ?? dumped.cr_errmsg ?? 'no reason given';
        if (isAliveSync(sb.pid, sb.startTime)) {
          dumpError = new EngineError('DUMP_FAILED', `criu dump failed: ${reason}`, log);
          return { pid: sb.pid, startTime: sb.startTime, result: undefined };
        }
        // CRIU went down with the sandbox (a deadline, or its own crash): nothing runs on.
        dumpError = new EngineError('DUMP_FAILED', `criu dump failed and the sandbox did not survive it: ${reason}`, log);
        this.live.delete(spec.id);
        await this.teardown(spec.id).catch(() => {});
        return undefined;
      }
      steps.mark('dump');
      await waitGone(sb.pid, sb.startTime);
      steps.mark('gone');
      failpoint('checkpoint.dumped');
      // The old overlay stays mounted, with no one left using it, until the restorer mounts
      // the new one in its place: renaming its upper away is safe meanwhile.
      try {
        this.disk.freezeUpper(spec.id, layerId);
        steps.mark('rename');
        failpoint('checkpoint.renamed');
        // The same moment the dump was of: its connections go on. A large memory comes back
        // lazily, after the pause (lazy-pages.ts).
        const launched = await this.restoreWith(restorer, next, prepared, { connections: 'restore', lazyFrom: this.layout.checkpoint(imagesId) });
        steps.mark('restore');
        failpoint('checkpoint.restored');
        pauseMs = performance.now() - t0;
        return { ...launched, result: undefined };
      } catch (err) {
        restorer.worker.end();
        this.live.delete(spec.id);
        await this.teardown(spec.id).catch(() => {});
        throw err;
      }
    }, release, { dump: true }).finally(() => {
      this.restorers.finished();
      void this.cgroups.boost(spec.id, false);
    });
    steps.mark('reconnect');
    this.log.debug({ instance: spec.id, steps: steps.ms }, 'checkpoint pause');
    if (dumpError) throw dumpError;
    return { layerId, pauseMs: Math.round(pauseMs * 100) / 100 };
  }

  /**
   * A checkpoint that leaves the sandbox where it is: its processes stop in the cgroup freezer
   * while its upper is copied into `layerId` and, for a memory checkpoint (`imagesId`), CRIU
   * dumps them as they stand and leaves them running; then they go on, the same processes on the
   * same upper. No restore, so the pause is the dump's alone, or for files only no CRIU at all
   * and a pause flat in the processes and their memory. Refused with UPPER_NOT_COPIED, before
   * any pause, when the upper is beyond COPY_LIMITS (MEMORY_COPY_LIMITS with memory: the caller
   * freezes it by rename instead), or after one when the copy fails or outlasts its deadline
   * (the sandbox thawed, nothing of the layer kept).
   */
  async copyRunningUpper(spec: SandboxSpec, layerId: string, opts: { imagesId?: string; release?: () => void } = {}): Promise<FreezeResult> {
    const id = spec.id;
    const sb = this.live.get(id);
    if (!sb) throw new EngineError('NOT_RUNNING', `sandbox ${id} is not running`);
    if (this.fenced.has(id)) throw new EngineError('UPPER_NOT_COPIED', `sandbox ${id} is frozen (its node's lease is in doubt)`);
    if (opts.imagesId !== undefined) await this.memoryIn(id);
    const upper = this.disk.upperOf(id);
    const limits = opts.imagesId === undefined ? COPY_LIMITS : MEMORY_COPY_LIMITS;
    const size = await treeSize(upper, AbortSignal.timeout(COPY_LIMITS.deadlineMs), limits.maxEntries).catch((err: unknown) => {
      throw new EngineError('UPPER_NOT_COPIED', `could not measure the upper of ${id}: ${(err as Error).message}`, undefined, { cause: err });
    });
    if (size.bytes > limits.maxBytes || size.entries > limits.maxEntries) {
      throw new EngineError('UPPER_NOT_COPIED', `the upper of ${id} holds ${size.entries} entries, ${size.bytes} bytes: more than a short freeze copies`);
    }
    const dump = opts.imagesId === undefined ? undefined : await this.prepareDump(spec, sb, opts.imagesId);
    const copy = this.disk.prepareUpperCopy(id, layerId);
    const steps = new Steps();
    let pauseMs = 0;
    let failure: EngineError | undefined;
    // No restorer starts up beside the pause (RestorerPool): it would take CPU from it.
    const frozen = (release?: () => void) => this.restorers.quietWhile(async () => {
      const t0 = performance.now();
      this.copying.add(id);
      try {
        await this.cgroups.freeze(id);
        steps.mark('freeze');
        release?.();
        failpoint('checkpoint.frozen');
        // The copy reads the upper, CRIU the processes: each needs the tree stopped, neither
        // waits for the other.
        const [copied, dumped] = await Promise.allSettled([copy.run(COPY_LIMITS.deadlineMs), dump?.run()]);
        steps.mark(dump ? 'copy+dump' : 'copy');
        if (copied.status === 'rejected') {
          copy.cancel();
          if (opts.imagesId !== undefined) await this.disk.removeCheckpointImages(opts.imagesId);
          throw new EngineError('UPPER_NOT_COPIED', `copying the upper of ${id}: ${(copied.reason as Error).message}`, undefined, { cause: copied.reason });
        }
        if (dumped.status === 'rejected') {
          await this.disk.removeLayer(layerId);
          throw dumped.reason;
        }
        failpoint('checkpoint.copied');
      } catch (err) {
        failure = err instanceof EngineError ? err : new EngineError('DUMP_FAILED', (err as Error).message, undefined, { cause: err });
      } finally {
        dump?.end();
        this.copying.delete(id);
        if (!this.fenced.has(id)) await this.thawForSure(id);
        steps.mark('thaw');
        pauseMs = performance.now() - t0;
      }
    });
    try {
      if (dump) {
        // CRIU cannot dump the agent's connections: they are closed first, and new callers wait.
        await sb.pause(async () => {
          await frozen();
          if (!dump.survived()) {
            this.live.delete(id);
            await this.teardown(id).catch(() => {});
            return undefined;
          }
          return { pid: sb.pid, startTime: sb.startTime, result: undefined };
        }, opts.release, { dump: true });
      } else {
        await frozen(opts.release);
      }
      // The sandbox runs again; a memory image written to memory goes to disk now.
      if (dump && !failure && opts.imagesId !== undefined) {
        const imagesId = opts.imagesId;
        await dump.persist().catch(async (err: EngineError) => {
          failure = err;
          await this.disk.removeLayer(layerId).catch(() => {});
          await this.disk.removeCheckpointImages(imagesId).catch(() => {});
        });
      }
    } finally {
      // A pause that failed before its work leaves the prepared copy and CRIU waiting: both go.
      copy.cancel();
      dump?.end();
      await dump?.discard();
      if (dump) void this.cgroups.boost(id, false);
    }
    this.log.debug({ instance: id, steps: steps.ms, ...size, memory: Boolean(dump) }, 'checkpoint pause (upper copied)');
    if (failure) throw failure;
    return { layerId, pauseMs: Math.round(pauseMs * 100) / 100 };
  }

  /** A CRIU dumper of the running sandbox, started and pointed at the memory image's directory
   * before the pause; `run` dumps the tree the engine has frozen and leaves it running (and
   * frozen: CRIU puts the freezer back as it found it). */
  private async prepareDump(spec: SandboxSpec, sb: Sandbox, imagesId: string): Promise<{ run: () => Promise<void>; end: () => void; survived: () => boolean; persist: () => Promise<void>; discard: () => Promise<void> }> {
    // The image is at most what the sandbox's memory group holds now (its page cache included).
    const memoryBytes = await this.cgroups.memoryBytes(spec.id).catch(() => Infinity);
    const minTracked = (this.opts.incrementalCheckpointMb ?? 0) * 2 ** 20;
    const tracking = this.criuTracksWrites && minTracked > 0 && memoryBytes >= minTracked;
    // An incremental dump is staged by what it will likely write, not by the memory it could.
    const expected = tracking ? this.tracking.expectedImageBytes(spec.id, sb, memoryBytes) : memoryBytes;
    const staged = await this.staging?.stage(imagesId, expected, memoryBytes).catch((err: unknown) => {
      this.log.warn({ err, instance: spec.id }, 'could not stage a memory image; writing it to disk');
      return undefined;
    });
    const { dumper, images, imagesFd, watchedPaths } = await this.readyDumper(spec, sb.pid, imagesId, [], staged).catch(async (err: unknown) => {
      await staged?.discard();
      throw new EngineError('DUMP_FAILED', `CRIU did not start: ${(err as Error).message}`, undefined, { cause: err });
    });
    // Only the pages written since this tree's last dump, where that can be told and is worth its
    // per-process work (a small sandbox's whole memory is copied in a few ms).
    const tracked = await this.tracking.prepare(spec.id, sb, images, tracking && dumper.tracksWrites).catch(async (err: unknown) => {
      dumper.end();
      await staged?.discard();
      throw new EngineError('DUMP_FAILED', `could not prepare the memory tracking: ${(err as Error).message}`, undefined, { cause: err });
    });
    // The dump's parasite runs in the sandbox's tasks, so in its CPU group (put back after the
    // pause).
    await this.cgroups.boost(spec.id, true);
    // And each of them, CRIU and its relay wake without waiting for another task's slice to end,
    // from before the freeze (whose wake-ups are the first) until CRIU is done (sched_slice.c).
    // Before the pause, not in it; a help, not a condition: a dump goes on without it.
    await dumper.shortenSlices(this.cgroups.freezerDir(spec.id)).catch((err: unknown) => this.log.debug({ err, instance: spec.id }, 'no short scheduler slices for the pause'));
    let alive = true;
    return {
      survived: () => alive,
      end: () => dumper.end(),
      discard: async () => {
        tracked?.failed();
        await staged?.discard();
      },
      // The staged image to its place on disk, after the thaw (a no-op for one written there),
      // made whole if the dump left pages to its parent's.
      persist: async () => {
        if (staged) {
          failpoint('checkpoint.staged');
          await staged.persist(images).catch((err: unknown) => {
            throw new EngineError('DUMP_FAILED', `the memory image did not reach the disk: ${(err as Error).message}`, undefined, { cause: err });
          });
        }
        const t0 = performance.now();
        const whole = await tracked?.persisted(images);
        if (whole?.fromParentPages) this.log.debug({ instance: spec.id, pagesFromParent: whole.fromParentPages, ms: Math.round(performance.now() - t0) }, 'incremental memory image made whole');
      },
      run: async () => {
        const dumped = await dumper.dump({
          pid: sb.pid, imagesFd, frozenIn: this.cgroups.freezerDir(spec.id), ownNetns: spec.uidBase !== null, watchedPaths,
          externalMounts: spec.volumes.map((v) => v.path), tracking: tracked,
        }).catch((err: Error) => ({ success: false, cr_errmsg: err.message }));
        dumper.end();
        if (dumped.success) return;
        const log = await tail(join(staged?.dir ?? images, 'dump.log'));
        const reason = lastError(log) ?? dumped.cr_errmsg ?? 'no reason given';
        // CRIU went down with the sandbox (a deadline, or its own crash): nothing runs on.
        alive = isAliveSync(sb.pid, sb.startTime);
        throw new EngineError('DUMP_FAILED', `criu dump failed${alive ? '' : ' and the sandbox did not survive it'}: ${reason}`, log);
      },
    };
  }

  /** Thaws a sandbox a checkpoint froze: tried again once, since a sandbox left frozen is a
   * sandbox lost to its users. */
  private async thawForSure(id: string): Promise<void> {
    try {
      await this.cgroups.thaw(id);
    } catch (err) {
      this.log.error({ err, instance: id }, 'could not thaw a sandbox after its checkpoint; trying again');
      await new Promise((r) => setTimeout(r, 50));
      await this.cgroups.thaw(id);
    }
  }

  /**
   * Hibernation: the sandbox's memory and processes go to `images` and its upper is frozen into
   * `layerId`, like a checkpoint, but nothing is restored: its processes are gone and their
   * memory freed, its disk unmounted. `restore(spec with the layer, images)` wakes it.
   */
  async hibernate(spec: SandboxSpec, layerId: string, imagesId: string): Promise<{ pauseMs: number }> {
    const sb = this.live.get(spec.id);
    if (!sb) throw new EngineError('NOT_RUNNING', `sandbox ${spec.id} is not running`);
    await this.memoryIn(spec.id);
    await this.dropRollback(spec.id);
    const { dumper, images, imagesFd, watchedPaths } = await this.readyDumper(spec, sb.pid, imagesId, [run(this.opts.agentPath, ['syncfs', this.disk.upperOf(spec.id)])]).catch((err: unknown) => {
      throw new EngineError('DUMP_FAILED', `CRIU did not start: ${(err as Error).message}`, undefined, { cause: err });
    });
    let dumpError: EngineError | undefined;
    const t0 = performance.now();
    await sb.pause(async () => {
      const dumped = await dumper.dump({ pid: sb.pid, imagesFd, ownNetns: spec.uidBase !== null, watchedPaths, externalMounts: spec.volumes.map((v) => v.path) }).catch((err: Error) => ({ success: false, cr_errmsg: err.message }));
      dumper.end();
      if (!dumped.success) {
        const log = await tail(join(images, 'dump.log'));
        dumpError = new EngineError('DUMP_FAILED', `criu dump failed: ${lastError(log) ?? dumped.cr_errmsg ?? 'no reason given'}`, log);
        if (isAliveSync(sb.pid, sb.startTime)) return { pid: sb.pid, startTime: sb.startTime, result: undefined };
      } else {
        await waitGone(sb.pid, sb.startTime);
        failpoint('hibernate.dumped');
        this.disk.freezeUpper(spec.id, layerId);
        failpoint('hibernate.renamed');
      }
      this.live.delete(spec.id);
      await this.teardown(spec.id);
      return undefined;
    }, undefined, { dump: true });
    if (dumpError) throw dumpError;
    return { pauseMs: Math.round((performance.now() - t0) * 100) / 100 };
  }

  /** Freezes the upper of a stopped (unmounted) instance into a layer. */
  async freezeStopped(id: string, layerId: string): Promise<void> {
    if (await isMounted(this.layout.merged(id))) throw new EngineError('NOT_RUNNING', `instance ${id} is mounted`);
    this.disk.freezeUpper(id, layerId);
  }

  /**
   * Replaces the running (or stopped) sandbox with the given state: a memory image restored,
   * or a fresh boot, on a fresh upper over `spec.layers`. Waiters at the gate carry on with
   * the new sandbox; commands of the old one are lost.
   */
  async replace(spec: SandboxSpec, imagesId: string | undefined): Promise<{ sandbox: Sandbox; warm: boolean }> {
    let images = imagesId === undefined ? undefined : this.layout.checkpoint(imagesId);
    if (images && !this.criu.isCurrentFormat(images)) {
      this.log.warn({ instance: spec.id, images }, 'memory image of an older format: booting on its files instead');
      images = undefined;
    }
    const sb = this.live.get(spec.id);
    if (!sb) {
      await this.dropRollback(spec.id);
      const sandbox = images ? await this.restore(spec, images, { setHostname: false, connections: 'close' }) : await this.boot(spec, { freshUpper: true });
      return { sandbox, warm: false };
    }
    const standby = this.rollbackStandbys.get(spec.id);
    // A standby whose PID 1 died, or was killed, while held is dropped below, and the rollback
    // restores cold.
    if (standby && imagesId !== undefined && images && standby.imagesId === imagesId && standby.fits === fitOf(spec) && isLastingSync(standby.pid, standby.startTime)) {
      return { sandbox: await this.swapIn(sb, spec, standby), warm: true };
    }
    // One made for another rollback (other limits since, another checkpoint), or dead, is of no
    // use now.
    if (standby) await this.dropRollback(spec.id);
    await this.disk.ensureVolume(spec);
    const steps = new Steps();
    let restorer: Restorer | undefined;
    await sb.pause(async () => {
      // A warm CRIU if the pool has one; else it starts while the old sandbox goes.
      restorer = images ? this.restorers.take() : undefined;
      const prepared = restorer && images ? this.prepareRestore(restorer, spec, images) : undefined;
      prepared?.catch(() => {});
      const oldGone = killTree(sb.pid, sb.startTime);
      oldGone.catch(() => {});
      void oldGone.then(() => failpoint('rollback.killed'), () => {});
      try {
        this.disk.prepareDisk(spec, true);
        steps.mark('disk');
        const launched = restorer && prepared ? await this.restoreWith(restorer, spec, prepared, { connections: 'close', oldGone, lazyFrom: images }) : await oldGone.then(() => this.launchBoot(spec));
        steps.mark(images ? 'restore' : 'boot');
        failpoint('rollback.restored');
        if (faultArmed('rollback.launched')) throw new EngineError('RESTORE_FAILED', 'the restored sandbox did not come up (a fault the test injected)');
        this.log.debug({ instance: spec.id, steps: steps.ms }, 'rollback');
        return { ...launched, result: undefined };
      } catch (err) {
        restorer?.worker.end();
        await oldGone.catch(() => {});
        await this.abandonLaunch(spec.id).catch(() => {});
        throw err;
      }
    }, undefined, { rollback: true }).finally(() => {
      if (restorer) this.restorers.finished();
    });
    return { sandbox: sb, warm: false };
  }

  /** Rollbacks' warm standbys, by instance. */
  private readonly rollbackStandbys = new Map<string, RollbackStandby>();
  /** Removals of what rollbacks replaced, under way in the background. */
  private readonly leftBehind = new Set<Promise<void>>();
  private asideSeq = 0;

  /**
   * A warm standby for a rollback to checkpoint `imagesId`: its memory image restored beside the
   * instance's running sandbox, in the same uid range, with the same address on a link of its
   * own that the host routes nothing to, and held frozen; a `replace` to the same checkpoint
   * with the same spec swaps it in (swapIn) instead of restoring. One per instance: a new one
   * replaces the old. Undefined when this engine cannot swap one in: cgroup v2 (the unified
   * hierarchy refuses to rename a group), an instance with a disk limit or volumes, one not
   * running here, one whose standby is being made.
   */
  async holdRollback(spec: SandboxSpec, imagesId: string): Promise<{ memoryBytes: number } | undefined> {
    const images = this.layout.checkpoint(imagesId);
    if (this.cgroups.version !== 1 || spec.diskMb || spec.volumes.length || !this.live.has(spec.id) || !this.criu.isCurrentFormat(images)) return undefined;
    // One at a time per instance: they would share the standby's name.
    if (this.holding.has(spec.id)) return undefined;
    this.holding.add(spec.id);
    await this.dropRollback(spec.id);
    const shadow: SandboxSpec = { ...spec, id: rollbackStandbyId(spec.id) };
    const restorer = this.restorers.take();
    try {
      this.disk.prepareDisk(shadow, true);
      const prepared = this.prepareRestore(restorer, shadow, images, { routeHeld: true });
      const launched = await this.restoreWith(restorer, shadow, prepared, { connections: 'close', keepWorker: true });
      this.standing.add(shadow.id);
      const agent = await connectToAgent(launched.pid, launched.startTime).catch(() => undefined);
      agent?.on('error', () => {});
      await this.cgroups.freeze(shadow.id).catch((err: unknown) => {
        agent?.destroy();
        throw err;
      });
      this.rollbackStandbys.set(spec.id, { imagesId, fits: fitOf(spec), ...launched, restorer, agent });
      // Its instance stopped or hibernated meanwhile (neither waits for a standby being made).
      if (!this.live.has(spec.id)) {
        await this.dropRollback(spec.id);
        return undefined;
      }
      return { memoryBytes: await this.cgroups.memoryBytes(shadow.id).catch(() => 0) };
    } catch (err) {
      restorer.worker.end();
      this.network.dropLink(shadow.id);
      await this.abandonLaunch(shadow.id);
      this.disk.discard(this.layout.instance(shadow.id));
      throw err;
    } finally {
      this.holding.delete(spec.id);
      this.restorers.finished();
    }
  }

  /** Instances whose rollback standby is being made. */
  private readonly holding = new Set<string>();

  /** The instance's rollback standby, if it has one (of that memory image, when given), goes. */
  async dropRollback(id: string, imagesId?: string): Promise<void> {
    const standby = this.rollbackStandbys.get(id);
    if (!standby || (imagesId !== undefined && standby.imagesId !== imagesId)) return;
    this.rollbackStandbys.delete(id);
    standby.restorer.worker.end();
    standby.agent?.destroy();
    const shadow = rollbackStandbyId(id);
    this.network.dropLink(shadow);
    await this.killStray(standby.pid, standby.startTime).catch((err: unknown) => this.log.warn({ err, instance: id }, 'could not kill a rollback standby'));
    this.standing.delete(shadow);
    await this.destroy(shadow);
  }

  /**
   * A warm rollback: the old sandbox is killed, its disk and groups renamed aside (removed in
   * the background), the standby's renamed into their place, the host's route moved to its
   * link, and it is thawed. A few renames and one route inside the pause, no restore.
   */
  private async swapIn(sb: Sandbox, spec: SandboxSpec, standby: RollbackStandby): Promise<Sandbox> {
    this.rollbackStandbys.delete(spec.id);
    const l = this.layout;
    const shadow = rollbackStandbyId(spec.id);
    const steps = new Steps();
    let oldGone: Promise<void> = Promise.resolve();
    let aside: string | undefined;
    try {
      await sb.pause(async () => {
        // The route first: a server killed before the renames restores the instance as a cold
        // rollback would (its link then takes the route); one killed after them adopts the
        // standby, whose link has it already. Before the old tree's kill, too: its network
        // namespace's teardown holds the kernel's rtnl lock, which the route's change waits
        // for (0.94 -> 0.63 ms p50 of the swap, 20 warm rollbacks each way).
        this.network.takeLink(spec.id, shadow);
        if (spec.network) await standby.restorer.worker.moveRoute({ hostIf: this.network.linkOf(spec.id)!, address: spec.network.address, gateway: this.network.gateway });
        // Killed, not waited for: what is left of it dies in groups of its own (renamed aside
        // below), on a link the host no longer routes to; its removal waits for it.
        oldGone = killTree(sb.pid, sb.startTime);
        oldGone.catch(() => {});
        void oldGone.then(() => failpoint('rollback.killed'), () => {});
        failpoint('rollback.routed');
        // Aside under a name that is no instance's: a server killed from here on finds the old
        // disk a stray (mountedInstances) and the standby in place, or, killed before its
        // groups are renamed, a stray too (leftoverPid looks in the standby's groups).
        aside = `${spec.id}~old${++this.asideSeq}`;
        renameSync(l.instance(spec.id), l.instance(aside));
        renameSync(l.instance(shadow), l.instance(spec.id));
        this.cgroups.rename(spec.id, aside);
        this.cgroups.rename(shadow, spec.id);
        failpoint('rollback.swapped');
        steps.mark('swap');
        this.standing.delete(shadow);
        if (!this.fenced.has(spec.id)) await this.cgroups.thaw(spec.id);
        failpoint('rollback.restored');
        return { pid: standby.pid, startTime: standby.startTime, result: undefined, agent: standby.agent };
      }, undefined, { rollback: true });
    } catch (err) {
      standby.agent?.destroy();
      // Whichever it got to: the instance's sandbox (the old one, or the standby in its place)
      // and the standby where it stood go; the instance is the caller's to mark failed.
      await this.abandonLaunch(spec.id).catch(() => {});
      await this.killStray(standby.pid, standby.startTime).catch(() => {});
      await this.destroy(shadow).catch(() => {});
      throw err instanceof EngineError ? err : new EngineError('RESTORE_FAILED', `the warm rollback failed: ${(err as Error).message}`, undefined, { cause: err });
    } finally {
      standby.restorer.worker.end();
      const put = aside;
      // Its removal (unmounts, the disk to the trash, its groups) after the instance's next calls
      // have had the CPUs: done at once, it took them from the first exec after the rollback.
      if (put) this.track(oldGone.then(() => new Promise((r) => setTimeout(r, REPLACED_REMOVAL_DELAY_MS))).then(() => this.destroy(put)));
    }
    this.log.debug({ instance: spec.id, steps: steps.ms }, 'warm rollback');
    return sb;
  }

  /** Work left to finish in the background; the engine's shutdown waits for it. */
  private track(work: Promise<void>): void {
    const p = work.catch((err: unknown) => this.log.warn({ err }, 'could not remove what a rollback replaced')).finally(() => this.leftBehind.delete(p));
    this.leftBehind.add(p);
  }

  async isMounted(id: string): Promise<boolean> {
    return isMounted(this.layout.merged(id));
  }

  /** The PID 1 a boot or restore wrote to run/pid, with its start time, if it runs: what a
   * crash between the launch and the store's record leaves. */
  async leftoverPid(id: string): Promise<{ pid: number; startTime: string } | undefined> {
    const pid = Number(await readFile(join(this.layout.run(id), 'pid'), 'utf8').catch(() => '0'));
    if (!Number.isInteger(pid) || pid <= 0) return undefined;
    const startTime = await processStartTime(pid).catch(() => undefined);
    return startTime && ((await this.cgroups.holds(id, pid)) || (await this.cgroups.holds(rollbackStandbyId(id), pid))) ? { pid, startTime } : undefined;
  }

  async health(): Promise<RuntimeHealth> {
    const criu = await this.criu.version().catch(() => undefined);
    const overlay = await readFile('/proc/filesystems', 'utf8')
      .then((t) => /\toverlay$/m.test(t))
      .catch(() => false);
    return {
      criu: { version: criu?.version ?? null, ok: Boolean(criu?.ok) && this.criuCheck.ok, ...(this.criuCheck.ok ? {} : { error: this.criuCheck.output }) },
      cgroups: this.cgroups.version,
      overlay,
      root: process.getuid?.() === 0,
      agent: existsSync(this.opts.agentPath),
      lazyRestores: !this.lazyRestores ? 'off' : this.lazyIntoUserns && this.criuLazyUserns ? 'on' : 'host-ids',
      incrementalCheckpoints: this.tracking.kernelTracks && this.criuTracksWrites && (this.opts.incrementalCheckpointMb ?? 0) > 0 ? 'on' : 'off',
    };
  }

  /** Bytes free for forkpoint under the data directory. */
  async freeBytes(): Promise<number> {
    const st = await statfs(this.layout.root);
    return st.bavail * st.bsize;
  }

  /** Roughly what a memory dump of the sandbox will take on disk: the memory it uses now. */
  async memoryInUse(id: string): Promise<number> {
    // Of a lazily restored sandbox, what it comes to once its memory is all in.
    await this.memoryIn(id);
    return this.cgroups.memoryBytes(id);
  }

  async usage(id: string): Promise<SandboxUsage> {
    const [cpuUs, memoryBytes, diskBytes] = await Promise.all([this.cgroups.cpuMicros(id), this.cgroups.memoryBytes(id), diskUsage(this.disk.upperOf(id))]);
    return { cpuUs, memoryBytes, diskBytes };
  }

  async diskUsage(path: string): Promise<number> {
    return diskUsage(path);
  }

  async shutdown(): Promise<void> {
    this.ends.stop();
    await Promise.all(this.leftBehind);
    this.network.close();
    await this.volumeFileAgents.endAll();
    this.restorers.close();
    for (const sb of this.live.values()) await sb.close();
    this.live.clear();
    await this.cgroups.removeNodeGroup();
    await this.staging?.close();
    this.unregisterSpawner();
    this.spawner.close();
  }
}

/** Whether the image is a lower of the disk: not when a full-root layer (a squash's) stands in for it. */
/** How long what a warm rollback replaced waits, killed, before it is removed (swapIn). */
const REPLACED_REMOVAL_DELAY_MS = 200;

/** How long a dump waits for a lazily restored sandbox's memory (lazy-pages.ts). */
const LAZY_TRANSFER_DEADLINE_MS = 120_000;

function mountsImage(spec: Pick<SandboxSpec, 'layers' | 'baseLayer' | 'image'>): boolean {
  return !((spec.baseLayer || spec.image === EMPTY_BASE) && spec.layers.length);
}

/** A boot's or a restore's agent not answering past the launch, when a test armed it
 * (lib/failpoints.ts, FAULTS): what a failed launch leaves is the test's to see. */
function injectedLaunchFault(): void {
  if (faultArmed('launch.attach')) throw new EngineError('AGENT_UNREACHABLE', 'the sandbox\'s agent did not answer (a fault the test injected)');
}
