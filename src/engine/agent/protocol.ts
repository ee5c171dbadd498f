/** Mirror of native/protocol.h: a 12-byte little-endian header, then the payload. */
import { AgentProtocolError } from '../../seam/errors.js';
import { MAX_GROUPS, type SpawnRequest, type UnixIds } from '../../seam/agent.js';

export const HEADER_LEN = 12;
export const MAX_FRAME = 8 << 20;

export const T = {
  SPAWN: 1,
  STDIN: 2,
  SIGNAL: 3,
  RESIZE: 4,
  ATTACH: 5,
  DETACH: 6,
  LIST: 7,
  FORGET: 8,
  PING: 9,
  WRITE_FILE: 10,
  READ_FILE: 11,
  REMOVE_FILE: 12,
  LIST_DIR: 13,
  MKDIR: 14,
  READ_AT: 15,
  WRITE_AT: 16,
  RENAME: 17,
  STAT: 18,
  WATCH: 19,
  UNWATCH: 20,
  SET_METADATA: 21,
  SET_OWNER_MODE: 22,
  OUTPUT: 128,
  SPAWNED: 129,
  EXIT: 130,
  LIST_REPLY: 131,
  ERROR: 133,
  PONG: 134,
  FILE: 135,
  OK: 136,
  WATCH_EVENT: 137,
} as const;

/** errno values the engine tells apart. */
export { ENOENT } from '../../seam/agent.js';

export const WRITE_TRUNCATE = 1;
export const SPAWN_PTY = 1;
export const SPAWN_NOECHO = 2;
/** On a spawn or a file operation: the payload starts with the user's ids (encodeIds). */
export const AS_USER = 0x80;
export const SIG_FOREGROUND = 1;

export interface Frame {
  type: number;
  flags: number;
  id: number;
  payload: Buffer;
}

export function encodeFrame(type: number, id: number, payload: Buffer = Buffer.alloc(0), flags = 0): Buffer {
  const h = Buffer.allocUnsafe(HEADER_LEN + payload.length);
  h.writeUInt32LE(payload.length, 0);
  h.writeUInt8(type, 4);
  h.writeUInt8(flags, 5);
  h.writeUInt16LE(0, 6);
  h.writeUInt32LE(id, 8);
  payload.copy(h, HEADER_LEN);
  return h;
}

export type { SpawnRequest } from '../../seam/agent.js';

/** u32 uid, u32 gid, u32 ngroups, u32 groups[]: what an AS_USER frame carries first. */
export function encodeIds(ids: UnixIds): Buffer {
  const valid = (n: number) => Number.isInteger(n) && n >= 0 && n < 0xffffffff;
  if (!valid(ids.uid) || !valid(ids.gid) || ids.groups.length > MAX_GROUPS || !ids.groups.every(valid)) {
    throw new RangeError(`user ids out of range: ${JSON.stringify(ids)}`);
  }
  const b = Buffer.alloc(12 + 4 * ids.groups.length);
  b.writeUInt32LE(ids.uid, 0);
  b.writeUInt32LE(ids.gid, 4);
  b.writeUInt32LE(ids.groups.length, 8);
  ids.groups.forEach((g, i) => b.writeUInt32LE(g, 12 + 4 * i));
  return b;
}

export function encodeSpawn(req: SpawnRequest): { payload: Buffer; flags: number } {
  const head = Buffer.alloc(8);
  head.writeUInt16LE(req.pty?.rows ?? 0, 0);
  head.writeUInt16LE(req.pty?.cols ?? 0, 2);
  head.writeUInt16LE(req.argv.length, 4);
  head.writeUInt16LE(req.env.length, 6);
  const strings = [req.cwd, ...req.argv, ...req.env].map((s) => Buffer.from(`${s}\0`));
  let flags = 0;
  if (req.pty) flags |= SPAWN_PTY | (req.pty.echo ? 0 : SPAWN_NOECHO);
  if (req.user) flags |= AS_USER;
  return { payload: Buffer.concat([...(req.user ? [encodeIds(req.user)] : []), head, ...strings]), flags };
}

/** Incremental decoder: feed chunks, get whole frames. Holds at most one frame's worth of
 * bytes (a header declaring more than MAX_FRAME is a protocol error), and copies a frame only
 * when it spans chunks. */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private size = 0;

  push(chunk: Buffer): Frame[] {
    if (chunk.length) {
      this.chunks.push(chunk);
      this.size += chunk.length;
    }
    const frames: Frame[] = [];
    while (this.size >= HEADER_LEN) {
      const len = this.peek(HEADER_LEN).readUInt32LE(0);
      if (len > MAX_FRAME) throw new AgentProtocolError(`agent frame of ${len} bytes exceeds the limit of ${MAX_FRAME}`);
      if (this.size < HEADER_LEN + len) break;
      const whole = this.take(HEADER_LEN + len);
      frames.push({ type: whole.readUInt8(4), flags: whole.readUInt8(5), id: whole.readUInt32LE(8), payload: whole.subarray(HEADER_LEN) });
    }
    return frames;
  }

  private peek(n: number): Buffer {
    if (this.chunks[0]!.length < n) this.chunks = [Buffer.concat(this.chunks, this.size)];
    return this.chunks[0]!;
  }

  private take(n: number): Buffer {
    const first = this.peek(n);
    this.size -= n;
    if (first.length === n) this.chunks.shift();
    else this.chunks[0] = first.subarray(n);
    return first.subarray(0, n);
  }
}
