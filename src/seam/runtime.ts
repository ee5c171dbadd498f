import type { Readable } from 'node:stream';
import type { EgressPolicy } from '../lib/egress-policy.js';
import type { SandboxHandle } from './sandbox.js';
import type { AgentPort } from './agent.js';

/** A sandbox's place on the network: its address and MAC (derived from the address). */
export interface SandboxNetwork {
  address: string;
  mac: string;
}

/** One secret as the egress proxy uses it: in requests to `hosts`, `placeholder` in a header
 * becomes `value`. Only the host's memory ever holds the value. */
export interface SecretRule {
  /** Host names (`*.example.com` for its subdomains). */
  hosts: string[];
  placeholder: string;
  value: string;
}

/** What a sandbox's egress proxy needs: its rules, and the CA its certificates for those hosts
 * are signed by (the sandbox trusts it). */
export interface EgressSecrets {
  ca: { certPem: string; keyPem: string };
  rules: SecretRule[];
}

/** What the firewall knows of one sandbox. */
export interface FirewallEntry {
  id: string;
  address: string;
  policy: EgressPolicy;
  /** Secrets its requests to some hosts carry (through the egress proxy); null: none. */
  secrets?: EgressSecrets | null | undefined;
}

export interface NetworkCounters {
  sentBytes: number;
  receivedBytes: number;
}

export interface ResourceLimits {
  memoryMb: number;
  pids: number;
  cpuPercent: number;
}

/** A persistent volume as a sandbox sees it, at `path` (absolute, checked: lib/volume-path.ts). */
export interface VolumeMount {
  /** null: an empty, read-only directory in its place (a fork or template asked for none of its
   * source's volumes; its memory image still has a mount there). */
  volumeId: string | null;
  path: string;
  readOnly: boolean;
}

/** What the engine needs to know of an instance to run it. */
export interface SandboxSpec {
  id: string;
  hostname: string;
  image: string;
  /** Frozen layers under the upper, newest first. */
  layers: string[];
  /** The oldest layer is a squashed full root: the image does not go under it. */
  baseLayer: boolean;
  agentLayer: string;
  limits: ResourceLimits;
  /** A size limit on everything the instance writes; null: none. */
  diskMb: number | null;
  /** Its address on the sandboxes' network; null: only loopback. */
  network: SandboxNetwork | null;
  /** The first host uid (and gid) of its range: its ids 0..65535 are the host's
   * uidBase..uidBase+65535, in a user namespace of its own. null: none (the host's ids). */
  uidBase: number | null;
  /** Persistent volumes it mounts: not part of its disk, so no checkpoint holds or restores
   * their contents; a memory image records only where they were mounted. */
  volumes: VolumeMount[];
  /** Paths of its own disk mounted on themselves at boot (its image's VOLUMEs): each a mount
   * point of its own, as tools that look for a separate filesystem expect; checkpoints keep them
   * like any other mount of the sandbox. */
  ownMounts: string[];
}

export interface FreezeResult {
  layerId: string;
  /** The pause the sandbox saw, dump to first answer, in ms. */
  pauseMs: number;
}

/** What a restore does with the connections the sandbox had when it was dumped: restores them
 * (a rollback or wake of the same instance) or closes them (a fork, a template). */
export type Connections = 'restore' | 'close';

/** What an image says about the instances made from it (Dockerfile ENV, WORKDIR, USER, CMD...). */
export interface ImageConfig {
  env: Record<string, string>;
  workdir: string | null;
  user: string | null;
  cmd: string[] | null;
  entrypoint: string[] | null;
  labels: Record<string, string>;
  exposedPorts: number[];
  /** VOLUME: paths that are each a mount point of their own in its instances (on their own
   * disk); absent in configurations recorded before it. */
  volumes?: string[];
}

export const EMPTY_IMAGE_CONFIG: ImageConfig = { env: {}, workdir: null, user: null, cmd: null, entrypoint: null, labels: {}, exposedPorts: [] };

/** What an image may be called. */
export const IMAGE_NAME = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/** The image under layers that are a whole root themselves (an image pulled layer by layer): an
 * empty tree, on every node, that no image name can clash with (IMAGE_NAME refuses the dot). */
export const EMPTY_BASE = '.empty';

