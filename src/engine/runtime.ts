import type { Readable } from 'node:stream';
import type { Connections } from './criu-worker.js';
import type { FreezeResult, SandboxSpec } from './engine.js';
import type { EgressPolicy, FirewallEntry, NetworkCounters, SandboxNetwork } from './network/index.js';
import type { Sandbox } from './sandbox.js';

/** What the core asks of the sandboxes' network: addresses, policies, counters. */
export interface NetworkRuntime {
  init(entries: FirewallEntry[]): Promise<void>;
  /** A free address and its MAC, or none: the subnet is full. */
  allocate(used: Set<string>): SandboxNetwork | undefined;
  setPolicy(id: string, address: string, policy: EgressPolicy): Promise<void>;
  release(id: string, address: string): Promise<void>;
  counters(id: string): NetworkCounters;
  destroy(): Promise<void>;
}

/** The state of the host's tools, for health reports. */
export interface RuntimeHealth {
  criu: { version: string | null; ok: boolean };
  cgroups: 1 | 2;
}

/**
 * The engine's public surface: everything the core may ask of the machine that runs sandboxes.
 * The local engine (engine.ts) implements it; the core knows nothing else of it — not its
 * files, its pid files or its mounts — so that a node can be local or, later, remote. Layers
 * and checkpoints are named by id; where their bytes live is the runtime's business.
 */
export interface SandboxRuntime {
  readonly network: NetworkRuntime;
  /** The agent layer new boots get (a fresh boot maps no file of an older agent). */
  readonly currentAgentLayer: string;

  init(): Promise<void>;
  shutdown(): Promise<void>;
  health(): Promise<RuntimeHealth>;

  /** The live sandbox of an instance, if it runs here. */
  sandbox(id: string): Sandbox | undefined;
  boot(spec: SandboxSpec, opts: { freshUpper: boolean }): Promise<Sandbox>;
  /** Restores the memory image of checkpoint (or hibernation) `imagesId` as the instance. */
  restore(spec: SandboxSpec, imagesId: string, opts: { setHostname: boolean; connections: Connections }): Promise<Sandbox>;
  /** Takes back a sandbox a previous server left running, if it is still the same process. */
  adopt(spec: SandboxSpec, pid: number, startTime: string): Promise<Sandbox | undefined>;
  /** Replaces the instance's sandbox by the given state (a rollback): memory image or fresh boot. */
  replace(spec: SandboxSpec, imagesId: string | undefined): Promise<Sandbox>;
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
  freezeStopped(id: string, layerId: string): Promise<void>;
  hibernate(spec: SandboxSpec, layerId: string, imagesId: string): Promise<{ pauseMs: number }>;
  squash(layers: string[], image: string | null, into: string): Promise<void>;
  /** Layers and memory images on this node's disk. */
  readonly disk: NodeDisk;

  freeBytes(): Promise<number>;
  memoryInUse(id: string): Promise<number>;
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

  /** A layer as a tar (name-sorted, so the same layer packs to the same bytes). */
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
