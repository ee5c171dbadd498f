import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import type { Logger } from 'pino';
import { ENOENT, MAX_METADATA_ENTRIES, METADATA_KEY, METADATA_VALUE, type AgentPort, type DirEntry, type FileStat, type OwnerModeChange, type UnixIds } from '../seam/agent.js';
import { AgentError } from '../seam/errors.js';
import type { SandboxHandle } from '../seam/sandbox.js';
import { engineFailure } from './engine-failure.js';
import { ConflictError, ForkpointError, InsufficientStorageError, InvalidRequestError, NotFoundError, PayloadTooLargeError } from './errors.js';
import type { SandboxAccess } from './access.js';
import type { FileHosts } from './file-hosts.js';
import { DirectoryWatch } from './file-watch.js';
import { watchesTold } from './file-watch.js';
import { uploadNameFor } from './upload-names.js';
import { idNames, isRoot, lookupUser, UnknownUserError, type IdNames, type SandboxUser } from './users.js';

export const MAX_FILE_BYTES = 8 * 1024 * 1024 - 4096;
/** Files are streamed to and from a sandbox in pieces of this size (a frame holds 8 MiB). */
const PIECE = 4 << 20;
const EINVAL = 22;
const EISDIR = 21;
const EACCES = 13;
const EPERM = 1;
const ENOSPC = 28;
const EDQUOT = 122;

export interface FileInfo extends FileStat {
  path: string;
}

/** Who a file operation is for: a user of the sandbox by name (or uid), or as already looked up
 * (a caller making many operations reads the account files once), whose permissions it is
 * checked against and who owns what it makes; the sandbox's root when absent. */
export interface AsUser {
  user?: string | SandboxUser | undefined;
}

/** An instance's files: its sandbox's agent, in the sandbox's own root. */
export const instanceFileHosts = (access: SandboxAccess): FileHosts => ({ host: async (owner, id) => (await access.sandbox(owner, id)).sb });

/** Files inside an instance (or a volume). Every operation is done by an agent inside the
 * sandbox's own root (or the volume's): the host never opens a path a sandbox could have
 * redirected with a symlink. Large files go both ways in pieces, so that no file is ever whole
 * in the server's memory. `access`, for instances, is what watches need. */
export class FileService {
  constructor(
    private readonly hosts: FileHosts,
    private readonly log: Logger,
    private readonly access?: SandboxAccess,
  ) {}

  private path(p: string): string {
    if (!p.startsWith('/') || p.includes('\0')) throw new InvalidRequestError('path must be absolute', { path: p });
    return p;
  }

  /** Runs one file operation on the instance's agent, with agent errors as API errors; `as`,
   * a user's name, becomes its ids (read in the same call) for `fn` to hand the agent. */
  private async op<T>(owner: string, id: string, path: string, fn: (agent: AgentPort, path: string, as: UnixIds | undefined) => Promise<T>, as?: AsUser): Promise<T> {
    const p = this.path(path);
    try {
      const host = await this.hosts.host(owner, id);
      return await host.call(async (agent) => fn(agent, p, await this.idsOf(agent, as?.user)));
    } catch (err) {
      throw this.failed(err, path);
    }
  }

  private async idsOf(agent: AgentPort, user: string | SandboxUser | undefined): Promise<UnixIds | undefined> {
    if (user === undefined || user === 'root') return undefined;
    const u = typeof user === 'string' ? await lookupUser(agent, user) : user;
    return isRoot(u) ? undefined : u;
  }

  /** The instance's user of that name (or uid); `orRoot`: root when it has none (an image
   * made without it). */
  async user(owner: string, id: string, name: string, opts: { orRoot?: boolean } = {}): Promise<SandboxUser> {
    try {
      return await this.op(owner, id, '/', (a) => lookupUser(a, name));
    } catch (err) {
      if (err instanceof UnknownUserError && opts.orRoot) return this.op(owner, id, '/', (a) => lookupUser(a, 'root'));
      throw err;
    }
  }

