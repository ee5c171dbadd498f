import { posix } from 'node:path';
import { Code, ConnectError, type ServiceImpl } from '@connectrpc/connect';
import { timestampFromMs } from '@bufbuild/protobuf/wkt';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { FileInfo } from '../../core/files.js';
import { callerOf, envdPath, type SandboxCaller } from './caller.js';
import { FileType, Filesystem, type EntryInfo } from './gen/filesystem/filesystem_pb.js';
import { connectError } from './process.js';
import { removeTree } from '../remove-tree.js';

const MAX_DEPTH = 8;
const MAX_ENTRIES = 10_000;
/** Links followed to tell what a link points to (the kernel's own bound is 40). */
const MAX_LINK_HOPS = 8;

const TYPE: Record<FileInfo['type'], FileType> = { file: FileType.FILE, dir: FileType.DIRECTORY, link: FileType.SYMLINK, other: FileType.UNSPECIFIED };

function permissions(type: FileInfo['type'], mode: number): string {
  const bits = 'rwxrwxrwx'.split('').map((ch, i) => (mode & (1 << (8 - i)) ? ch : '-')).join('');
  return `${type === 'dir' ? 'd' : type === 'link' ? 'L' : '-'}${bits}`;
}

export function entryInfo(path: string, st: Pick<FileInfo, 'type' | 'size' | 'mode' | 'mtimeMs' | 'target'>): EntryInfo {
  return {
    $typeName: 'filesystem.EntryInfo',
    name: posix.basename(path),
    type: TYPE[st.type],
    path,
    size: BigInt(st.size),
    mode: st.mode,
    permissions: permissions(st.type, st.mode),
    owner: 'root',
    group: 'root',
    modifiedTime: timestampFromMs(st.mtimeMs),
    ...(st.target !== null ? { symlinkTarget: st.target } : {}),
    metadata: {},
  };
}

/** Where a link points, as envd says it: an absolute path, a relative target taken from the
 * link's own directory. */
export function linkTarget(path: string, target: string): string {
  return posix.isAbsolute(target) ? posix.normalize(target) : posix.join(posix.dirname(path), target);
}

/** Go's `sort.Strings` order (bytes), which envd's directory walk lists in. */
const byName = (a: { name: string }, b: { name: string }) => Buffer.compare(Buffer.from(a.name), Buffer.from(b.name));

/** envd's filesystem service over the core's file service (every path resolved by the agent in
 * the sandbox's own root). Watching is not served. */
export function filesystemService(fp: Forkpoint): ServiceImpl<typeof Filesystem> {
  /** A link is described as envd does: the type of what it points to (a link's own when that
   * is missing), its target as an absolute path. */
  const describe = async (c: SandboxCaller, path: string, st: FileInfo) => {
    if (st.type !== 'link' || st.target === null) return entryInfo(path, st);
    let target = linkTarget(path, st.target);
    let pointed: FileInfo | undefined;
    for (let hops = 0; hops < MAX_LINK_HOPS; hops++) {
      pointed = await fp.files.stat(c.owner, c.id, target).catch(() => undefined);
      if (pointed?.type !== 'link' || pointed.target === null) break;
      target = linkTarget(target, pointed.target);
    }
    return entryInfo(path, { ...st, type: pointed && pointed.type !== 'link' ? pointed.type : 'link', target });
  };
  const stat = async (c: SandboxCaller, path: string) => describe(c, path, await fp.files.stat(c.owner, c.id, path));
  const guard = <T>(p: Promise<T>) => p.catch((err: unknown) => Promise.reject(connectError(err)));
  const unsupported = () => Promise.reject(new ConnectError('watching directories is not supported by forkpoint', Code.Unimplemented));

  return {
    async stat(req, ctx) {
      const c = callerOf(ctx);
      return { entry: await guard(stat(c, envdPath(req.path))) };
    },
    async makeDir(req, ctx) {
      const c = callerOf(ctx);
      const path = envdPath(req.path);
      const exists = await fp.files.stat(c.owner, c.id, path).then(() => true, () => false);
      if (exists) throw new ConnectError(`${path} already exists`, Code.AlreadyExists);
      await guard(fp.files.mkdir(c.owner, c.id, path));
      return { entry: await guard(stat(c, path)) };
    },
    async move(req, ctx) {
      const c = callerOf(ctx);
      const to = envdPath(req.destination);
      await guard(fp.files.move(c.owner, c.id, envdPath(req.source), to));
      return { entry: await guard(stat(c, to)) };
    },
    async listDir(req, ctx) {
      const c = callerOf(ctx);
      const root = envdPath(req.path);
      const depth = Math.min(Math.max(req.depth || 1, 1), MAX_DEPTH);
      const entries: EntryInfo[] = [];
      const walk = async (dir: string, level: number): Promise<void> => {
        for (const e of (await guard(fp.files.list(c.owner, c.id, dir))).sort(byName)) {
          if (entries.length >= MAX_ENTRIES) return;
          const path = posix.join(dir, e.name);
          const info = await fp.files.stat(c.owner, c.id, path).catch(() => undefined);
          if (!info) continue;
          entries.push(await describe(c, path, info));
          if (e.type === 'dir' && level < depth) await walk(path, level + 1);
        }
      };
      const top = await guard(fp.files.stat(c.owner, c.id, root));
      if (top.type !== 'dir') throw new ConnectError(`${root} is not a directory`, Code.InvalidArgument);
      await walk(root, 1);
      return { entries };
    },
    async remove(req, ctx) {
      const c = callerOf(ctx);
      await guard(removeTree(fp, c.owner, c.id, envdPath(req.path)));
      return {};
    },
    watchDir: async function* () {
      yield* [];
      await unsupported();
    },
    createWatcher: unsupported,
    getWatcherEvents: unsupported,
    removeWatcher: unsupported,
  };
}
