import { randomUUID } from 'node:crypto';
import { posix } from 'node:path';
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from '@connectrpc/connect';
import { timestampFromMs } from '@bufbuild/protobuf/wkt';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { FileInfo } from '../../core/files.js';
import { callerOf, envdPath, envdUser, type SandboxCaller } from './caller.js';
import type { AsUser } from '../../core/files.js';
import type { IdNames } from '../../core/users.js';
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

export function entryInfo(path: string, st: Pick<FileInfo, 'type' | 'size' | 'mode' | 'mtimeMs' | 'target' | 'metadata' | 'uid' | 'gid'>, names?: IdNames): EntryInfo {
  const name = (byId: ReadonlyMap<number, string> | undefined, id: number | undefined) => (id === undefined ? 'root' : (byId?.get(id) ?? String(id)));
  return {
    $typeName: 'filesystem.EntryInfo',
    name: posix.basename(path),
    type: TYPE[st.type],
    path,
    size: BigInt(st.size),
    mode: st.mode,
    permissions: permissions(st.type, st.mode),
    owner: name(names?.users, st.uid),
    group: name(names?.groups, st.gid),
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

/** An envd filesystem call's caller, with the user it acts as: its home (relative paths start
 * there), the user for the file service, and the names of the sandbox's ids. */
interface Caller extends SandboxCaller {
  home: string;
  as: AsUser;
  names: IdNames;
}

/** A watcher of envd's polling API (createWatcher, getWatcherEvents): its events kept until
 * fetched, its end told at the next fetch. */
interface PolledWatcher {
  owner: string;
  sandbox: string;
  watch: DirectoryWatch;
  /** In order, each as soon as it came: its entry (asked for with includeEntry) is looked up
   * after it, one event after another, and a fetch waits for the lookups of what it takes, so
   * that a fetch sees every event that had come when it was asked. */
  events: Promise<FilesystemEvent>[];
  ended?: Error;
}

/** envd's filesystem service over the core's file service (every path resolved by the agent in
 * the sandbox's own root). */
export function filesystemService(fp: Forkpoint): ServiceImpl<typeof Filesystem> {
  /** A link is described as envd does: the type of what it points to (a link's own when that
   * is missing), its target as an absolute path. */
  const describe = async (c: Caller, path: string, st: FileInfo) => {
    if (st.type !== 'link' || st.target === null) return entryInfo(path, st, c.names);
    let target = linkTarget(path, st.target);
    let pointed: FileInfo | undefined;
    for (let hops = 0; hops < MAX_LINK_HOPS; hops++) {
      pointed = await fp.files.stat(c.owner, c.id, target, c.as).catch(() => undefined);
      if (pointed?.type !== 'link' || pointed.target === null) break;
      target = linkTarget(target, pointed.target);
    }
    return entryInfo(path, { ...st, type: pointed && pointed.type !== 'link' ? pointed.type : 'link', target }, c.names);
  };
  const stat = async (c: Caller, path: string) => describe(c, path, await fp.files.stat(c.owner, c.id, path, c.as));
  /** The call's caller with the user it acts as (envd's), and the names to tell owners by. */
  const callerWithUser = async (ctx: HandlerContext): Promise<Caller> => {
    const c = callerOf(ctx);
    const [user, names] = await guard(Promise.all([envdUser(fp, c), fp.files.idNames(c.owner, c.id)]));
    return { ...c, home: user.home, as: { user }, names };
  };
  const guard = <T>(p: Promise<T>) => p.catch((err: unknown) => Promise.reject(connectError(err)));
  const polled = new Map<string, PolledWatcher>();
  /** A watch event as envd says it, with the entry's description when asked (best effort: the
   * entry may be gone already). */
  const eventOf = async (c: Caller, dir: string, e: WatchEvent, withEntry: boolean): Promise<FilesystemEvent> => {
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
      const c = await callerWithUser(ctx);
      return { entry: await guard(stat(c, envdPath(req.path, c.home))) };
    },
    async makeDir(req, ctx) {
      const c = await callerWithUser(ctx);
      const path = envdPath(req.path, c.home);
      const exists = await fp.files.stat(c.owner, c.id, path).then(() => true, () => false);
      if (exists) throw new ConnectError(`${path} already exists`, Code.AlreadyExists);
      await guard(fp.files.mkdir(c.owner, c.id, path, c.as));
      return { entry: await guard(stat(c, path)) };
    },
    async move(req, ctx) {
      const c = await callerWithUser(ctx);
      const to = envdPath(req.destination, c.home);
      await guard(fp.files.move(c.owner, c.id, envdPath(req.source, c.home), to, c.as));
      return { entry: await guard(stat(c, to)) };
    },
    async listDir(req, ctx) {
      const c = await callerWithUser(ctx);
      const root = envdPath(req.path, c.home);
      const depth = Math.min(Math.max(req.depth || 1, 1), MAX_DEPTH);
      const entries: EntryInfo[] = [];
      const walk = async (dir: string, level: number): Promise<void> => {
        for (const e of (await guard(fp.files.list(c.owner, c.id, dir, c.as))).sort(byName)) {
          if (entries.length >= MAX_ENTRIES) return;
          const path = posix.join(dir, e.name);
          const info = await fp.files.stat(c.owner, c.id, path, c.as).catch(() => undefined);
          if (!info) continue;
          entries.push(await describe(c, path, info));
          if (e.type === 'dir' && level < depth) await walk(path, level + 1);
        }
      };
      const top = await guard(fp.files.stat(c.owner, c.id, root, c.as));
      if (top.type !== 'dir') throw new ConnectError(`${root} is not a directory`, Code.InvalidArgument);
      await walk(root, 1);
      return { entries };
    },
    async remove(req, ctx) {
      const c = await callerWithUser(ctx);
      await guard(removeTree(fp, c.owner, c.id, envdPath(req.path, c.home), c.as));
      return {};
    },
    async *watchDir(req, ctx) {
      const c = await callerWithUser(ctx);
      const dir = envdPath(req.path, c.home);
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
      const c = await callerWithUser(ctx);
      const dir = envdPath(req.path, c.home);
      const watch = await guard(fp.files.watch(c.owner, c.id, dir, { recursive: req.recursive }));
      const watcherId = randomUUID();
      const w: PolledWatcher = { owner: c.owner, sandbox: c.id, watch, events: [] };
      polled.set(watcherId, w);
      void (async () => {
        try {
          let described: Promise<unknown> = Promise.resolve();
          for await (const e of watch) {
            if (w.events.length >= MAX_POLLED_EVENTS) throw new ConnectError(`more than ${MAX_POLLED_EVENTS} events were not fetched; watch again`, Code.ResourceExhausted);
            const event = described.then(() => eventOf(c, dir, e, req.includeEntry));
            described = event.catch(() => undefined);
            w.events.push(event);
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
      const events = await Promise.all(w.events.splice(0));
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
