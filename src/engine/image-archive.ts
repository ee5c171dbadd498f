import { lstat, mkdir, readFile, rename, rm } from 'node:fs/promises';
import { join, normalize } from 'node:path';
import { execa } from 'execa';
import { z } from 'zod';
import { ArchiveRefusedError, checkArchive, type ArchiveBounds } from '../lib/archive-bounds.js';
import { EngineError } from '../seam/errors.js';
import { EMPTY_IMAGE_CONFIG, IMAGE_NAME, type ImageConfig, type Images } from './images.js';
import type { Mounter } from './overlay.js';
import { MAX_OWN_MOUNTS, volumePathProblem } from '../lib/volume-path.js';

/** `docker save`'s manifest.json. */
const DockerManifest = z.array(z.object({ Config: z.string(), Layers: z.array(z.string()) })).min(1);
/** The OCI image layout's index.json and manifests. */
const OciIndex = z.object({ manifests: z.array(z.object({ digest: z.string(), mediaType: z.string().optional() })).min(1) });
const OciManifest = z.object({ config: z.object({ digest: z.string() }), layers: z.array(z.object({ digest: z.string() })) });
const ImageConfigFile = z.object({
  config: z
    .object({
      Env: z.array(z.string()).nullish(),
      WorkingDir: z.string().nullish(),
      User: z.string().nullish(),
      Cmd: z.array(z.string()).nullish(),
      Entrypoint: z.array(z.string()).nullish(),
      Labels: z.record(z.string(), z.string()).nullish(),
      ExposedPorts: z.record(z.string(), z.unknown()).nullish(),
      Volumes: z.record(z.string(), z.unknown()).nullish(),
    })
    .nullish(),
});

const fail = (message: string, cause?: unknown) => new EngineError('BOOT_FAILED', message, undefined, cause ? { cause } : undefined);

/** A path inside the unpacked archive, from the archive's own words: never out of it, never
 * through a link. */
async function inside(root: string, rel: string): Promise<string> {
  const n = normalize(rel);
  if (n.startsWith('..') || n.startsWith('/')) throw fail(`the archive names a file outside itself: ${rel}`);
  let cur = root;
  for (const part of n.split('/')) {
    cur = join(cur, part);
    const st = await lstat(cur).catch(() => undefined);
    if (!st) throw fail(`the archive lacks ${rel}`);
    if (st.isSymbolicLink()) throw fail(`the archive's ${rel} is a link`);
  }
  return cur;
}

const blob = (root: string, digest: string) => {
  const m = /^sha256:([0-9a-f]{64})$/.exec(digest);
  if (!m) throw fail(`not a sha256 digest: ${digest}`);
  return inside(root, `blobs/sha256/${m[1]}`);
};

/** The layers (oldest first) and configuration file of a `docker save` or OCI layout archive
 * unpacked at `root`; undefined for a plain rootfs tarball. */
async function layout(root: string): Promise<{ layers: string[]; config: string } | undefined> {
  const docker = await readFile(join(root, 'manifest.json'), 'utf8').catch(() => undefined);
  if (docker !== undefined) {
    const m = DockerManifest.parse(JSON.parse(docker))[0]!;
    return { layers: await Promise.all(m.Layers.map((l) => inside(root, l))), config: await inside(root, m.Config) };
  }
  const oci = await readFile(join(root, 'index.json'), 'utf8').catch(() => undefined);
  if (oci === undefined) return undefined;
  let manifest: unknown = JSON.parse(oci);
  // An index may point at another index (a multi-platform image): the first manifest wins.
  for (let depth = 0; depth < 4; depth++) {
    const idx = OciIndex.safeParse(manifest);
    if (!idx.success) break;
    manifest = JSON.parse(await readFile(await blob(root, idx.data.manifests[0]!.digest), 'utf8'));
  }
  const m = OciManifest.parse(manifest);
  return { layers: await Promise.all(m.layers.map((l) => blob(root, l.digest))), config: await blob(root, m.config.digest) };
}

/** The layer and configuration files of one image manifest in an OCI layout at `root`, by the
 * manifest's digest (a layout holding many images: the pull cache). */
export async function ociImageFiles(root: string, manifestDigest: string): Promise<{ layers: string[]; config: string }> {
  const m = OciManifest.parse(JSON.parse(await readFile(await blob(root, manifestDigest), 'utf8')));
  return { layers: await Promise.all(m.layers.map((l) => blob(root, l.digest))), config: await blob(root, m.config.digest) };
}