/** The host's system images: rootfs directories set-up made or an operator imported. */
export interface SystemImages {
  /** A system image: set-up's or an operator's (what owners may name). */
  exists(name: string): boolean;
  /** The tree an instance or checkpoint stands on is on this node: a system image's, or one
   * pulled from a registry (by digest; no owner names those directly). */
  present(name: string): boolean;
  /** What the image is: changes when its contents are replaced. */
  identity(name: string): string;
  createdAt(name: string): string;
  config(name: string): ImageConfig | undefined;
  list(): Promise<{ name: string; createdAt: string }[]>;
  /** The images pulled from registries on this node (by digest): their trees (pulled whole,
   * before layers were kept one by one) and the configurations of those pulled layer by layer. */
  pulled(): Promise<string[]>;
  /** Removes what a pulled image nothing stands on any more keeps here (the core decides that). */
  removePulled(name: string): Promise<void>;
  /** Links a set-up image into the data directory if it is not there yet (a sandbox mounts it
   * from there); nothing for any other image. */
  materialize(name: string): Promise<void>;
}

/** An image in a registry, fully qualified (lib/image-reference.ts parsed and checked it). */
export interface RegistryImage {
  registry: string;
  repository: string;
  tag: string | undefined;
  digest: string | undefined;
}

export interface PullRequest {
  image: RegistryImage;
  /** Plain HTTP rather than TLS: a registry on loopback or one the operator listed as insecure. */
  plainHttp: boolean;
  credentials?: { username: string; password: string } | undefined;
  /** The most the image's layers may weigh as fetched (compressed). */
  maxBytes: number;
  /** Told each step as it happens (for a client watching the pull). */
  onProgress?: ((p: PullProgress) => void) | undefined;
  /** Holds the image's layers (by id, oldest first) before the puller looks for them on the disk
   * or places them there: from then on no collection of unused layers takes them. */
  holdLayers: (layerIds: string[]) => Promise<void>;
}

export interface PullProgress {
  stage: 'resolve' | 'fetch' | 'unpack';
  message: string;
}

export interface PulledImage {
  /** The manifest's digest for this host's platform: the image's identity. */
  digest: string;
  /** What its layers stand on: EMPTY_BASE (each registry layer is a layer of forkpoint's). */
  base: string;
  config: ImageConfig;
  /** Its layers as forkpoint's (canonical ids, overlayfs whiteouts), newest first: one per
   * registry layer, named by that layer's digest, so images that share a layer share it here. */
  layerIds: string[];
  layers: number;
  /** What the image weighs as a registry serves it (its layers and configuration). */
  bytes: number;
  /** Bytes of layers and configuration this pull fetched: 0 when everything was here already. */
  fetchedBytes: number;
}

/** Images from OCI registries, verified by digest, unpacked once per digest for every owner who
 * can reach them (each owner's pull asks the registry itself, with its own credentials). */
export interface ImagePuller {
  pull(req: PullRequest, signal: AbortSignal): Promise<PulledImage>;
  /** Bounds the node's blob cache: what the pulled trees in `keep` were made of stays; of the
   * rest, the images used longest ago go until it takes at most `budgetBytes`. */
  trimCache(keep: readonly string[], budgetBytes: number): Promise<{ removedBytes: number }>;
}

/** Owners' persistent volumes on this node's disk: size-limited filesystems, by id. */
export interface VolumeDisks {
  /** Makes and mounts it; `sizeMb` bounds what it holds (ENOSPC inside). */
  create(id: string, sizeMb: number): Promise<void>;
  /** Unmounts and deletes it with everything in it (a sandbox that still mounts it: VOLUME_BUSY). */
  remove(id: string): Promise<void>;
  has(id: string): boolean;
  /** What its files take on its filesystem. */
  usedBytes(id: string): Promise<number>;
  /** Runs file operations on the volume itself, with no sandbox involved: by an agent rooted in
   * it that serves nothing else (the paths are the volume's own, `/` its top). */
  withFiles<T>(id: string, request: (agent: AgentPort) => Promise<T>): Promise<T>;
}

/** What the core asks of the sandboxes' network: addresses, policies, counters. */
export interface NetworkRuntime {
  init(entries: FirewallEntry[]): Promise<void>;
  /** A free address and its MAC, or none: the subnet is full. */
  allocate(used: Set<string>): SandboxNetwork | undefined;
  /** `secrets`: the sandbox's secret rules (undefined: those it has; null: none). */
  setPolicy(id: string, address: string, policy: EgressPolicy, secrets?: EgressSecrets | null): Promise<void>;
  release(id: string, address: string): Promise<void>;
  /** Lets go of whatever this node's network holds for the instance (one another node runs now:
   * its record has that node's address). */
  forget(id: string): Promise<void>;
  counters(id: string): NetworkCounters;
  destroy(): Promise<void>;
}

