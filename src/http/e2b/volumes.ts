import { posix } from 'node:path';
import type { Readable } from 'node:stream';
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { ConflictError, InvalidRequestError, NotFoundError } from '../../core/errors.js';
import type { FileInfo } from '../../core/files.js';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { VolumeView } from '../../core/volumes.js';
import type { FileStat } from '../../seam/agent.js';
import { E2B_SDK } from './sdk-constraint.js';

/** E2B's volumes have no size: each is made this large (sparse: what it holds is what it takes),
 * or as large as a volume may be here, if that is less. */
export const E2B_VOLUME_MB = 4096;
/** A listing's depth and entries: E2B's `depth` recurses, bounded here. */
const MAX_DEPTH = 16;
const MAX_ENTRIES = 10_000;

const hidden = { hide: true };
/** E2B's SDKs' own calls (`publisher: e2b`): forkpoint's `/volumes` answers everyone else. */
const fromSdk = { e2bSdk: E2B_SDK };
const VolumeIdParams = z.object({ volumeID: z.string().min(1).max(64) });
const NewVolume = z.object({ name: z.string().regex(/^[a-zA-Z0-9_-]+$/).max(63) }).passthrough();
const uint32 = z.coerce.number().int().min(0).max(0xffffffff);
const PathQuery = z.object({ path: z.string().min(1).max(4096) });
/** A volume's ids are those its sandboxes see (0-65535, as a range maps them). */
const OwnerMode = z.object({
  uid: z.number().int().min(0).max(65535).optional(),
  gid: z.number().int().min(0).max(65535).optional(),
  mode: z.number().int().min(0).max(0o7777).optional(),
}).passthrough();
const Boolish = z.enum(['true', 'false']).transform((v) => v === 'true');
const DirQuery = PathQuery.extend({ depth: z.coerce.number().int().min(0).max(MAX_DEPTH).optional() });
const MakeQuery = PathQuery.extend({ uid: uint32.optional(), gid: uint32.optional(), mode: uint32.optional(), force: Boolish.optional() });

const TYPES = { dir: 'directory', file: 'file', link: 'symlink', other: 'unknown' } as const;

/** A path of the volume as E2B's API takes it: relative to the volume's top, or absolute in it. */
function volumePath(path: string): string {
  if (path.includes('\0')) throw new InvalidRequestError('a path holds no NUL', { path });
  return posix.normalize(path.startsWith('/') ? path : `/${path}`).replace(/(.)\/$/, '$1');
}

/** E2B's VolumeEntryStat. The agent tells one time of a file (its mtime): atime and ctime are it. */
function entryStat(path: string, st: FileStat | FileInfo): Record<string, unknown> {
  const time = new Date(st.mtimeMs).toISOString();
  return {
    name: path === '/' ? '' : posix.basename(path),
    type: TYPES[st.type],
    path,
    size: st.size,
    mode: st.mode,
    uid: st.uid ?? 0,
    gid: st.gid ?? 0,
    atime: time,
    mtime: time,
    ctime: time,
    ...(st.target !== null ? { target: st.target } : {}),
  };
}

/** The user a file is made for: E2B names its owner by ids (canonical: the volume's own). */
const owned = (uid: number | undefined, gid: number | undefined) =>
  uid === undefined && gid === undefined ? {} : { user: { name: String(uid ?? 0), home: '/', uid: uid ?? 0, gid: gid ?? uid ?? 0, groups: [] } };

/**
 * E2B's volumes: its control plane's `/volumes` (for its SDKs: forkpoint's own routes have the
 * same paths) over forkpoint's persistent volumes, and its volume content API
 * (`/volumecontent/{volumeID}/...`, E2B_VOLUME_API_URL) over the volume's own file agent, with
 * the volume's content token. A volume's `volumeID` is forkpoint's id; E2B mounts volumes by
 * name (`volumeMounts`), which forkpoint's instances do too.
 */
