import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { lstat, mkdir, mkdtemp, readdir, readFile, readlink, rm } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { PassThrough, Transform, type Readable, type Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createRequire } from 'node:module';
import type { Ignore } from '@balena/dockerignore';
import { execa } from 'execa';
import picomatch from 'picomatch';
import { ArchiveRefusedError, checkArchive } from '../../lib/archive-bounds.js';
import { DockerfileError, ForkpointError, InvalidRequestError, PayloadTooLargeError } from '../errors.js';
import { heldErrors } from '../../lib/held-error.js';

const MAX_ENTRIES = 200_000;

/** What a build context may unpack to, checked before anything is unpacked. */
export interface ContextBounds {
  /** Bytes sent. */
  maxSent: number;
  /** Bytes of its tar stream decompressed (what unpacking writes, at most). */
  maxUnpacked: number;
  maxEntries: number;
  /** Refuses (507) when the disk has no room for `bytes` more. */
  room: (bytes: number) => Promise<void>;
}

/** Files, directories and links: no devices or fifos from a client onto the host. */
const CONTEXT_MEMBERS = ['file', 'directory', 'symlink', 'link'] as const;
// A CommonJS module whose typings say `export default` (Babel's shape): required as it is.
const dockerignore = (createRequire(import.meta.url)('@balena/dockerignore') as { default: () => Ignore }).default;

export interface ContextEntry {
  /** Relative to the context, '/'-separated, no leading './' ('' is the context itself). */
  rel: string;
  type: 'file' | 'dir' | 'symlink';
  mode: number;
}

/**
 * A build context: a directory on the host (unpacked from what the client sent), read without
 * ever following a symlink: a link in the context is copied as a link, never through. What
 * `.dockerignore` names is not there for COPY.
 */
export class BuildContext {
  private entries: Map<string, ContextEntry> | undefined;

  constructor(readonly dir: string) {}