  /** The names of the instance's users and groups, to tell owners by (FileStat's uid, gid). */
  async idNames(owner: string, id: string): Promise<IdNames> {
    return this.op(owner, id, '/', (a) => idNames(a));
  }

  private failed(err: unknown, path: string): Error {
    if (err instanceof UnknownUserError) return err;
    if (err instanceof AgentError) {
      if (err.errno === ENOENT) return new NotFoundError('file', path);
      if (err.errno === EACCES || err.errno === EPERM) return new PermissionDeniedError(path, err.message, err);
      if (err.errno === EISDIR) return new InvalidRequestError(`${path} is a directory`, { path });
      if (err.errno === ENOSPC || err.errno === EDQUOT) return new InsufficientStorageError(`no space left under ${path}: its volume, or the instance's disk limit, is full`, { cause: err });
      if (err.errno === EINVAL && /unknown frame type/.test(err.message)) {
        return new ConflictError('this instance runs an agent older than this operation; stop and start the instance to update it', { path });
      }
      return new InvalidRequestError(`${path}: ${err.message}`, { path, errno: err.errno });
    }
    const mapped = engineFailure(err);
    if (!(mapped instanceof ForkpointError)) this.log.error({ err, path }, 'file operation failed');
    return mapped;
  }

  /** A whole file, up to MAX_FILE_BYTES (for callers that want it in one piece). */
  async read(owner: string, id: string, path: string, as?: AsUser): Promise<Buffer> {
    const file = await this.op(owner, id, path, (a, p, ids) => a.readFile(p, MAX_FILE_BYTES, 0, ids), as);
    if (!file) throw new NotFoundError('file', path);
    if (file.truncated) throw new PayloadTooLargeError(`${path} is larger than ${MAX_FILE_BYTES} bytes`);
    return file.data;
  }

  /**
   * A file of any size as a stream of pieces, and `size`, the length the answer may announce:
   * the stream yields exactly that many bytes or fails (the caller's connection then closes), so
   * no byte the sandbox chose after the announced end can reach a connection a client reuses. A
   * file read whole in its first piece announces what was read (a procfs file's `stat` says 0);
   * a longer one announces its `stat` size, is cut there if it grew, and fails if it shrank. A
   * size that cannot be trusted (none, or smaller than the first piece) is announced as none.
   */
  async readStream(owner: string, id: string, path: string, as?: AsUser): Promise<{ size: number | undefined; stream: Readable }> {
    const info = await this.stat(owner, id, path, as).catch((err: unknown) => {
      if (err instanceof ConflictError) return undefined; // an older agent: no stat, read anyway
      throw err;
    });
    if (info?.type === 'dir') throw new InvalidRequestError(`${path} is a directory`, { path });
    const { first, ids } = await this.op(owner, id, path, async (a, p, ids) => ({ first: await a.readFile(p, PIECE, 0, ids), ids }), as);
    if (!first) throw new NotFoundError('file', path);
    if (!first.truncated) return { size: first.data.length, stream: Readable.from([first.data], { objectMode: false }) };
    const size = info?.type === 'file' && info.size >= first.data.length ? info.size : undefined;
    const host = await this.hosts.host(owner, id);
    const p = this.path(path);
    const fail = (err: unknown) => this.failed(err, path);
    async function* pieces(): AsyncGenerator<Buffer> {
      const limit = size ?? Infinity;
      yield first!.data;
      let offset = first!.data.length;
      for (let truncated = true; truncated && offset < limit; ) {
        const want = Math.min(PIECE, limit - offset);
        const piece = await host.call((a) => a.readFile(p, want, offset, ids)).catch((err: unknown) => {
          throw fail(err);
        });
        if (!piece || piece.data.length === 0) break;
        // The agent is the sandbox's: never more than was asked, whatever it sends.
        const data = piece.data.length > want ? piece.data.subarray(0, want) : piece.data;
        yield data;
        offset += data.length;
        truncated = piece.truncated;
      }
      if (offset < limit && size !== undefined) throw new FileChangedError(path, size, offset);
    }
    return { size, stream: Readable.from(pieces(), { objectMode: false }) };
  }

