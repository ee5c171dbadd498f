import { copyFileSync, linkSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import protobuf from 'protobufjs';
import { EngineError } from '../seam/errors.js';

/** How many ids a sandbox's user namespace maps: its 0..65535 (native/fp.h FP_RANGE_SIZE). */
export const RANGE_SIZE = 65536;

/** CRIU's image of a user namespace (images/userns.proto): the maps CRIU writes for the
 * namespace it makes when it restores the tree. */
const root = protobuf.parse(`
  syntax = "proto2";
  message uid_gid_extent { required uint32 first = 1; required uint32 lower_first = 2; required uint32 count = 3; }
  message userns_entry { repeated uid_gid_extent uid_map = 1; repeated uid_gid_extent gid_map = 2; }
`, { keepCase: true }).root;
const UsernsEntry = root.lookupType('userns_entry');

const IMG_COMMON_MAGIC = 0x54564319;
const USERNS_MAGIC = 0x55474906;
const IMAGE = /^userns-\d+\.img$/;

export interface Extent {
  first: number;
  lower_first: number;
  count: number;
}

/** The range base of one image file, checked to be the one map forkpoint writes. */
function baseOf(file: string, bytes: Buffer): number {
  const bad = (why: string) => new EngineError('RESTORE_FAILED', `${file}: ${why}`);
  if (bytes.length < 12 || bytes.readUInt32LE(0) !== IMG_COMMON_MAGIC || bytes.readUInt32LE(4) !== USERNS_MAGIC) throw bad('not a CRIU user namespace image');
  const len = bytes.readUInt32LE(8);
  if (len !== bytes.length - 12) throw bad(`entry of ${len} bytes in ${bytes.length - 12}`);
  const entry = UsernsEntry.toObject(UsernsEntry.decode(bytes.subarray(12))) as { uid_map?: Extent[]; gid_map?: Extent[] };
  const [uid] = entry.uid_map ?? [];
  const [gid] = entry.gid_map ?? [];
  const single = (m: Extent[] | undefined, e: Extent | undefined) => m?.length === 1 && e?.first === 0 && e.count === RANGE_SIZE;
  if (!single(entry.uid_map, uid) || !single(entry.gid_map, gid) || uid!.lower_first !== gid!.lower_first) throw bad(`not a map of one range: ${JSON.stringify(entry)}`);
  return uid!.lower_first;
}

/** A user namespace image whose uid and gid maps are both `extents`. */
export function usernsImage(extents: readonly Extent[]): Buffer {
  const entry = Buffer.from(UsernsEntry.encode(UsernsEntry.fromObject({ uid_map: extents, gid_map: extents })).finish());
  const head = Buffer.alloc(12);
  head.writeUInt32LE(IMG_COMMON_MAGIC, 0);
  head.writeUInt32LE(USERNS_MAGIC, 4);
  head.writeUInt32LE(entry.length, 8);
  return Buffer.concat([head, entry]);
}

const imageFor = (base: number) => usernsImage([{ first: 0, lower_first: base, count: RANGE_SIZE }]);

/**
 * The images directory to restore from so that the tree comes back in the range at `base`:
 * `images` itself when its user namespace is already that range's (a rollback, a wake, a
 * checkpoint's own restore), else `scratch`, made anew: every file of `images` hard-linked (the
 * restored tasks open some images themselves, and may not search the path a symlink names), the user
 * namespace's image rewritten (a fork, a restore on another node). A tree is restored in the
 * mode it was dumped in: with a user namespace or without (the core keeps the mode with the
 * checkpoint); asked otherwise, this refuses rather than run host ids on an idmapped disk.
 * `criuRebases`: the CRIU that restores moves the maps to the range itself (its restore's
 * `userns_base`, deploy/criu/0007-*), so `images` serves every range as it is.
 */
export function imagesForRange(images: string, base: number | null, scratch: string, criuRebases: boolean): string {
  const names = readdirSync(images);
  const userns = names.filter((n) => IMAGE.test(n));
  if ((base === null) !== (userns.length === 0)) {
    throw new EngineError('RESTORE_FAILED', base === null ? 'the memory image is of a sandbox in a user namespace; this one has none' : 'the memory image is of a sandbox without a user namespace');
  }
  if (base === null || criuRebases) return images;
  const current = userns.map((n) => baseOf(n, readFileSync(join(images, n))));
  if (current.every((b) => b === base)) return images;
  rmSync(scratch, { recursive: true, force: true });
  // As searchable as the checkpoint's own directory: a restored task opens some images itself.
  mkdirSync(scratch, { recursive: true, mode: 0o755 });
  for (const name of names) {
    if (IMAGE.test(name)) writeFileSync(join(scratch, name), imageFor(base), { mode: 0o600 });
    else linkOrCopy(join(images, name), join(scratch, name));
  }
  return scratch;
}

function linkOrCopy(from: string, to: string): void {
  try {
    linkSync(from, to);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EXDEV') throw err;
    copyFileSync(from, to);
  }
}

/** Refuses a restored tree (its root task `pid`, as the host sees it) whose user namespace does
 * not map 0..RANGE_SIZE-1 from `base`, for uids and gids alike. */
export function checkRestoredRange(pid: number, base: number): void {
  const expected = `0 ${base} ${RANGE_SIZE}`;
  for (const map of ['uid_map', 'gid_map']) {
    const text = readFileSync(`/proc/${pid}/${map}`, 'utf8').trim().split(/\s+/).join(' ');
    if (text !== expected) throw new EngineError('RESTORE_FAILED', `the restored tree's ${map} is "${text}", not "${expected}"`);
  }
}
