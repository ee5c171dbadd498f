import { EMPTY_BASE, type PullProgress, type SystemImages } from '../seam/runtime.js';
import type { LayerCollector } from './layers.js';
import type { Store } from '../store/index.js';
import { EMPTY_CONFIG, imageHolder, type BuiltImageRecord, type ImageConfig } from '../store/images.js';
import { formatReference, looksLikeReference, parseReference } from '../lib/image-reference.js';
import { ConflictError, InvalidRequestError, NotFoundError } from './errors.js';
import { canonicalImageName, type ImagePulls } from './pulls.js';

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
  kind: 'system' | 'built' | 'pulled';
  base: string | null;
  layers: number;
  config: ImageConfig;
  createdAt: string;
}

/** The build key of a pulled image: the digest it was pulled at. */
const PULLED_KEY = 'pull:';
/** The directory of a pulled image's tree (engine/registry-pull.ts pulledDirName). */
const PULLED_TREE = /^sha256-[0-9a-f]{56}$/;

/** Images an owner can use: the system's rootfs directories (set-up's and imported ones, shared),
 * the owner's own built images (layers on one of those), and the images the owner pulled from
 * registries (each owner's pull asks the registry itself; each layer is kept once, by digest,
 * as a layer of forkpoint's that every image which has it shares). */
export class ImageCatalog {
  constructor(
    private readonly store: Store,
    private readonly dirs: SystemImages,
    private readonly pulls: ImagePulls,
    private readonly layers: LayerCollector,
    /** Whether a layer is on this node's disk. */
    private readonly layerHere: (id: string) => boolean,
  ) {}

  /** The image `name` names for `owner`: a built or pulled one of theirs, a system one, or, for a
   * registry reference not pulled yet (`python:3.12-slim`, `registry.example/app@sha256:…`), the
   * image pulled now. */
  async resolve(owner: string, name: string, signal: AbortSignal = AbortSignal.timeout(PULL_DEADLINE_MS)): Promise<ResolvedImage> {
    const key = looksLikeReference(name) ? canonicalImageName(name) : name;
    const built = await this.store.images.get(owner, key);
    if (built) {
      await this.ensurePulledTree(owner, built.base, signal);
      await this.ensurePulledLayers(owner, built, signal);
      return { ref: built.name, base: built.base, layers: built.layers, config: built.config, key: built.buildKey };
    }
    if (this.dirs.exists(name)) return { ref: null, base: name, layers: [], config: this.dirs.config(name) ?? EMPTY_CONFIG, key: `image:${name}:${this.dirs.identity(name)}` };
    if (looksLikeReference(name)) {
      await this.pull(owner, name, undefined, signal);
      return this.resolve(owner, key, signal);
    }
    throw new InvalidRequestError(`unknown image ${name}`, { image: name });
  }

  /** Pulls `reference` (again: a tag may have moved) and records it as the owner's image of that
   * name. Credentials are used for this pull and kept nowhere. */
  async pull(owner: string, reference: string, credentials: { username: string; password: string } | undefined, signal: AbortSignal, onProgress?: (p: PullProgress) => void): Promise<{ image: ImageView; fetchedBytes: number; digest: string }> {
    // A collection of unused trees under way ends first: it might take the tree this pull finds.
    while (this.collecting) await this.collecting.catch(() => {});
    this.pullsUnderWay++;
    try {
      const hold = this.layers.pullHold();
      let recorded = false;
      try {
        const { name, pulled } = await this.pulls.pull(owner, reference, credentials, signal, hold.hold, onProgress);
        await this.store.transaction(async (tx) => {
          await tx.images.put({ owner, name, base: pulled.base, layers: pulled.layerIds, config: pulled.config, buildKey: `${PULLED_KEY}${pulled.digest}`, createdAt: new Date().toISOString(), pulledBytes: pulled.bytes });
          await tx.layers.setRefs(imageHolder(owner, name), pulled.layerIds);
        });
        recorded = true;
        return { image: await this.get(owner, name), fetchedBytes: pulled.fetchedBytes, digest: pulled.digest };
      } finally {
        await hold.release();
        // A failed pull keeps none of the layers it placed (unless something else holds them).
        if (!recorded) await this.layers.collect().catch(() => {});
      }
    } finally {
      this.pullsUnderWay--;
    }
  }

  /**
   * The layers of an image pulled layer by layer, unpacked here again where this node lacks
   * them (pulled on another node): the owner's pulled images whose layers the image stands on are
   * pulled again by digest, as their owner. A built image's own layers are not the registry's
   * to give: they are on the node that built it (and in the object store with a durable
   * checkpoint of an instance on it).
   */
  private async ensurePulledLayers(owner: string, image: { base: string; layers: string[] }, signal: AbortSignal): Promise<void> {
    if (image.base !== EMPTY_BASE || image.layers.every(this.layerHere)) return;
    const stood = new Set(image.layers);
    for (const rec of await this.store.images.list(owner)) {
      if (!rec.buildKey.startsWith(PULLED_KEY) || rec.base !== EMPTY_BASE || rec.layers.every(this.layerHere) || !rec.layers.every((l) => stood.has(l))) continue;
      const reference = formatReference(parseReference(rec.name), { digest: rec.buildKey.slice(PULLED_KEY.length) });
      await this.pullAgain(owner, reference, signal);
    }
  }

