import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { arch } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { z } from 'zod';
import { PullError } from '../seam/errors.js';
import type { ImageConfig, ImagePuller, PulledImage, PullRequest, RegistryImage } from '../seam/runtime.js';
import { EMPTY_BASE } from '../seam/runtime.js';
import { ociImageFiles, readImageConfig, unpackLayerInto } from './image-archive.js';
import type { Images } from './images.js';

/** The platform asked of a multi-platform image: this host's. */
const PLATFORM = { os: 'linux', architecture: arch() === 'x64' ? 'amd64' : arch() === 'arm64' ? 'arm64' : arch() };
/** skopeo's own deadline for a whole command (it retries nothing by itself). */
const COMMAND_TIMEOUT = '15m';
/** A manifest is small; a registry that answers with more is refused. */
const MAX_MANIFEST = 4 * 1024 * 1024;
/** An image's configuration is read whole; Docker's own limit on layers. */
const MAX_CONFIG = 4 * 1024 * 1024;
const MAX_LAYERS = 127;

/** A registry's answer as JSON, or a named failure (a registry's bytes are not trusted to parse). */
function jsonOf(raw: Buffer): unknown {
  try {
    return JSON.parse(raw.toString('utf8')) as unknown;
  } catch {
    throw new PullError('FAILED', `the registry's manifest is not JSON (${raw.length} bytes)`);
  }
}

const Descriptor = z.object({ mediaType: z.string().optional(), digest: z.string().regex(/^sha256:[0-9a-f]{64}$/), size: z.number().int().nonnegative() });
const Index = z.object({
  manifests: z.array(Descriptor.extend({ platform: z.object({ os: z.string(), architecture: z.string(), variant: z.string().optional() }).optional() })),
});
const Manifest = z.object({ config: Descriptor, layers: z.array(Descriptor) });
const CacheIndex = z.object({ manifests: z.array(z.object({ digest: z.string(), annotations: z.record(z.string(), z.string()).optional() })) });

/** The directory name of a pulled image: its digest (hidden from the system images' list). */
export const pulledDirName = (digest: string) => `sha256-${digest.slice('sha256:'.length, 'sha256:'.length + 56)}`;

const BASE36 = '0123456789abcdefghijklmnopqrstuvwxyz';

/** The layer of forkpoint's a registry layer becomes: named by the layer's digest (a name of
 * forkpoint's layer ids' shape), so that a layer two images share is unpacked once and shared.
 * The version is of the unpacking: a change to what a layer becomes on disk names new layers. */
export function pulledLayerId(blobDigest: string): string {
  const h = createHash('sha256').update(`forkpoint registry layer v1\0${blobDigest}`).digest();
  let id = '';
  for (let i = 0; i < 16; i++) id += BASE36[h[i]! % 36];
  return `lyr_${id}`;
}

/** skopeo's words for why it failed, as a named reason. */
function failureOf(stderr: string): PullError {
  const line = stderr.trim().split('\n').filter(Boolean).pop() ?? 'skopeo failed';
  const text = line.replace(/^time="[^"]*" level=\w+ msg="?/, '').replace(/"$/, '');
  // A digest mismatch first: its message quotes digests, whose hex may hold anything.
  if (/digest did not match|does not match|checksum|mismatch/i.test(stderr)) return new PullError('CORRUPT', `a blob from the registry is not what its digest says: ${text}`);
  if (/unauthorized|authentication required|denied|\b40[13]\b/i.test(stderr)) return new PullError('DENIED', `the registry refused: ${text}`);
  if (/manifest unknown|not found|name unknown|\b404\b/i.test(stderr)) return new PullError('NOT_IN_REGISTRY', `no such image in the registry: ${text}`);
  if (/connection refused|no such host|timeout|dial tcp|server gave HTTP response to HTTPS|\bEOF\b/i.test(stderr)) return new PullError('UNREACHABLE', `the registry could not be reached: ${text}`);
  return new PullError('FAILED', text);
}

/**
 * Pulls with skopeo (containers/image: the registry protocol, its auth, and the digest of every
 * blob checked as it arrives) into one OCI layout that is the node's blob cache, so a blob is
 * fetched once whatever image names it; then unpacks each of the image's layers into a layer of
 * forkpoint's named by the layer's digest, once for every image that has it. The image's
 * configuration is kept by the image's digest. The reference goes to skopeo whole and checked
 * (lib/image-reference), credentials in a file of mode 0600 that is removed after, never on a
 * command line.
 */
