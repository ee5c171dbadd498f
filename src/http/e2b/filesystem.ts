import { randomUUID } from 'node:crypto';
import { posix } from 'node:path';
import { Code, ConnectError, type ServiceImpl } from '@connectrpc/connect';
import { timestampFromMs } from '@bufbuild/protobuf/wkt';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { FileInfo } from '../../core/files.js';
import { callerOf, envdPath, type SandboxCaller } from './caller.js';
import { EventType, FileType, Filesystem, type EntryInfo, type FilesystemEvent } from './gen/filesystem/filesystem_pb.js';
import type { WatchEvent, WatchOp } from '../../seam/agent.js';
import type { DirectoryWatch } from '../../core/file-watch.js';
import { connectError } from './process.js';
import { removeTree } from '../remove-tree.js';

const MAX_DEPTH = 8;
const MAX_ENTRIES = 10_000;
/** Links followed to tell what a link points to (the kernel's own bound is 40). */
const MAX_LINK_HOPS = 8;

const EVENT: Record<WatchOp, EventType> = { create: EventType.CREATE, write: EventType.WRITE, remove: EventType.REMOVE, rename: EventType.RENAME, chmod: EventType.CHMOD };
const DEFAULT_KEEPALIVE_S = 50;
/** Events a polled watcher (createWatcher) keeps until they are fetched: past this it ends. */
const MAX_POLLED_EVENTS = 10_000;

const TYPE: Record<FileInfo['type'], FileType> = { file: FileType.FILE, dir: FileType.DIRECTORY, link: FileType.SYMLINK, other: FileType.UNSPECIFIED };

function permissions(type: FileInfo['type'], mode: number): string {
  const bits = 'rwxrwxrwx'.split('').map((ch, i) => (mode & (1 << (8 - i)) ? ch : '-')).join('');
  return `${type === 'dir' ? 'd' : type === 'link' ? 'L' : '-'}${bits}`;
}

export function entryInfo(path: string, st: Pick<FileInfo, 'type' | 'size' | 'mode' | 'mtimeMs' | 'target' | 'metadata'>): EntryInfo {
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
    metadata: { ...st.metadata },
  };
}

/** Where a link points, as envd says it: an absolute path, a relative target taken from the
 * link's own directory. */
export function linkTarget(path: string, target: string): string {
  return posix.isAbsolute(target) ? posix.normalize(target) : posix.join(posix.dirname(path), target);
}

/** Go's `sort.Strings` order (bytes), which envd's directory walk lists in. */
const byName = (a: { name: string }, b: { name: string }) => Buffer.compare(Buffer.from(a.name), Buffer.from(b.name));

/** A watcher of envd's polling API (createWatcher, getWatcherEvents): its events kept until
 * fetched, its end told at the next fetch. */
interface PolledWatcher {
  owner: string;
  sandbox: string;
  watch: DirectoryWatch;
  events: FilesystemEvent[];
  ended?: Error;
}

/** envd's filesystem service over the core's file service (every path resolved by the agent in
 * the sandbox's own root). */
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
  const polled = new Map<string, PolledWatcher>();
  /** A watch event as envd says it, with the entry's description when asked (best effort: the
   * entry may be gone already). */
  const eventOf = async (c: SandboxCaller, dir: string, e: WatchEvent, withEntry: boolean): Promise<FilesystemEvent> => {
    const entry = withEntry ? await stat(c, posix.join(dir, e.name)).catch(() => undefined) : undefined;
    return { $typeName: 'filesystem.FilesystemEvent', name: e.name, type: EVENT[e.op], ...(entry ? { entry } : {}) };
  };
  const watcherOf = (c: SandboxCaller, id: string) => {
    const w = polled.get(id);
    if (!w || w.owner !== c.owner || w.sandbox !== c.id) throw new ConnectError(`watcher ${id} not found`, Code.NotFound);
    return w;
  };

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
    async *watchDir(req, ctx) {
      const c = callerOf(ctx);
      const dir = envdPath(req.path);
      const watch = await guard(fp.files.watch(c.owner, c.id, dir, { recursive: req.recursive, signal: ctx.signal }));
      try {
        yield { event: { case: 'start', value: { $typeName: 'filesystem.WatchDirResponse.StartEvent' } } };
        const every = Number(ctx.requestHeader.get('keepalive-ping-interval')) || DEFAULT_KEEPALIVE_S;
        for await (const e of watch.events(every * 1000, () => null)) {
          if (ctx.signal.aborted) break;
          if (e === null) yield { event: { case: 'keepalive', value: { $typeName: 'filesystem.WatchDirResponse.KeepAlive' } } };
          else yield { event: { case: 'filesystem', value: await eventOf(c, dir, e, req.includeEntry) } };
        }
      } catch (err) {
        throw connectError(err);
      } finally {
        watch.close();
      }
    },
    async createWatcher(req, ctx) {
      const c = callerOf(ctx);
      const dir = envdPath(req.path);
      const watch = await guard(fp.files.watch(c.owner, c.id, dir, { recursive: req.recursive }));
      const watcherId = randomUUID();
      const w: PolledWatcher = { owner: c.owner, sandbox: c.id, watch, events: [] };
      polled.set(watcherId, w);
      void (async () => {
        try {
          for await (const e of watch) {
            if (w.events.length >= MAX_POLLED_EVENTS) throw new ConnectError(`more than ${MAX_POLLED_EVENTS} events were not fetched; watch again`, Code.ResourceExhausted);
            w.events.push(await eventOf(c, dir, e, req.includeEntry));
          }
          w.ended ??= new ConnectError('the watch ended', Code.NotFound);
        } catch (err) {
          w.ended = connectError(err);
        } finally {
          watch.close();
          // An ended watcher nobody fetches again is forgotten after a while.
          setTimeout(() => polled.get(watcherId) === w && polled.delete(watcherId), 60_000).unref();
        }
      })();
      return { watcherId };
    },
    async getWatcherEvents(req, ctx) {
      const w = watcherOf(callerOf(ctx), req.watcherId);
      const events = w.events.splice(0);
      if (!events.length && w.ended) {
        polled.delete(req.watcherId);
        throw w.ended;
      }
      return { events };
    },
    async removeWatcher(req, ctx) {
      const w = watcherOf(callerOf(ctx), req.watcherId);
      polled.delete(req.watcherId);
      w.watch.close();
      return {};
    },
  };
}
