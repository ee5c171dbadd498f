import type { SystemImages } from '../seam/runtime.js';
import type { Store } from '../store/index.js';
import { EMPTY_CONFIG, imageHolder, type BuiltImageRecord, type ImageConfig } from '../store/images.js';
import { ConflictError, InvalidRequestError, NotFoundError } from './errors.js';

/** An image as an instance stands on it: a rootfs directory, layers over it, its configuration. */
export interface ResolvedImage {
  /** The built image's name (null: a rootfs directory image). */
  ref: string | null;
  base: string;
  layers: string[];
  config: ImageConfig;
  /** What a build's cache keys start from: the image's identity and contents. */
  key: string;
}

export interface ImageView {
  name: string;
  kind: 'system' | 'built';
  base: string | null;
  layers: number;
  config: ImageConfig;
  createdAt: string;
}

/** Images an owner can use: the system's rootfs directories (set-up's and imported ones, shared)
 * and the owner's own built images (layers on one of those). */
export class ImageCatalog {
  constructor(
    private readonly store: Store,
    private readonly dirs: SystemImages,
  ) {}

  async resolve(owner: string, name: string): Promise<ResolvedImage> {
    const built = await this.store.images.get(owner, name);
    if (built) return { ref: built.name, base: built.base, layers: built.layers, config: built.config, key: built.buildKey };
    if (this.dirs.exists(name)) return { ref: null, base: name, layers: [], config: this.dirs.config(name) ?? EMPTY_CONFIG, key: `image:${name}:${this.dirs.identity(name)}` };
    throw new InvalidRequestError(`unknown image ${name}`, { image: name });
  }

  readonly emptyConfig: ImageConfig = EMPTY_CONFIG;

  isSystem(name: string): boolean {
    return this.dirs.exists(name);
  }

  async list(owner: string): Promise<ImageView[]> {
    const system = (await this.dirs.list()).map((i): ImageView => ({ name: i.name, kind: 'system', base: null, layers: 0, config: this.dirs.config(i.name) ?? EMPTY_CONFIG, createdAt: i.createdAt }));
    return [...system, ...(await this.store.images.list(owner)).map(builtView)];
  }

  async get(owner: string, name: string): Promise<ImageView> {
    const built = await this.store.images.get(owner, name);
    if (built) return builtView(built);
    if (!this.dirs.exists(name)) throw new NotFoundError('image', name);
    return { name, kind: 'system', base: null, layers: 0, config: this.dirs.config(name) ?? EMPTY_CONFIG, createdAt: this.dirs.createdAt(name) };
  }

  /** Records a built image (replacing one of that name: instances on the old one keep its
   * layers, each holds its own references). */
  async put(rec: BuiltImageRecord): Promise<void> {
    if (this.dirs.exists(rec.name)) throw new ConflictError(`${rec.name} is a system image; build under another name`, { image: rec.name });
    await this.store.transaction(async (tx) => {
      await tx.images.put(rec);
      await tx.layers.setRefs(imageHolder(rec.owner, rec.name), rec.layers);
    });
  }

  /** Deletes a built image; refused while instances stand on it. Its layers go when nothing
   * else (an instance, a checkpoint, the build cache) holds them. */
  async delete(owner: string, name: string): Promise<void> {
    if (!(await this.store.images.get(owner, name))) {
      if (this.dirs.exists(name)) throw new ConflictError(`${name} is a system image, shared by every owner; remove it on the host`, { image: name });
      throw new NotFoundError('image', name);
    }
    const users = await this.store.instances.countOnImage(owner, name);
    if (users > 0) throw new ConflictError(`${users} instance(s) stand on image ${name}; delete them first`, { image: name, instances: users });
    await this.store.transaction(async (tx) => {
      await tx.layers.dropHolder(imageHolder(owner, name));
      await tx.images.delete(owner, name);
    });
  }
}

const builtView = (b: BuiltImageRecord): ImageView => ({ name: b.name, kind: 'built', base: b.base, layers: b.layers.length, config: b.config, createdAt: b.createdAt });