export class RegistryPuller implements ImagePuller {
  private readonly inFlight = new Map<string, Promise<{ config: ImageConfig; fetchedBytes: number }>>();
  /** One copy into the cache at a time: skopeo rewrites the layout's index. */
  private copying: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly images: Images,
    /** Where forkpoint's layers are (DataLayout.layers). */
    private readonly layersDir: string,
    private readonly cacheDir: string,
    private readonly skopeo = 'skopeo',
  ) {}

  /** Layers being unpacked: two images that share one, pulled at once, unpack it once. */
  private readonly unpacking = new Map<string, Promise<void>>();

  private async unpackOnce(id: string, file: string, what: string): Promise<void> {
    let running = this.unpacking.get(id);
    if (!running) {
      running = unpackLayerInto(file, join(this.layersDir, id), join(this.layersDir, `.pull-${id}-${process.pid}`), what).finally(() => this.unpacking.delete(id));
      this.unpacking.set(id, running);
    }
    await running;
  }

  private layerHere(id: string): boolean {
    return existsSync(join(this.layersDir, id));
  }

  async pull(req: PullRequest, signal: AbortSignal): Promise<PulledImage> {
    const auth = await this.authFile(req);
    const say = (stage: 'resolve' | 'fetch' | 'unpack', message: string) => req.onProgress?.({ stage, message });
    try {
      const common = ['--insecure-policy', '--command-timeout', COMMAND_TIMEOUT];
      say('resolve', `asking ${req.image.registry} for ${req.image.repository}${req.image.digest ? `@${req.image.digest}` : `:${req.image.tag ?? 'latest'}`}`);
      const { digest, manifest } = await this.resolve(req, auth, common, signal);
      const name = pulledDirName(digest);
      const ids = manifest.layers.map((l) => pulledLayerId(l.digest));
      const weight = manifest.config.size + manifest.layers.reduce((n, l) => n + l.size, 0);
      say('resolve', `${digest} for ${PLATFORM.os}/${PLATFORM.architecture}: ${manifest.layers.length} layers, ${weight} bytes`);
      // A layer an image has twice counts once, where it is newest: the older one's files are all
      // under the newer one's, and it hides nothing that is not under both.
      const layerIds = [...new Set([...ids].reverse())];
      const pulled = (config: ImageConfig, fetchedBytes: number): PulledImage => ({ digest, base: EMPTY_BASE, config, layerIds, layers: ids.length, bytes: weight, fetchedBytes });
      const here = () => {
        const config = this.images.config(name);
        return config && ids.every((id) => this.layerHere(id)) ? config : undefined;
      };
      if (!here() && weight > req.maxBytes) throw new PullError('TOO_LARGE', `the image's layers weigh ${weight} bytes, more than the ${req.maxBytes} a pull may fetch`);
      // Held before the disk is looked at: a layer found here stays here.
      await req.holdLayers(layerIds);
      const config = here();
      if (config) {
        say('unpack', 'already here: nothing to fetch');
        return pulled(config, 0);
      }
      // Two owners pulling one image at once: one fetch and unpack, both wait for it (each has
      // already been let in by the registry above).
      let running = this.inFlight.get(digest);
      if (!running) {
        running = this.fetchAndUnpack(req, auth, common, digest, manifest, name, ids, signal).finally(() => this.inFlight.delete(digest));
        this.inFlight.set(digest, running);
      }
      const done = await running;
      return pulled(done.config, done.fetchedBytes);
    } finally {
      if (auth) await rm(auth.dir, { recursive: true, force: true });
    }
  }

  private source(image: RegistryImage, digest?: string): string {
    const at = digest ?? image.digest;
    return `docker://${image.registry}/${image.repository}${at ? `@${at}` : `:${image.tag ?? 'latest'}`}`;
  }

  private async authFile(req: PullRequest): Promise<{ dir: string; file: string } | undefined> {
    if (!req.credentials) return undefined;
    const dir = await mkdtemp(join(this.cacheDir, '..', '.auth-'));
    await chmod(dir, 0o700);
    const file = join(dir, 'auth.json');
    const token = Buffer.from(`${req.credentials.username}:${req.credentials.password}`).toString('base64');
    await writeFile(file, JSON.stringify({ auths: { [req.image.registry]: { auth: token } } }), { mode: 0o600 });
    return { dir, file };
  }

  /** skopeo with `args`; each line it prints goes to `onLine` when given (its copy's progress). */
  private async run(args: string[], signal: AbortSignal, onLine?: (line: string) => void): Promise<Buffer> {
    const sub = execa(this.skopeo, args, { reject: false, encoding: 'buffer', stripFinalNewline: false, cancelSignal: signal, maxBuffer: MAX_MANIFEST, forceKillAfterDelay: 2000 });
    if (onLine) {
      let partial = '';
      sub.stdout?.on('data', (chunk: Buffer) => {
        const lines = (partial + chunk.toString('utf8')).split('\n');
        partial = (lines.pop() ?? '').slice(-4096);
        for (const l of lines) if (l.trim()) onLine(l.trim().slice(0, 500));
      });
    }
    const r = await sub;
    if (signal.aborted) throw new PullError('FAILED', 'the pull was cancelled', { cause: signal.reason });
    if (r.exitCode !== 0) throw failureOf(Buffer.from(r.stderr).toString('utf8') || String(r.message ?? ''));
    return Buffer.from(r.stdout);
  }

  /** The digest of the image for this platform, and its manifest, asked of the registry. */
  private async resolve(req: PullRequest, auth: { file: string } | undefined, common: string[], signal: AbortSignal): Promise<{ digest: string; manifest: z.infer<typeof Manifest> }> {
    const opts = [...common, 'inspect', '--raw', `--tls-verify=${!req.plainHttp}`, ...(auth ? ['--authfile', auth.file] : [])];
    let raw = await this.run([...opts, this.source(req.image)], signal);
    let digest = `sha256:${createHash('sha256').update(raw).digest('hex')}`;
    if (req.image.digest && digest !== req.image.digest) {
      throw new PullError('CORRUPT', `the registry's manifest has digest ${digest}, not the ${req.image.digest} asked for`);
    }
    const parsed = jsonOf(raw);
    const index = Index.safeParse(parsed);
    if (index.success && !Manifest.safeParse(parsed).success) {
      const entry = index.data.manifests.find((m) => m.platform?.os === PLATFORM.os && m.platform.architecture === PLATFORM.architecture);
      if (!entry) throw new PullError('NO_PLATFORM', `the image has no manifest for ${PLATFORM.os}/${PLATFORM.architecture}`);
      raw = await this.run([...opts, this.source(req.image, entry.digest)], signal);
      digest = `sha256:${createHash('sha256').update(raw).digest('hex')}`;
      if (digest !== entry.digest) throw new PullError('CORRUPT', `the registry's manifest has digest ${digest}, not the ${entry.digest} its index says`);
    }
    const manifest = Manifest.safeParse(jsonOf(raw));
    if (!manifest.success) throw new PullError('FAILED', `not an image manifest: ${manifest.error.issues[0]?.message ?? ''}`);
    // What a registry says is checked before anything is fetched: a configuration is read into
    // memory whole, and every layer is a lower of the overlay (Docker allows 127).
    if (manifest.data.config.size > MAX_CONFIG) throw new PullError('TOO_LARGE', `the image's configuration is ${manifest.data.config.size} bytes, more than ${MAX_CONFIG}`);
    if (manifest.data.layers.length > MAX_LAYERS) throw new PullError('TOO_LARGE', `the image has ${manifest.data.layers.length} layers, more than ${MAX_LAYERS}`);
    return { digest, manifest: manifest.data };
  }

  private async fetchAndUnpack(req: PullRequest, auth: { file: string } | undefined, common: string[], digest: string, manifest: z.infer<typeof Manifest>, name: string, ids: string[], signal: AbortSignal): Promise<{ config: ImageConfig; fetchedBytes: number }> {
    await mkdir(this.cacheDir, { recursive: true });
    const present = (d: string) => existsSync(join(this.cacheDir, 'blobs', 'sha256', d.slice(7)));
    const missing = [manifest.config, ...manifest.layers].reduce((n, b) => n + (present(b.digest) ? 0 : b.size), 0);
    req.onProgress?.({ stage: 'fetch', message: `${missing} bytes to fetch` });
    const copy = async () =>
      this.run([...common, 'copy', `--src-tls-verify=${!req.plainHttp}`, ...(auth ? ['--src-authfile', auth.file] : []),
        this.source(req.image, digest), `oci:${this.cacheDir}:${name}`], signal, (line) => req.onProgress?.({ stage: 'fetch', message: line }));
    const queued = this.copying.then(copy, copy);
    this.copying = queued.catch(() => {});
    await queued;
    try {
      // Found by the name the copy gave it: a Docker manifest is stored converted to OCI's, under
      // another digest.
      const stored = await this.storedManifest(name);
      // Used now: the cache keeps what was used last (trimCache).
      const now = new Date();
      await utimes(this.blob(stored), now, now).catch(() => {});
      const files = await ociImageFiles(this.cacheDir, stored);
      if (files.layers.length !== ids.length) throw new PullError('FAILED', `the cached image has ${files.layers.length} layers, the registry's manifest ${ids.length}`);
      const todo = ids.flatMap((id, i) => (this.layerHere(id) ? [] : [{ id, i }]));
      req.onProgress?.({ stage: 'unpack', message: `unpacking ${todo.length} of ${ids.length} layers (the others are here)` });
      for (const { id, i } of todo) {
        signal.throwIfAborted();
        await this.unpackOnce(id, files.layers[i]!, `layer ${i}`);
      }
      const config = await readImageConfig(files.config);
      await this.images.setConfig(name, config);
      return { config, fetchedBytes: missing };
    } catch (err) {
      // Layers placed whole stay (held, they are collected when nothing holds them).
      throw err instanceof PullError ? err : new PullError('FAILED', `unpacking the image: ${(err as Error).message}`, { cause: err });
    }
  }

  trimCache(keep: readonly string[], budgetBytes: number): Promise<{ removedBytes: number }> {
    // Never beside a copy: skopeo writes the layout's index.
    const run = this.copying.then(() => this.trim(new Set(keep), budgetBytes));
    this.copying = run.catch(() => {});
    return run;
  }

  private blob(digest: string): string {
    return join(this.cacheDir, 'blobs', 'sha256', digest.slice('sha256:'.length));
  }

  private async trim(keep: ReadonlySet<string>, budget: number): Promise<{ removedBytes: number }> {
    const indexFile = join(this.cacheDir, 'index.json');
    if (!existsSync(indexFile)) return { removedBytes: 0 };
    const raw = JSON.parse(await readFile(indexFile, 'utf8')) as { manifests: unknown[] };
    const index = CacheIndex.parse(raw);
    const sizeOf = async (digest: string) => (await stat(this.blob(digest)).catch(() => undefined))?.size ?? 0;
    // Each image of the cache: its blobs (manifest, configuration, layers) and when last used
    // (its manifest's time: a pull from the cache touches it).
    const images = await Promise.all(
      index.manifests.map(async (m, i) => {
        const blobs = new Set([m.digest]);
        const manifest = Manifest.safeParse(await readFile(this.blob(m.digest), 'utf8').then(JSON.parse, () => undefined));
        if (manifest.success) for (const b of [manifest.data.config, ...manifest.data.layers]) blobs.add(b.digest);
        const name = m.annotations?.['org.opencontainers.image.ref.name'];
        return { i, blobs, kept: name !== undefined && keep.has(name), usedAt: (await stat(this.blob(m.digest)).catch(() => undefined))?.mtimeMs ?? 0 };
      }),
    );
    const stays = new Set(images.filter((im) => im.kept).flatMap((im) => [...im.blobs]));
    const dropped = new Set<number>();
    let extra = 0;
    for (const im of images.filter((x) => !x.kept).sort((a, b) => b.usedAt - a.usedAt)) {
      const own = [...im.blobs].filter((d) => !stays.has(d));
      const bytes = (await Promise.all(own.map(sizeOf))).reduce((n, b) => n + b, 0);
      if (extra + bytes <= budget) {
        extra += bytes;
        for (const d of own) stays.add(d);
      } else dropped.add(im.i);
    }
    if (dropped.size) {
      raw.manifests = raw.manifests.filter((_, i) => !dropped.has(i));
      const tmp = `${indexFile}.tmp`;
      await writeFile(tmp, JSON.stringify(raw));
      await rename(tmp, indexFile);
    }
    // Every blob nothing left names goes (a failed copy's too).
    let removedBytes = 0;
    const dir = join(this.cacheDir, 'blobs', 'sha256');
    for (const hex of existsSync(dir) ? await readdir(dir) : []) {
      if (stays.has(`sha256:${hex}`)) continue;
      removedBytes += await sizeOf(`sha256:${hex}`);
      await rm(join(dir, hex), { force: true });
    }
    return { removedBytes };
  }

  /** The digest of the manifest the cache's index names `name`. */
  private async storedManifest(name: string): Promise<string> {
    const index = CacheIndex.parse(JSON.parse(await readFile(join(this.cacheDir, 'index.json'), 'utf8')));
    const entry = [...index.manifests].reverse().find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === name);
    if (!entry) throw new PullError('FAILED', `the pull cache has no image ${name}`);
    return entry.digest;
  }

  /** What a pull left when the server died in it: a credentials file, a half-unpacked tree or
   * layer. */
  async sweep(): Promise<void> {
    const dir = this.images.path('');
    for (const name of existsSync(dir) ? await readdir(dir) : []) {
      if (name.startsWith('.auth-') || name.startsWith('.pull-') || name.startsWith('.trash-')) await rm(join(dir, name), { recursive: true, force: true });
    }
    for (const name of existsSync(this.layersDir) ? await readdir(this.layersDir) : []) {
      if (name.startsWith('.pull-')) await rm(join(this.layersDir, name), { recursive: true, force: true });
    }
  }
}