  /** Writes a whole file, making its parent directories. */
  async write(owner: string, id: string, path: string, data: Buffer, mode = 0o644, as?: AsUser): Promise<void> {
    if (data.length > MAX_FILE_BYTES) throw new PayloadTooLargeError(`files are written up to ${MAX_FILE_BYTES} bytes at a time`);
    await this.op(owner, id, path, async (a, p, ids) => {
      const parent = p.slice(0, p.lastIndexOf('/'));
      if (parent) await a.mkdir(parent, ids);
      await a.writeFile(p, data, mode, ids);
    }, as);
  }

  /**
   * Writes a file of any size from a stream, a piece at a time, into a temporary name beside
   * it, renamed over the path once whole: a reader never sees half a file, and a failed upload
   * leaves nothing. Makes the parent directories.
   */
  async writeStream(owner: string, id: string, path: string, source: AsyncIterable<Buffer>, opts: { metadata?: Record<string, string>; mode?: number } & AsUser = {}): Promise<{ bytes: number }> {
    const p = this.path(path);
    const metadata = Object.entries(opts.metadata ?? {});
    if (metadata.length > MAX_METADATA_ENTRIES) throw new InvalidRequestError(`at most ${MAX_METADATA_ENTRIES} metadata entries`, { path });
    for (const [k, v] of metadata) {
      if (!METADATA_KEY.test(k) || !METADATA_VALUE.test(v)) throw new InvalidRequestError(`metadata ${JSON.stringify(k)}: a key of HTTP token characters (at most 128) and a value of printable ASCII (at most 1024)`, { path, key: k });
    }
    const slash = p.lastIndexOf('/');
    const parent = p.slice(0, slash);
    let tmp = '';
    let offset = 0;
    let pending: Buffer[] = [];
    let pendingBytes = 0;
    let written = false;
    let ids: UnixIds | undefined;
    // Failures name the caller's path, not the temporary one.
    const flush = () =>
      this.op(owner, id, path, (a) => {
        const data = Buffer.concat(pending, pendingBytes);
        return a.writeAt(tmp, offset, data, { truncate: !written, mode: opts.mode ?? 0o644 }, ids).then(() => {
          offset += data.length;
          written = true;
          pending = [];
          pendingBytes = 0;
        });
      });
    try {
      let fresh: boolean;
      [ids, fresh] = await this.op(owner, id, parent || '/', async (a, d, as) => {
        if (parent) await a.mkdir(d, as);
        // Only a file known to be missing is new (a stat refused for permissions is not).
        return [as, (await a.stat(p, as).catch(() => null)) === undefined] as const;
      }, opts);
      tmp = `${parent}/${uploadNameFor(p.slice(slash + 1), fresh)}`;
      for await (const chunk of uploadOf(source, path)) {
        pending.push(chunk);
        pendingBytes += chunk.length;
        if (pendingBytes >= PIECE) await flush();
      }
      if (pendingBytes || !written) await flush();
      // On the whole file before it takes the name: a file written over loses the old metadata.
      if (metadata.length) await this.op(owner, id, path, (a) => a.setMetadata(tmp, Object.fromEntries(metadata), ids));
      const host = await this.hosts.host(owner, id);
      await watchesTold(host, tmp, () => this.op(owner, id, path, (a) => a.rename(tmp, p, ids)));
      return { bytes: offset };
    } catch (err) {
      if (written) await this.op(owner, id, tmp, (a) => a.removeFile(tmp, ids)).catch(() => {});
      throw err instanceof ForkpointError ? err : this.failed(err, path);
    }
  }

  async stat(owner: string, id: string, path: string, as?: AsUser): Promise<FileInfo> {
    const st = await this.op(owner, id, path, (a, p, ids) => a.stat(p, ids), as);
    if (!st) throw new NotFoundError('file', path);
    return { path, ...st };
  }

