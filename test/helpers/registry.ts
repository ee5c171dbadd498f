import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { execa } from 'execa';

/** A real OCI registry (Debian's docker-registry, the CNCF distribution) on loopback, started by
 * the test in a temporary directory, optionally behind htpasswd credentials. */
export interface TestRegistry {
  host: string;
  dir: string;
  /** What it logged: each request it served. */
  log(): string;
  /** The file of a blob in its storage (to corrupt it). */
  blobFile(digest: string): string;
  close(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export async function startRegistry(auth?: { username: string; password: string }): Promise<TestRegistry> {
  const dir = await mkdtemp(join(tmpdir(), 'forkpoint-registry-'));
  const port = await freePort();
  const host = `127.0.0.1:${port}`;
  let authConfig = '';
  if (auth) {
    const { stdout } = await execa('htpasswd', ['-Bbn', auth.username, auth.password]);
    await writeFile(join(dir, 'htpasswd'), `${stdout.trim()}\n`);
    authConfig = `auth:\n  htpasswd:\n    realm: forkpoint-test\n    path: ${join(dir, 'htpasswd')}\n`;
  }
  await writeFile(
    join(dir, 'config.yml'),
    `version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: ${join(dir, 'data')}\nhttp:\n  addr: ${host}\n${authConfig}`,
  );
  let output = '';
  const child: ChildProcess = spawn('docker-registry', ['serve', join(dir, 'config.yml')], { stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout!.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (output += d.toString()));
  const close = async () => {
    if (child.exitCode === null) {
      child.kill('SIGKILL');
      await new Promise((r) => child.once('exit', r));
    }
    await rm(dir, { recursive: true, force: true });
  };
  // Up when /v2/ answers (200, or 401 behind credentials); 15 s at most.
  const until = Date.now() + 15_000;
  for (;;) {
    const status = await fetch(`http://${host}/v2/`).then((r) => r.status, () => 0);
    if (status === 200 || status === 401) break;
    if (Date.now() > until || child.exitCode !== null) {
      await close();
      throw new Error(`the registry did not start: ${output.slice(-2000)}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    host,
    dir,
    log: () => output,
    blobFile: (digest) => {
      const hex = digest.slice('sha256:'.length);
      return join(dir, 'data/docker/registry/v2/blobs/sha256', hex.slice(0, 2), hex, 'data');
    },
    close,
  };
}

const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

/** One layer: a gzipped tar of a directory's contents (a seed image's: see layerFile on tar's
 * exit status 1). */
export async function layerOf(dir: string): Promise<Buffer> {
  const r = await execa('tar', ['-C', dir, '--numeric-owner', '--warning=no-file-changed', '-cf', '-', '.'], { encoding: 'buffer', maxBuffer: 512 * 1024 * 1024, reject: false });
  if (r.exitCode !== 0 && r.exitCode !== 1) throw new Error(`tar of ${dir}: ${Buffer.from(r.stderr).toString()}`);
  return gzipSync(Buffer.from(r.stdout));
}

/** A large layer: an uncompressed tar of a directory, written to a file (never held in memory). */
export async function layerFile(dir: string, file: string, exclude: readonly string[] = []): Promise<{ file: string }> {
  // A seed image is hard-linked into the data directories of the servers that run meanwhile: a
  // link made or removed changes a file's ctime, never its bytes, and GNU tar then says "file
  // changed as we read it" and exits 1 (2 is a real failure).
  const r = await execa('tar', ['-C', dir, '--numeric-owner', '--warning=no-file-changed', ...exclude.map((e) => `--exclude=${e}`), '-cf', file, '.'], { reject: false });
  if (r.exitCode !== 0 && r.exitCode !== 1) throw new Error(`tar of ${dir}: ${r.stderr}`);
  return { file };
}

/** What of the Debian image only the code interpreter uses (its R and JDK, a quarter of the
 * image's bytes): tests that copy the image around for its own sake leave them out. */
export const CODE_INTERPRETER_ONLY = ['./usr/lib/jvm', './usr/lib/R', './usr/share/R'] as const;

/**
 * An OCI image layout at `dir` (tag `tag`) of these layers (gzipped tars in memory, or tar files;
 * oldest first) and this container configuration, written by hand as the spec says; answers the
 * manifest's digest.
 */
export async function writeOciLayout(dir: string, tag: string, layers: (Buffer | { file: string })[], config: Record<string, unknown>, architecture = 'amd64'): Promise<string> {
  await mkdir(join(dir, 'blobs/sha256'), { recursive: true });
  const put = async (b: Buffer) => {
    const d = sha(b);
    await writeFile(join(dir, 'blobs/sha256', d.slice(7)), b);
    return d;
  };
  const { gunzipSync } = await import('node:zlib');
  const { rename, stat } = await import('node:fs/promises');
  const descriptors: { mediaType: string; digest: string; size: number; diffId: string }[] = [];
  for (const l of layers) {
    if (Buffer.isBuffer(l)) {
      descriptors.push({ mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', digest: await put(l), size: l.length, diffId: sha(gunzipSync(l)) });
    } else {
      const digest = `sha256:${(await execa('sha256sum', [l.file])).stdout.split(' ')[0]}`;
      const size = (await stat(l.file)).size;
      await rename(l.file, join(dir, 'blobs/sha256', digest.slice(7)));
      descriptors.push({ mediaType: 'application/vnd.oci.image.layer.v1.tar', digest, size, diffId: digest });
    }
  }
  const configBlob = Buffer.from(
    JSON.stringify({
      architecture,
      os: 'linux',
      config,
      rootfs: { type: 'layers', diff_ids: descriptors.map((d) => d.diffId) },
    }),
  );
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: await put(configBlob), size: configBlob.length },
      layers: descriptors.map(({ mediaType, digest, size }) => ({ mediaType, digest, size })),
    }),
  );
  const digest = await put(manifest);
  await writeFile(join(dir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  await writeFile(
    join(dir, 'index.json'),
    JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', digest, size: manifest.length, annotations: { 'org.opencontainers.image.ref.name': tag } }] }),
  );
  return digest;
}

/** Pushes an OCI layout's tag to a registry with skopeo, as a user's `docker push` would. */
export async function push(layout: string, tag: string, target: string, auth?: { username: string; password: string }): Promise<void> {
  await execa('skopeo', ['--insecure-policy', 'copy', '--quiet', '--dest-tls-verify=false', ...(auth ? ['--dest-creds', `${auth.username}:${auth.password}`] : []), `oci:${layout}:${tag}`, `docker://${target}`]);
}

/**
 * A multi-platform image at `dir` (tag `tag`): an OCI image index over one image per
 * architecture, as `docker buildx` pushes them; answers the index's digest and each image's.
 */
export async function writeOciIndex(dir: string, tag: string, images: { architecture: string; layers: Buffer[]; config: Record<string, unknown> }[]): Promise<{ index: string; images: Record<string, string> }> {
  const { stat } = await import('node:fs/promises');
  const entries = [];
  const digests: Record<string, string> = {};
  for (const i of images) {
    const digest = await writeOciLayout(dir, `${tag}-${i.architecture}`, i.layers, i.config, i.architecture);
    digests[i.architecture] = digest;
    const size = (await stat(join(dir, 'blobs/sha256', digest.slice(7)))).size;
    entries.push({ mediaType: 'application/vnd.oci.image.manifest.v1+json', digest, size, platform: { os: 'linux', architecture: i.architecture } });
  }
  const index = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests: entries }));
  const digest = sha(index);
  await writeFile(join(dir, 'blobs/sha256', digest.slice(7)), index);
  await writeFile(join(dir, 'index.json'), JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: 'application/vnd.oci.image.index.v1+json', digest, size: index.length, annotations: { 'org.opencontainers.image.ref.name': tag } }] }));
  return { index: digest, images: digests };
}

/** Pushes every platform of a layout's multi-platform tag (`skopeo copy --all`). */
export async function pushAll(layout: string, tag: string, target: string): Promise<void> {
  await execa('skopeo', ['--insecure-policy', 'copy', '--all', '--quiet', '--dest-tls-verify=false', `oci:${layout}:${tag}`, `docker://${target}`]);
}