  /** A pull by digest of an image the owner has: for this node's disk, recording nothing new. */
  private async pullAgain(owner: string, reference: string, signal: AbortSignal): Promise<void> {
    while (this.collecting) await this.collecting.catch(() => {});
    this.pullsUnderWay++;
    const hold = this.layers.pullHold();
    try {
      await this.pulls.pull(owner, reference, undefined, signal, hold.hold);
    } finally {
      await hold.release();
      this.pullsUnderWay--;
    }
  }

  private pullsUnderWay = 0;

  /** Deletes layers nothing stands on any more, in turn with pulls' holds. */
  collectLayers(): Promise<void> {
    return this.layers.collect();
  }

  /**
   * The tree of an image `owner` pulled, made here again when this node lacks it (it was pulled
   * on another node: a create placed here, a fork or recovery of an instance from there): pulled
   * by its digest, as its owner (with the owner's kept credentials), so that it is the same image
   * whatever its tag says now. Nothing for a tree that is here, or that no image of the owner's
   * names (the caller says what is missing).
   */
  async ensurePulledTree(owner: string, base: string, signal: AbortSignal = AbortSignal.timeout(PULL_DEADLINE_MS)): Promise<void> {
    if (!PULLED_TREE.test(base) || this.dirs.present(base)) return;
    const rec = (await this.store.images.list(owner)).find((i) => i.buildKey.startsWith(PULLED_KEY) && i.base === base);
    if (!rec) return;
    await this.pullAgain(owner, formatReference(parseReference(rec.name), { digest: rec.buildKey.slice(PULLED_KEY.length) }), signal);
  }
  private collecting: Promise<string[]> | undefined;

  /**
   * Removes what pulled images nothing stands on any more keep on this node: the trees of those
   * pulled whole (by an older forkpoint) that no owner's image, instance or checkpoint stands on,
   * and the configurations of those pulled layer by layer that no owner has (their layers go
   * with the other layers, when nothing holds them). Not while a pull runs here (its image is
   * not recorded yet); pulls wait for it. Answers what went.
   */
  async collectPulled(): Promise<string[]> {
    if (this.pullsUnderWay > 0 || this.collecting) return [];
    const run = (async () => {
      const removed: string[] = [];
      for (const tree of await this.dirs.pulled()) {
        const used =
          (await this.store.images.anyPulledAs(`${PULLED_KEY}sha256:${tree.slice('sha256-'.length)}`)) ||
          (await this.store.images.anyOnBase(tree)) || (await this.store.instances.countOnImage(null, tree)) > 0 || (await this.store.checkpoints.anyOnImage(tree));
        if (used) continue;
        await this.dirs.removePulled(tree);
        removed.push(tree);
      }
      // Their blobs stay in the node's cache (a pull again fetches nothing) within its bound.
      await this.pulls.trimCache(await this.dirs.pulled());
      return removed;
    })();
    this.collecting = run;
    try {
      return await run;
    } finally {
      this.collecting = undefined;
    }
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
    const built = await this.store.images.get(owner, looksLikeReference(name) ? canonicalImageName(name) : name);
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

  private deleted: (name: string) => Promise<void> = async () => {};

  /** Told when an image is deleted, before its layers are let go (warm standbys of it go). */
  whenDeleted(listener: (name: string) => Promise<void>): void {
    this.deleted = listener;
  }

  /** Deletes a built image; refused while instances stand on it. Its layers go when nothing
   * else (an instance, a checkpoint, the build cache) holds them. */
  async delete(owner: string, given: string): Promise<void> {
    const name = looksLikeReference(given) ? canonicalImageName(given) : given;
    if (!(await this.store.images.get(owner, name))) {
      if (this.dirs.exists(name)) throw new ConflictError(`${name} is a system image, shared by every owner; remove it on the host`, { image: name });
      throw new NotFoundError('image', name);
    }
    const users = await this.store.instances.countOnImage(owner, name);
    if (users > 0) throw new ConflictError(`${users} instance(s) stand on image ${name}; delete them first`, { image: name, instances: users });
    await this.deleted(name);
    await this.store.transaction(async (tx) => {
      await tx.layers.dropHolder(imageHolder(owner, name));
      await tx.images.delete(owner, name);
    });
    await this.collectPulled();
  }
}

/** How long a pull made for a create or a build may take (an explicit pull has the request's). */
const PULL_DEADLINE_MS = 15 * 60_000;

const builtView = (b: BuiltImageRecord): ImageView =>
  b.buildKey.startsWith(PULLED_KEY)
    ? { name: b.name, kind: 'pulled', base: b.buildKey.slice(PULLED_KEY.length), layers: b.layers.length, config: b.config, createdAt: b.createdAt }
    : { name: b.name, kind: 'built', base: b.base === EMPTY_BASE ? null : b.base, layers: b.layers.length, config: b.config, createdAt: b.createdAt };