/** The state of the host's tools, for health reports. */
export interface RuntimeHealth {
  /** `ok`: new enough, and `criu check` passed at start (`error`: what it said when not). */
  criu: { version: string | null; ok: boolean; error?: string };
  cgroups: 1 | 2;
  /** The kernel has OverlayFS. */
  overlay: boolean;
  /** The engine runs as root. */
  root: boolean;
  /** The sandboxes' agent binary is there. */
  agent: boolean;
  /** Whether large memory images are restored lazily: for every sandbox, for those on the host's
   * ids only (no /dev/userfaultfd, or a CRIU without forkpoint's patch), or not at all. */
  lazyRestores: 'on' | 'host-ids' | 'off';
  /** Whether a memory checkpoint of a sandbox left running copies only the pages written since
   * the one before (a kernel that tracks writes by userfaultfd write-protection, and a CRIU with
   * forkpoint's patch). */
  incrementalCheckpoints: 'on' | 'off';
}

/** A live sandbox whose PID 1 ended though nothing asked it to: killed from the host or by the
 * kernel (an out-of-memory kill), its agent failed, or its processes killed by the engine because
 * its memory could not all be restored. */
export interface SandboxEnd {
  id: string;
  /** The handle, and the PID 1 that ended: an operation that replaced either since decides. */
  sandbox: SandboxHandle;
  pid: number;
  startTime: string;
  /** Why, for a person: what the instance's `error` says. */
  reason: string;
}

/**
 * The engine's public surface: everything the core may ask of the machine that runs sandboxes.
 * The local engine (engine.ts) implements it; the core knows nothing else of it — not its
 * files, its pid files or its mounts — so that a node can be local or, later, remote. Layers
 * and checkpoints are named by id; where their bytes live is the runtime's business.
 */
export interface SandboxRuntime {
  readonly network: NetworkRuntime;
  /** The host's system images. */
  readonly images: SystemImages;
  /** Images from OCI registries. */
  readonly puller: ImagePuller;
  /** Owners' persistent volumes. */
  readonly volumes: VolumeDisks;
  /** The agent layer new boots get (a fresh boot maps no file of an older agent). */
  readonly currentAgentLayer: string;
  /** Whether this machine has that agent layer (another node's agent build it may lack). */
  hasAgentLayer(id: string): boolean;

  init(): Promise<void>;
  shutdown(): Promise<void>;
  health(): Promise<RuntimeHealth>;

  /** The instances whose sandboxes are live here. */
  liveIds(): string[];
  /** Stops every process of the sandbox where it stands, until `thaw`: a node that can no
   * longer renew its lease freezes what it runs before another node may take it over. */
  freeze(id: string): Promise<void>;
  thaw(id: string): Promise<void>;
  /** The live sandbox of an instance, if it runs here. */
  sandbox(id: string): SandboxHandle | undefined;
  /** Tells `listener`, once each and within a few seconds, of live sandboxes whose PID 1 ended
   * while no stop, pause or rollback was under way; the returned function stops telling. */
  onSandboxEnded(listener: (end: SandboxEnd) => void): () => void;
  boot(spec: SandboxSpec, opts: { freshUpper: boolean }): Promise<SandboxHandle>;
  /** Restores the memory image of checkpoint (or hibernation) `imagesId` as the instance. */
  restore(spec: SandboxSpec, imagesId: string, opts: { setHostname: boolean; connections: Connections }): Promise<SandboxHandle>;
  /** Holds a sandbox frozen where it stands, a standby for a warm fork, until `activate`; a
   * fenced node's `thaw` leaves it frozen. */
  hold(id: string): Promise<void>;
  /** A held sandbox runs from now on (with `hostname`, when it is to be another). */
  activate(id: string, opts?: { hostname?: string }): Promise<void>;
  /** Takes back a sandbox a previous server left running, if it is still the same process. */
  adopt(spec: SandboxSpec, pid: number, startTime: string): Promise<SandboxHandle | undefined>;
  /** Replaces the instance's sandbox by the given state (a rollback): memory image or fresh boot;
   * `warm` when a standby held for it (holdRollback) was swapped in instead of a restore. */
  replace(spec: SandboxSpec, imagesId: string | undefined): Promise<{ sandbox: SandboxHandle; warm: boolean }>;
  /** A warm standby for the next `replace` of the running instance with this spec and memory
   * image: restored beside it and held frozen, nothing of the running one touched. One per
   * instance (a new one replaces the old); stop, hibernate and destroy remove it. Undefined when
   * this engine cannot hold one for the instance. */
  holdRollback(spec: SandboxSpec, imagesId: string): Promise<{ memoryBytes: number } | undefined>;
  /** The instance's rollback standby, if any (only one of that memory image, when given), goes. */
  dropRollback(id: string, imagesId?: string): Promise<void>;
  stop(id: string): Promise<void>;
  destroy(id: string): Promise<void>;
  /** Instances whose disks are mounted here (what a crash may have left). */
  mountedInstances(): Promise<string[]>;
  isMounted(id: string): Promise<boolean>;
  /** A sandbox's PID 1 a boot or restore recorded, if it still runs (a crash between the two). */
  leftoverPid(id: string): Promise<{ pid: number; startTime: string } | undefined>;
  killStray(pid: number, startTime: string): Promise<void>;