export const e2bVolumeRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    app.addContentTypeParser('application/octet-stream', (_req, payload, done) => done(null, payload));
    const withToken = (req: { credential?: unknown }, v: VolumeView) => {
      const c = req.credential as Parameters<typeof fp.credentials.volumeTokenFor>[0] | undefined;
      return { volumeID: v.id, name: v.name, token: c?.kind === 'owner' ? fp.credentials.volumeTokenFor(c, v.id) : '' };
    };

    app.post('/volumes', { constraints: fromSdk, config: { placement: 'here' }, schema: { ...hidden, body: NewVolume } }, async (req, reply) => {
      const v = await fp.volumes.create(req.owner, { name: req.body.name, sizeMb: Math.min(E2B_VOLUME_MB, fp.config.maxVolumeMb) });
      return reply.code(201).send(withToken(req, v));
    });
    app.get('/volumes', { constraints: fromSdk, config: { placement: 'here' }, schema: hidden }, async (req) =>
      (await fp.volumes.list(req.owner)).map((v) => ({ volumeID: v.id, name: v.name })),
    );
    app.get('/volumes/:volumeID', { constraints: fromSdk, config: { placement: 'volume' }, schema: { ...hidden, params: VolumeIdParams } }, async (req) =>
      withToken(req, await fp.volumes.getById(req.owner, req.params.volumeID)),
    );
    app.delete('/volumes/:volumeID', { constraints: fromSdk, config: { placement: 'volume' }, schema: { ...hidden, params: VolumeIdParams } }, async (req, reply) => {
      await fp.volumes.deleteById(req.owner, req.params.volumeID);
      return reply.code(204).send();
    });

    // The content API: the volume's token (or an API token), on the volume's node.
    const content = { scope: 'volume' as const, placement: 'volume' as const };
    const files = fp.volumeFiles;
    const stat = (owner: string, id: string, path: string) => files.stat(owner, id, path);

    app.get('/volumecontent/:volumeID/path', { config: content, schema: { ...hidden, params: VolumeIdParams, querystring: PathQuery } }, async (req) => {
      const path = volumePath(req.query.path);
      return entryStat(path, await stat(req.owner, req.params.volumeID, path));
    });

    app.patch('/volumecontent/:volumeID/path', { config: content, schema: { ...hidden, params: VolumeIdParams, querystring: PathQuery, body: OwnerMode } }, async (req) => {
      const path = volumePath(req.query.path);
      const { uid, gid, mode } = req.body;
      await stat(req.owner, req.params.volumeID, path); // 404 for a missing path, as E2B's
      if (uid !== undefined || gid !== undefined || mode !== undefined) await files.setOwnerMode(req.owner, req.params.volumeID, path, { uid, gid, mode });
      return entryStat(path, await stat(req.owner, req.params.volumeID, path));
    });

    app.delete('/volumecontent/:volumeID/path', { config: content, schema: { ...hidden, params: VolumeIdParams, querystring: PathQuery } }, async (req, reply) => {
      const path = volumePath(req.query.path);
      if (path === '/') throw new InvalidRequestError('the volume\'s top is not deleted: delete the volume');
      await stat(req.owner, req.params.volumeID, path);
      await files.removeAll(req.owner, req.params.volumeID, path);
      return reply.code(204).send();
    });

    app.get('/volumecontent/:volumeID/dir', { config: content, schema: { ...hidden, params: VolumeIdParams, querystring: DirQuery } }, async (req) => {
      const { volumeID } = req.params;
      const top = volumePath(req.query.path);
      const depth = Math.max(1, req.query.depth ?? 1);
      const dir = await stat(req.owner, volumeID, top);
      if (dir.type !== 'dir') throw new InvalidRequestError(`${top} is not a directory`, { path: top });
      const out: Record<string, unknown>[] = [];
      const walk = async (path: string, level: number): Promise<void> => {
        for (const e of await files.list(req.owner, volumeID, path)) {
          if (out.length >= MAX_ENTRIES) throw new InvalidRequestError(`more than ${MAX_ENTRIES} entries: list less deep`, { path: top });
          const child = path === '/' ? `/${e.name}` : `${path}/${e.name}`;
          const st = await stat(req.owner, volumeID, child).catch((err: unknown) => {
            if (err instanceof NotFoundError) return undefined; // gone since the listing
            throw err;
          });
          if (!st) continue;
          out.push(entryStat(child, st));
          if (st.type === 'dir' && level < depth) await walk(child, level + 1);
        }
      };
      await walk(top, 1);
      return out;
    });

    app.post('/volumecontent/:volumeID/dir', { config: content, schema: { ...hidden, params: VolumeIdParams, querystring: MakeQuery } }, async (req, reply) => {
      const { volumeID } = req.params;
      const { uid, gid, force } = req.query;
      const path = volumePath(req.query.path);
      const exists = await stat(req.owner, volumeID, path).catch(() => undefined);
      if (exists?.type === 'dir' && force) return reply.code(201).send(entryStat(path, exists));
      if (exists) throw new ConflictError(`${path} exists`, { path });
      if (!force) {
        const parent = await stat(req.owner, volumeID, posix.dirname(path)).catch(() => undefined);
        if (parent?.type !== 'dir') throw new NotFoundError('directory', posix.dirname(path));
      }
      await files.mkdir(req.owner, volumeID, path, owned(uid, gid));
      return reply.code(201).send(entryStat(path, await stat(req.owner, volumeID, path)));
    });

    app.get('/volumecontent/:volumeID/file', { config: content, schema: { ...hidden, params: VolumeIdParams, querystring: PathQuery } }, async (req, reply) => {
      const { size, stream } = await files.readStream(req.owner, req.params.volumeID, volumePath(req.query.path));
      reply.type('application/octet-stream');
      if (size !== undefined) reply.header('content-length', size);
      return reply.send(stream);
    });

    app.put('/volumecontent/:volumeID/file', { config: content, schema: { ...hidden, params: VolumeIdParams, querystring: MakeQuery } }, async (req, reply) => {
      const { volumeID } = req.params;
      const { uid, gid, mode, force } = req.query;
      const path = volumePath(req.query.path);
      if (path === '/') throw new InvalidRequestError('a file needs a name', { path });
      if (force === false && (await stat(req.owner, volumeID, path).catch(() => undefined))) throw new ConflictError(`${path} exists`, { path });
      const body = req.body as Readable | undefined;
      const source = body && typeof (body as AsyncIterable<Buffer>)[Symbol.asyncIterator] === 'function' ? (body as AsyncIterable<Buffer>) : emptyBody();
      await files.writeStream(req.owner, volumeID, path, source, { ...owned(uid, gid), ...(mode !== undefined ? { mode: mode & 0o7777 } : {}) });
      return reply.code(201).send(entryStat(path, await stat(req.owner, volumeID, path)));
    });
  };

async function* emptyBody(): AsyncIterable<Buffer> {}
