import { join } from 'node:path';

/** Where everything lives under the data directory. Uppers, work dirs and layers share one
 * filesystem so that freezing an upper into a layer is a rename, never a copy. */
export class DataLayout {
  constructor(readonly root: string) {}

  get db(): string {
    return join(this.root, 'forkpoint.db');
  }
  get initialTokenFile(): string {
    return join(this.root, 'initial-token');
  }
  get nodeIdFile(): string {
    return join(this.root, 'node-id');
  }
  get previewSecretFile(): string {
    return join(this.root, 'preview-secret');
  }
  /** The key what the store keeps sealed is sealed with (core/secrets-key.ts). */
  get secretsKey(): string {
    return join(this.root, 'secrets.key');
  }

  get images(): string {
    return join(this.root, 'images');
  }
  image(name: string): string {
    return join(this.images, name);
  }
  get layers(): string {
    return join(this.root, 'layers');
  }
  layer(id: string): string {
    return join(this.layers, id);
  }
  get agents(): string {
    return join(this.root, 'agent');
  }
  agentLayer(id: string): string {
    return join(this.agents, id);
  }
  instance(id: string): string {
    return join(this.root, 'instances', id);
  }
  upper(id: string): string {
    return join(this.instance(id), 'upper');
  }
  work(id: string): string {
    return join(this.instance(id), 'work');
  }
  merged(id: string): string {
    return join(this.instance(id), 'merged');
  }
  run(id: string): string {
    return join(this.instance(id), 'run');
  }
  /** Memory images: checkpoints' and hibernated instances'. */
  get checkpoints(): string {
    return join(this.root, 'checkpoints');
  }
  checkpoint(id: string): string {
    return join(this.checkpoints, id);
  }
  /** Size-limited filesystems of instances with a disk limit (limited-disks.ts); the name is
   * from before persistent volumes. */
  get limitedDisks(): string {
    return join(this.root, 'volumes');
  }
  /** Owners' persistent volumes (persistent-volumes.ts). */
  get persistentVolumes(): string {
    return join(this.root, 'persistent-volumes');
  }
  /** Command output past the first MiB per stream, until it is sent (lib/output.ts). */
  get spill(): string {
    return join(this.root, 'spill');
  }
  /** Build contexts clients sent, unpacked for the time of their build. */
  get contexts(): string {
    return join(this.root, 'contexts');
  }
  get trash(): string {
    return join(this.root, 'trash');
  }
  get criuRun(): string {
    return join(this.root, 'criu-run');
  }

  /** Paths relative to the root, for mount options that must stay under 4095 bytes. */
  relative(abs: string): string {
    return abs.startsWith(this.root + '/') ? abs.slice(this.root.length + 1) : abs;
  }
}