  /** The checkpoint cycle on a running sandbox: memory image `imagesId`, upper frozen into
   * `layerId`, the sandbox running on again. */
  freezeRunning(spec: SandboxSpec, layerId: string, imagesId: string, release?: () => void): Promise<FreezeResult>;
  /** A checkpoint of a running sandbox that leaves it on its upper: the upper copied into
   * `layerId` while its processes are frozen, and with `imagesId` their memory dumped there, the
   * processes left running. UPPER_NOT_COPIED: not done (too large for a short freeze, or the copy
   * failed); the sandbox runs on as it was. */
  copyRunningUpper(spec: SandboxSpec, layerId: string, opts?: { imagesId?: string; release?: () => void }): Promise<FreezeResult>;
  freezeStopped(id: string, layerId: string): Promise<void>;
  hibernate(spec: SandboxSpec, layerId: string, imagesId: string): Promise<{ pauseMs: number }>;
  squash(layers: string[], image: string | null, into: string): Promise<void>;
  /** Layers and memory images on this node's disk. */
  readonly disk: NodeDisk;

  freeBytes(): Promise<number>;
  /** The memory the sandbox uses (once a restore still bringing it in is done). */
  memoryInUse(id: string): Promise<number>;
  /** What the sandbox uses now, from its cgroups and its upper layer. */
  usage(id: string): Promise<SandboxUsage>;
}

export interface SandboxUsage {
  /** CPU time its processes used since it started here, in microseconds. */
  cpuUs: number;
  memoryBytes: number;
  /** Bytes it wrote on top of its image and checkpoints (its upper layer). */
  diskBytes: number;
}

/** Frozen layers and memory images on this node's disk, and their copies in and out. */
export interface NodeDisk {
  recoverFrozenLayer(layerId: string, instanceId: string): boolean;
  syncLayer(layerId: string): Promise<void>;
  removeLayer(layerId: string): Promise<void>;
  layerBytes(layerId: string): Promise<number>;
  removeCheckpointImages(imagesId: string): Promise<void>;
  checkpointImageBytes(imagesId: string): Promise<number>;
  hasCheckpointImages(imagesId: string): boolean;
  /** Whether a dump into the images ran to its end (a server that stopped during a checkpoint
   * may find the dump done and the rest not). */
  dumpComplete(imagesId: string): boolean;

  /** A layer as a tar (name-sorted, so the same layer packs to the same bytes). The stream fails
   * (asynchronously) when the layer is gone or cannot be read: pipe it in the tick it is made (the
   * real disk keeps such a failure for a late reader, an implementation need not). */
  exportLayer(layerId: string): Readable;
  /** A checkpoint's memory image as a tar. */
  exportCheckpointImages(imagesId: string): Readable;
  hasLayer(layerId: string): boolean;
  /** The layers and checkpoint memory images on this node's disk, by id. */
  localLayers(): Promise<string[]>;
  localCheckpointImages(): Promise<string[]>;
  /** Unpacks a tar made by `exportLayer` as the layer (a node that lacked it). The stream is
   * read to its end; if it fails (a download, a hash that does not match), so does the import,
   * and nothing of it is kept. */
  importLayer(layerId: string, tar: Readable): Promise<void>;
  /** Unpacks a tar made by `exportCheckpointImages` as the checkpoint's memory image. */
  importCheckpointImages(imagesId: string, tar: Readable): Promise<void>;
}