  /** Unpacks a tar (gzip, xz, bzip2, zstd or none) a client sent into a new directory under
   * `parent`; `dispose` removes it. It is read through once first (archive-bounds.ts): past
   * the bounds on what it unpacks to, or with a sparse member or a device, it is refused and
   * nothing is unpacked. GNU tar then keeps members inside (no absolute names, no `..`, links
   * made last); owners are not kept. */
  static async unpack(source: Readable, parent: string, bounds: ContextBounds): Promise<BuildContext> {
    await mkdir(parent, { recursive: true, mode: 0o700 });
    const dir = await mkdtemp(join(parent, 'ctx-'));
    let bytes = 0;
    const limited = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        bytes += chunk.length;
        if (bytes > bounds.maxSent) cb(new PayloadTooLargeError(`the build context is larger than ${bounds.maxSent} bytes`, { reason: 'CONTEXT_TOO_LARGE' }));
        else cb(null, chunk);
      },
    });
    // Kept whole first: tar tells a compressed archive from a plain one only in a file.
    const archive = `${dir}.tar`;
    try {
      await pipeline(source, limited, createWriteStream(archive, { mode: 0o600 }));
      const found = await checkArchive(archive, { maxBytes: bounds.maxUnpacked, maxEntries: bounds.maxEntries, types: CONTEXT_MEMBERS }).catch((err: unknown) => {
        if (!(err instanceof ArchiveRefusedError)) throw err;
        const details = { reason: err.reason };
        if (err.reason === 'UNPACKED_TOO_LARGE' || err.reason === 'TOO_MANY_ENTRIES') throw new PayloadTooLargeError(`the build context is refused: ${err.message}`, details);
        throw new InvalidRequestError(`the build context is refused: ${err.message}`, details, { cause: err });
      });
      await bounds.room(found.bytes);
      const r = await execa('tar', ['-x', '-f', archive, '--no-same-owner', '-C', dir], { reject: false });
      if (r.exitCode !== 0) throw new InvalidRequestError(`the build context is not a tar archive: ${r.stderr.trim().split('\n')[0]}`);
    } catch (err) {
      await rm(dir, { recursive: true, force: true });
      throw err instanceof ForkpointError ? err : new InvalidRequestError(`the build context could not be read: ${(err as Error).message}`);
    } finally {
      await rm(archive, { force: true });
    }
    return new BuildContext(dir);
  }

  async dispose(): Promise<void> {
    await rm(this.dir, { recursive: true, force: true });
  }

  private async walk(): Promise<Map<string, ContextEntry>> {
    if (this.entries) return this.entries;
    const patterns = ((await this.readFile('.dockerignore', 1 << 20).catch(() => undefined))?.toString('utf8') ?? '')
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l && !l.startsWith('#'));
    const ig = dockerignore().add(patterns);
    const out = new Map<string, ContextEntry>([['', { rel: '', type: 'dir', mode: 0o755 }]]);
    const visit = async (rel: string): Promise<void> => {
      for (const name of await readdir(join(this.dir, rel))) {
        const child = rel ? `${rel}/${name}` : name;
        if (ig.ignores(child)) continue;
        const st = await lstat(join(this.dir, child));
        const type = st.isSymbolicLink() ? 'symlink' : st.isDirectory() ? 'dir' : st.isFile() ? 'file' : undefined;
        if (!type) continue; // devices, sockets and fifos are not copied
        if (out.size >= MAX_ENTRIES) throw new DockerfileError(`the build context has more than ${MAX_ENTRIES} entries`, null);
        out.set(child, { rel: child, type, mode: st.mode & 0o7777 });
        if (type === 'dir') await visit(child);
      }
    };
    await visit('');
    this.entries = out;
    return out;
  }

  /** A regular file of the context (a link is refused, never followed), up to `max` bytes. */
  async readFile(rel: string, max: number): Promise<Buffer> {
    const norm = posix.normalize(rel).replace(/^(\.\/|\/)+/, '');
    if (norm.startsWith('..')) throw new DockerfileError(`${rel} is outside the build context`, null);
    let cur = this.dir;
    for (const part of norm.split('/')) {
      cur = join(cur, part);
      const st = await lstat(cur).catch(() => undefined);
      if (!st) throw new DockerfileError(`${rel} is not in the build context`, null);
      if (st.isSymbolicLink()) throw new DockerfileError(`${rel} is a symbolic link; it is not followed`, null);
    }
    const st = await lstat(cur);
    if (!st.isFile()) throw new DockerfileError(`${rel} is not a file`, null);
    if (st.size > max) throw new DockerfileError(`${rel} is larger than ${max} bytes`, null);
    return readFile(cur);
  }

  /** The entries a COPY source names (a path or a glob), each a root to copy. */
  async match(source: string, line: number | null): Promise<ContextEntry[]> {
    const entries = await this.walk();
    const rel = posix.normalize(source).replace(/^(\.\/|\/)+/, '').replace(/\/+$/, '');
    const key = rel === '.' ? '' : rel;
    if (picomatch.scan(key).isGlob) {
      const isMatch = picomatch(key, { dot: true });
      const found = [...entries.values()].filter((e) => e.rel && isMatch(e.rel));
      if (found.length === 0) throw new DockerfileError(`no file in the build context matches ${source}`, line);
      return found;
    }
    const e = entries.get(key);
    if (!e) throw new DockerfileError(`${source} is not in the build context (or .dockerignore leaves it out)`, line);
    return [e];
  }

  /** Everything under a root (itself included), in a stable order. */
  async under(root: ContextEntry): Promise<ContextEntry[]> {
    const entries = await this.walk();
    if (root.type !== 'dir') return [root];
    const prefix = root.rel ? `${root.rel}/` : '';
    return [...entries.values()].filter((e) => e.rel === root.rel || e.rel.startsWith(prefix)).sort((a, b) => (a.rel < b.rel ? -1 : 1));
  }

  /** A hash of the names, kinds, modes and contents under the roots: a COPY's cache key. */
  async hash(roots: ContextEntry[]): Promise<string> {
    const h = createHash('sha256');
    for (const root of roots) {
      for (const e of await this.under(root)) {
        h.update(`${e.rel}\0${e.type}\0${e.mode}\0`);
        if (e.type === 'symlink') h.update(await readlink(join(this.dir, e.rel)));
        if (e.type === 'file') for await (const chunk of createReadStream(join(this.dir, e.rel))) h.update(chunk as Buffer);
        h.update('\0');
      }
    }
    return h.digest('hex');
  }

  /** A tar of a root: a directory's contents (relative to it, .dockerignore applied), or a
   * file or link by its own name. GNU tar archives links as links. */
  async pack(root: ContextEntry): Promise<Readable> {
    const base = root.type === 'dir' ? join(this.dir, root.rel) : join(this.dir, posix.dirname(root.rel));
    const names = root.type === 'dir' ? (await this.under(root)).filter((e) => e.rel !== root.rel).map((e) => (root.rel ? e.rel.slice(root.rel.length + 1) : e.rel)) : [posix.basename(root.rel)];
    const child = spawn('tar', ['-c', '-f', '-', '--no-recursion', '--numeric-owner', '--owner=0', '--group=0', '-C', base, '--null', '-T', '-'], { stdio: ['pipe', 'pipe', 'ignore'] });
    child.stdin.end(names.map((n) => `${n}\0`).join(''));
    return ownedOutput(child);
  }

  /** The raw bytes of a file (ADD of a local archive is unpacked inside the sandbox). */
  raw(root: ContextEntry): Readable {
    return heldErrors(createReadStream(join(this.dir, root.rel)));
  }
}

/**
 * A child's stdout as a stream that keeps every byte until it is read. Node resumes (and so
 * drops) the output of a child that exits while nobody listens to it: a small archive read a
 * moment later would come out empty. Piped at once, it is kept. A failed tar shows as a short
 * archive, which the reading tar refuses.
 */
export function ownedOutput(child: ChildProcessByStdio<Writable | null, Readable, null>): Readable {
  const out = heldErrors(new PassThrough());
  child.stdout.pipe(out);
  child.on('error', (err) => out.destroy(err));
  return out;
}
