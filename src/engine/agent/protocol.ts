/** Mirror of native/protocol.h: a 12-byte little-endian header, then the payload. */
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
  OUTPUT: 128,
  SPAWNED: 129,
  EXIT: 130,
  LIST_REPLY: 131,
  ERROR: 133,
  PONG: 134,
  FILE: 135,
  OK: 136,
} as const;

/** errno values the engine tells apart. */
export const ENOENT = 2;

export const SPAWN_PTY = 1;
export const SPAWN_NOECHO = 2;
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

export interface SpawnRequest {
  argv: string[];
  env: string[];
  cwd: string;
  pty?: { rows: number; cols: number; echo: boolean } | undefined;
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
  return { payload: Buffer.concat([head, ...strings]), flags };
}

/** Incremental decoder: feed chunks, get whole frames. */
export class FrameDecoder {
  private buf: Buffer = Buffer.alloc(0);

  push(chunk: Buffer): Frame[] {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const frames: Frame[] = [];
    let off = 0;
    while (this.buf.length - off >= HEADER_LEN) {
      const len = this.buf.readUInt32LE(off);
      if (len > MAX_FRAME) throw new Error(`agent frame of ${len} bytes exceeds the limit`);
      if (this.buf.length - off < HEADER_LEN + len) break;
      frames.push({
        type: this.buf.readUInt8(off + 4),
        flags: this.buf.readUInt8(off + 5),
        id: this.buf.readUInt32LE(off + 8),
        payload: this.buf.subarray(off + HEADER_LEN, off + HEADER_LEN + len),
      });
      off += HEADER_LEN + len;
    }
    this.buf = off === this.buf.length ? Buffer.alloc(0) : this.buf.subarray(off);
    return frames;
  }
}

export interface AgentProcessInfo {
  id: number;
  pid: number;
  running: boolean;
  exitCode: number;
  signal: number;
  pty: boolean;
  stdoutBytes: number;
  stderrBytes: number;
  command: string;
}

export function parseList(payload: Buffer): AgentProcessInfo[] {
  return payload
    .toString('utf8')
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const [id, pid, state, code, sig, pty, out, err, ...cmd] = line.split('\t');
      return {
        id: Number(id),
        pid: Number(pid),
        running: state === 'running',
        exitCode: Number(code),
        signal: Number(sig),
        pty: pty === '1',
        stdoutBytes: Number(out),
        stderrBytes: Number(err),
        command: cmd.join('\t'),
      };
    });
}

export interface DirEntry {
  name: string;
  type: 'dir' | 'file' | 'link' | 'other';
  size: number;
}

const TYPES: Record<string, DirEntry['type']> = { d: 'dir', f: 'file', l: 'link', o: 'other' };

export function parseDir(payload: Buffer): DirEntry[] {
  return payload
    .toString('utf8')
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const [name, t, size] = line.split('\t');
      return { name: name!, type: TYPES[t!] ?? 'other', size: Number(size) };
    });
}