  async remove(owner: string, id: string, path: string, as?: AsUser): Promise<void> {
    await this.op(owner, id, path, (a, p, ids) => a.removeFile(p, ids), as);
  }

  /**
   * Removes a path and, for a directory, everything under it, by the agent's own operations one
   * entry at a time (for a host with no processes to run `rm -rf`: a volume's). A link is
   * removed, never followed; at most `limit` entries.
   */
  async removeAll(owner: string, id: string, path: string, limit = 100_000): Promise<void> {
    let left = limit;
    const walk = async (p: string): Promise<void> => {
      if (--left < 0) throw new InvalidRequestError(`more than ${limit} entries under ${path}: remove them in parts`, { path });
      const st = await this.op(owner, id, p, (a, q) => a.stat(q));
      if (!st) return;
      if (st.type === 'dir') for (const e of await this.list(owner, id, p)) await walk(p === '/' ? `/${e.name}` : `${p}/${e.name}`);
      await this.remove(owner, id, p);
    };
    await walk(this.path(path));
  }

  async list(owner: string, id: string, path: string, as?: AsUser): Promise<DirEntry[]> {
    return this.op(owner, id, path, (a, p, ids) => a.listDir(p, ids), as);
  }

  /** Watches a directory of the instance (envd's watchDir): resolves once the watch is in
   * place; close it, or abort `signal`, to end it. */
  async watch(owner: string, id: string, path: string, opts: { recursive: boolean; signal?: AbortSignal }): Promise<DirectoryWatch> {
    const p = this.path(path);
    const access = this.access;
    if (!access) throw new InvalidRequestError('only an instance\'s directories are watched', { path });
    let sb: SandboxHandle;
    try {
      ({ sb } = await access.sandbox(owner, id));
    } catch (err) {
      throw this.failed(err, path);
    }
    return DirectoryWatch.open({ sb, stillLive: () => access.stillLive(id, sb), failed: (err) => this.failed(err, path) }, p, opts);
  }

  /** Renames a file or directory inside the instance (the agent does it, in its own root). */
  async move(owner: string, id: string, from: string, to: string, as?: AsUser): Promise<void> {
    this.path(to);
    await this.op(owner, id, from, (a, p, ids) => a.rename(p, to, ids), as);
  }

  async mkdir(owner: string, id: string, path: string, as?: AsUser): Promise<void> {
    await this.op(owner, id, path, (a, p, ids) => a.mkdir(p, ids), as);
  }

  /** A new owner or mode for what is at `path` (root's doing: a user's file operation cannot). */
  async setOwnerMode(owner: string, id: string, path: string, change: OwnerModeChange): Promise<void> {
    await this.op(owner, id, path, (a, p) => a.setOwnerMode(p, change));
  }
}

/** The upload's bytes; its own failure (its client went away) is its client's, not the server's. */
async function* uploadOf(source: AsyncIterable<Buffer>, path: string): AsyncIterable<Buffer> {
  try {
    for await (const chunk of source) yield chunk;
  } catch (err) {
    throw new InvalidRequestError(`the upload of ${path} ended before its end: ${(err as Error).message}`, { path }, { cause: err });
  }
}

/** The user a file operation was for may not do it (EACCES, EPERM in the sandbox). */
export class PermissionDeniedError extends ForkpointError {
  override readonly name = 'PermissionDeniedError';
  constructor(path: string, why: string, cause: unknown) {
    super('FORBIDDEN', `${path}: permission denied (${why})`, { reason: 'PERMISSION_DENIED', path }, { cause });
  }
}

/** A file shrank while it was streamed past its announced length: the answer is cut short and
 * its connection closed, never padded or left for the next answer to finish. */
export class FileChangedError extends ConflictError {
  constructor(path: string, announced: number, sent: number) {
    super(`${path} shrank while it was read: ${sent} of the ${announced} bytes announced`, { path, announced, sent });
  }
}