/** An image's configuration file (OCI's, or Docker's) as forkpoint keeps it. */
export async function readImageConfig(file: string): Promise<ImageConfig> {
  return configOf(await readFile(file, 'utf8'));
}

function configOf(text: string): ImageConfig {
  const c = ImageConfigFile.parse(JSON.parse(text)).config ?? {};
  const env: Record<string, string> = {};
  for (const kv of c.Env ?? []) {
    const i = kv.indexOf('=');
    if (i > 0) env[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return {
    ...EMPTY_IMAGE_CONFIG,
    env,
    workdir: c.WorkingDir || null,
    user: c.User || null,
    cmd: c.Cmd ?? null,
    entrypoint: c.Entrypoint ?? null,
    labels: c.Labels ?? {},
    exposedPorts: Object.keys(c.ExposedPorts ?? {}).map((p) => Number(p.split('/')[0])).filter((p) => p > 0 && p < 65536),
    // One that could not be a mount point here (a path through /proc, say) is left out.
    volumes: Object.keys(c.Volumes ?? {}).map((p) => p.replace(/(.)\/+$/, '$1')).filter((p) => !volumePathProblem(p)).slice(0, MAX_OWN_MOUNTS),
  };
}

/** Turns an image layer's whiteout files into overlayfs's own: `.wh.NAME` becomes a 0/0
 * character device NAME, `.wh..wh..opq` the opaque mark on its directory. */
/** An image of one layer is that layer's tree: unpacked in place, with no merge and no copy of
 * the whole tree (a gigabyte for forkpoint's own Debian image). Its whiteouts hide nothing
 * (there is nothing under it) and go. */
async function unpackOneLayer(images: Images, name: string, layer: string, config: string, work: string): Promise<void> {
  const root = join(work, 'root');
  await mkdir(root);
  await bounded(layer, 'layer 0');
  const x = await execa('tar', ['-xf', layer, '-C', root, '--numeric-owner'], { reject: false });
  if (x.exitCode !== 0) throw fail(`layer 0: tar: ${x.stderr.trim()}`);
  for (const path of await whiteoutsUnder(root)) await rm(path, { recursive: true, force: true });
  await images.setConfig(name, configOf(await readFile(config, 'utf8')));
  await rename(root, images.path(name));
}

async function whiteoutsUnder(dir: string): Promise<string[]> {
  return (await execa('find', [dir, '-name', '.wh.*', '-print0'])).stdout.split('\0').filter(Boolean);
}

async function overlayWhiteouts(dir: string): Promise<void> {
  const found = await whiteoutsUnder(dir);
  const opaque: string[] = [];
  for (const path of found) {
    const slash = path.lastIndexOf('/');
    const parent = path.slice(0, slash);
    const name = path.slice(slash + 1);
    await rm(path, { recursive: true, force: true });
    if (name === '.wh..wh..opq') {
      opaque.push(parent);
      continue;
    }
    // A layer may remove a name and make it again (OCI: a whiteout hides only what is under
    // it): a file made again hides the lower one by itself, a directory must not merge with it.
    const hidden = join(parent, name.slice('.wh.'.length));
    const again = await lstat(hidden).catch(() => undefined);
    if (again?.isDirectory()) opaque.push(hidden);
    else if (!again) await execa('mknod', [hidden, 'c', '0', '0']);
  }
  if (opaque.length) {
    await execa('python3', ['-c', "import os,sys\nfor p in sys.argv[1:]: os.setxattr(p, 'trusted.overlay.opaque', b'y', follow_symlinks=False)", ...opaque]);
  }
}

/** What an imported archive, and each of its layers, may unpack to: an image is an operator's,
 * but a layer of 10 KiB that unpacks to terabytes (a sparse member, a gzip bomb) fills the disk
 * of every tenant. */
const IMPORT_BOUNDS: ArchiveBounds = {
  maxBytes: 64 * 1024 ** 3,
  maxEntries: 2_000_000,
  types: ['file', 'directory', 'symlink', 'link', 'character-device', 'block-device', 'fifo'],
};

async function bounded(file: string, what: string): Promise<void> {
  await checkArchive(file, IMPORT_BOUNDS).catch((err: unknown) => {
    throw err instanceof ArchiveRefusedError ? fail(`${what} is refused: ${err.message}`, err) : err;
  });
}

/**
 * Imports an image archive as a new image: a `docker save` tarball or an OCI image layout
 * (layers applied in order by overlayfs itself, whiteouts honoured, the config's Env,
 * WorkingDir, User, Cmd and Entrypoint kept), or a plain rootfs tarball. Each layer is unpacked
 * into a directory of its own (nothing of an earlier layer can redirect a later one), and the
 * merged view is copied into the image.
 */
export async function importImageArchive(images: Images, mounter: Mounter, name: string, file: string): Promise<{ layers: number }> {
  if (!IMAGE_NAME.test(name)) throw fail(`bad image name ${name}`);
  if (images.present(name)) throw fail(`image ${name} exists`);
  const work = join(images.path(''), `.import-${name}-${process.pid}`);
  await rm(work, { recursive: true, force: true });
  const archive = join(work, 'archive');
  await mkdir(archive, { recursive: true });
  try {
    await bounded(file, 'the archive');
    const r = await execa('tar', ['-xf', file, '-C', archive, '--no-same-owner'], { reject: false });
    if (r.exitCode !== 0) throw fail(`tar: ${r.stderr.trim()}`);
    const found = await layout(archive);
    if (!found) {
      // A rootfs tarball: the tree as it is.
      await rename(archive, images.path(name));
      return { layers: 1 };
    }
    await unpackLayers(images, mounter, name, found, work);
    return { layers: found.layers.length };
  } catch (err) {
    throw err instanceof EngineError ? err : fail(`not an image archive: ${(err as Error).message}`, err);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

/**
 * Makes one layer of forkpoint's, at `dest`, of an image's layer tarball (plain or compressed):
 * bounded, unpacked with its owners' numeric ids as they are (canonical), its whiteouts made
 * overlayfs's. Unpacked in `staging` (on dest's filesystem) and renamed into place, so `dest` is
 * whole or absent; if another pull placed it meanwhile, that one stays.
 */
export async function unpackLayerInto(layer: string, dest: string, staging: string, what: string): Promise<void> {
  await rm(staging, { recursive: true, force: true });
  await mkdir(staging, { recursive: true });
  try {
    await bounded(layer, what);
    const x = await execa('tar', ['-xf', layer, '-C', staging, '--numeric-owner'], { reject: false });
    if (x.exitCode !== 0) throw fail(`${what}: tar: ${x.stderr.trim()}`);
    await overlayWhiteouts(staging);
    // On the disk before it has its name: a layer found by name is whole, a crash or not.
    const synced = await execa('sync', ['--file-system', staging], { reject: false });
    if (synced.exitCode !== 0) throw fail(`${what}: sync: ${synced.stderr.trim()}`);
    await rename(staging, dest).catch(async (err: NodeJS.ErrnoException) => {
      if (!(await lstat(dest).catch(() => undefined))?.isDirectory()) throw err;
    });
  } finally {
    await rm(staging, { recursive: true, force: true });
  }
}

/**
 * Makes image `name` of an image's layer tarballs (oldest first; plain or compressed) and its
 * configuration file: each layer unpacked into a directory of its own (nothing of an earlier
 * layer can redirect a later one), bounded, its whiteouts made overlayfs's, the merged view copied
 * into the image. `work` is a scratch directory beside the images; the caller removes it.
 */
export async function unpackLayers(images: Images, mounter: Mounter, name: string, found: { layers: string[]; config: string }, work: string): Promise<void> {
  if (found.layers.length === 1) return unpackOneLayer(images, name, found.layers[0]!, found.config, work);
  const merged = join(work, 'merged');
  let mounted = false;
  try {
    const dirs: string[] = [];
    for (const [i, layer] of found.layers.entries()) {
      const dir = join(work, `layer${i}`);
      await mkdir(dir);
      await bounded(layer, `layer ${i}`);
      const x = await execa('tar', ['-xf', layer, '-C', dir, '--numeric-owner'], { reject: false });
      if (x.exitCode !== 0) throw fail(`layer ${i}: tar: ${x.stderr.trim()}`);
      await overlayWhiteouts(dir);
      dirs.unshift(dir); // newest first
    }
    const empty = join(work, 'empty');
    await mkdir(empty);
    await mkdir(merged);
    await mounter.mountReadOnly([...dirs, empty], merged, work);
    mounted = true;
    const root = join(work, 'root');
    const cp = await execa('cp', ['-a', `${merged}/.`, root], { reject: false });
    if (cp.exitCode !== 0) throw fail(`copying the merged layers: ${cp.stderr.trim()}`);
    await mounter.unmount(merged);
    mounted = false;
    await images.setConfig(name, configOf(await readFile(found.config, 'utf8')));
    await rename(root, images.path(name));
  } finally {
    if (mounted) await mounter.unmount(merged).catch(() => {});
  }
}
