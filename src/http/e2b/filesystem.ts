import { posix } from 'node:path';
import { Code, ConnectError, type ServiceImpl } from '@connectrpc/connect';
import { timestampFromMs } from '@bufbuild/protobuf/wkt';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { FileInfo } from '../../core/files.js';
import { callerOf, envdPath, type SandboxCaller } from './caller.js';
import { FileType, Filesystem, type EntryInfo } from './gen/filesystem/filesystem_pb.js';
import { connectError } from './process.js';

const MAX_DEPTH = 8;
const MAX_ENTRIES = 10_000;

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

/** envd's filesystem service over the core's file service (every path resolved by the agent in
 * the sandbox's own root). Watching is not served. */
export function filesystemService(fp: Forkpoint): ServiceImpl<typeof Filesystem> {
  const stat = async (c: SandboxCaller, path: string) => entryInfo(path, await fp.files.stat(c.owner, c.id, path));
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
        for (const e of await guard(fp.files.list(c.owner, c.id, dir))) {
          if (entries.length >= MAX_ENTRIES) return;
          const path = posix.join(dir, e.name);
          const info = await fp.files.stat(c.owner, c.id, path).catch(() => undefined);
          if (!info) continue;
          entries.push(entryInfo(path, info));
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
      const path = envdPath(req.path);
      const st = await guard(fp.files.stat(c.owner, c.id, path));
      if (st.type === 'dir') {
        const r = await guard(fp.commands.exec(c.owner, c.id, { command: ['rm', '-rf', '--', path] }));
        if (r.exitCode !== 0) throw new ConnectError(`could not remove ${path}`, Code.Internal);
      } else {
        await guard(fp.files.remove(c.owner, c.id, path));
      }
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
