import { z } from 'zod';
import { AgentProtocolError } from '../../seam/errors.js';
import { MAX_METADATA_ENTRIES, METADATA_KEY, METADATA_VALUE, WATCH_OPS, type AgentProcessInfo, type DirEntry, type FileStat } from '../../seam/agent.js';

export type { AgentProcessInfo, DirEntry, FileStat } from '../../seam/agent.js';
import { T, type Frame } from './protocol.js';

/**
 * What the agent sends, checked before anything acts on it. The agent runs inside the sandbox,
 * where root can replace or drive it: every frame is hostile input. A frame that is not exactly
 * one of these shapes is a protocol error, which closes that connection (agent/client.ts) and
 * nothing else.
 */

const Id = z.number().int().min(0).max(0xffffffff);
const Offset = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);

const Output = z.object({ kind: z.literal('output'), id: Id, stream: z.union([z.literal(1), z.literal(2)]), offset: Offset, data: z.instanceof(Buffer) });
const Spawned = z.object({ kind: z.literal('spawned'), id: Id, pid: z.number().int().min(1) });
const Exit = z.object({ kind: z.literal('exit'), id: Id, code: z.number().int().min(-1).max(255), signal: z.number().int().min(0).max(64) });
const Failure = z.object({ kind: z.literal('error'), id: Id, errno: z.number().int().min(0).max(4095), message: z.string().max(4096) });
const Reply = z.object({ kind: z.enum(['pong', 'ok']), id: Id });
const Data = z.object({ kind: z.enum(['file', 'list']), id: Id, data: z.instanceof(Buffer), truncated: z.boolean() });
/** A name below the watched directory: relative, without empty, `.` or `..` parts. */
const WatchedName = z.string().min(1).max(4095).refine((n) => !n.includes('\0') && n.split('/').every((part) => part !== '' && part !== '.' && part !== '..'), 'a relative path');
const Watched = z.object({ kind: z.literal('watch'), id: Id, op: z.enum(WATCH_OPS), name: WatchedName });

export const AgentMessage = z.discriminatedUnion('kind', [Output, Spawned, Exit, Failure, Reply, Data, Watched]);
export type AgentMessage = z.infer<typeof AgentMessage>;

/** Reads a frame into a message, checking every length before reading a field. */
export function decodeFrame(f: Frame): AgentMessage {
  const p = f.payload;
  const exact = (n: number) => {
    if (p.length !== n) throw new AgentProtocolError(`frame type ${f.type} with ${p.length} payload bytes (expected ${n})`);
  };
  const atLeast = (n: number) => {
    if (p.length < n) throw new AgentProtocolError(`frame type ${f.type} with ${p.length} payload bytes (expected at least ${n})`);
  };
  let msg: unknown;
  switch (f.type) {
    case T.OUTPUT:
      atLeast(8);
      msg = { kind: 'output', id: f.id, stream: f.flags, offset: safeU64(p.readBigUInt64LE(0)), data: p.subarray(8) };
      break;
    case T.SPAWNED:
      exact(4);
      msg = { kind: 'spawned', id: f.id, pid: p.readInt32LE(0) };
      break;
    case T.EXIT:
      exact(8);
      msg = { kind: 'exit', id: f.id, code: p.readInt32LE(0), signal: p.readInt32LE(4) };
      break;
    case T.ERROR:
      atLeast(4);
      msg = { kind: 'error', id: f.id, errno: p.readInt32LE(0), message: p.subarray(4).toString('utf8') };
      break;
    case T.PONG:
    case T.OK:
      exact(0);
      msg = { kind: f.type === T.PONG ? 'pong' : 'ok', id: f.id };
      break;
    case T.FILE:
    case T.LIST_REPLY:
      if (f.flags > 1) throw new AgentProtocolError(`frame type ${f.type} with flags ${f.flags}`);
      msg = { kind: f.type === T.FILE ? 'file' : 'list', id: f.id, data: p, truncated: f.flags === 1 };
      break;
    case T.WATCH_EVENT:
      msg = { kind: 'watch', id: f.id, op: WATCH_OPS[f.flags - 1], name: p.toString('utf8') };
      break;
    default:
      throw new AgentProtocolError(`unknown frame type ${f.type}`);
  }
  const parsed = AgentMessage.safeParse(msg);
  if (!parsed.success) throw new AgentProtocolError(`frame type ${f.type}: ${parsed.error.issues[0]?.message ?? 'invalid'}`);
  return parsed.data;
}

function safeU64(v: bigint): number {
  return v > BigInt(Number.MAX_SAFE_INTEGER) ? -1 : Number(v);
}

/** A line of the agent's process list: `id pid state code signal pty stdout stderr command`. */
const ProcessLine = z.object({
  id: z.coerce.number().int().min(1).max(0xffffffff),
  pid: z.coerce.number().int().min(1),
  state: z.enum(['running', 'exited']),
  code: z.coerce.number().int().min(-1).max(255),
  signal: z.coerce.number().int().min(0).max(64),
  pty: z.enum(['0', '1']),
  stdoutBytes: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  stderrBytes: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  command: z.string().max(256),
});


const MAX_LIST_LINES = 1024;

export function parseList(payload: Buffer): AgentProcessInfo[] {
  const lines = payload.toString('utf8').split('\n').filter(Boolean);
  if (lines.length > MAX_LIST_LINES) throw new AgentProtocolError(`process list of ${lines.length} lines`);
  return lines.map((line) => {
    const [id, pid, state, code, signal, pty, stdoutBytes, stderrBytes, ...cmd] = line.split('\t');
    const r = ProcessLine.safeParse({ id, pid, state, code, signal, pty, stdoutBytes, stderrBytes, command: cmd.join('\t') });
    if (!r.success) throw new AgentProtocolError(`process list line: ${r.error.issues[0]?.message ?? 'invalid'}`);
    const v = r.data;
    return { id: v.id, pid: v.pid, running: v.state === 'running', exitCode: v.code, signal: v.signal, pty: v.pty === '1', stdoutBytes: v.stdoutBytes, stderrBytes: v.stderrBytes, command: v.command };
  });
}


const StatLine = z.object({
  type: z.enum(['d', 'f', 'l', 'o']),
  size: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  mode: z.string().regex(/^[0-7]{1,4}$/),
  mtimeMs: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  target: z.string().max(1023),
});

const MetadataLine = z.object({ key: z.string().regex(METADATA_KEY), value: z.string().regex(METADATA_VALUE) });

const Id32 = z.string().regex(/^\d{1,10}$/).transform(Number).pipe(z.number().max(0xfffffffe));
const OwnerLine = z.object({ uid: Id32, gid: Id32 });

/** The stat line, the owner's line `u UID GID` (agents before it: none), then a line
 * `x KEY VALUE` per metadata entry (all tab-separated). */
export function parseStat(payload: Buffer): FileStat {
  const [first = '', ...rest] = payload.toString('utf8').replace(/\n$/, '').split('\n');
  const [type, size, mode, mtimeMs, target = ''] = first.split('\t');
  const r = StatLine.safeParse({ type, size, mode, mtimeMs, target });
  if (!r.success) throw new AgentProtocolError(`stat line: ${r.error.issues[0]?.message ?? 'invalid'}`);
  let owner: { uid: number; gid: number } | undefined;
  if (rest[0]?.startsWith('u\t')) {
    const [, uid, gid, ...more] = rest.shift()!.split('\t');
    const o = OwnerLine.safeParse({ uid, gid });
    if (!o.success || more.length) throw new AgentProtocolError('stat owner line: not `u UID GID`');
    owner = o.data;
  }
  if (rest.length > MAX_METADATA_ENTRIES) throw new AgentProtocolError(`stat with ${rest.length} metadata lines`);
  const entries = new Map<string, string>();
  for (const line of rest) {
    const [tag, key, value, ...more] = line.split('\t');
    const m = MetadataLine.safeParse({ key, value });
    if (tag !== 'x' || more.length || !m.success || entries.has(m.data.key)) throw new AgentProtocolError('stat metadata line: not `x KEY VALUE` of a new, valid key');
    entries.set(m.data.key, m.data.value);
  }
  const metadata = Object.fromEntries(entries);
  const v = r.data;
  return { type: TYPES[v.type], size: v.size, mode: parseInt(v.mode, 8), mtimeMs: v.mtimeMs, target: v.type === 'l' ? v.target : null, ...owner, ...(rest.length ? { metadata } : {}) };
}


const DirLine = z.object({
  name: z.string().min(1).max(255).refine((n) => !n.includes('/') && n !== '.' && n !== '..', 'a file name'),
  type: z.enum(['d', 'f', 'l', 'o']),
  size: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
});
const TYPES = { d: 'dir', f: 'file', l: 'link', o: 'other' } as const;

export function parseDir(payload: Buffer): DirEntry[] {
  return payload
    .toString('utf8')
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const [name, type, size] = line.split('\t');
      const r = DirLine.safeParse({ name, type, size });
      if (!r.success) throw new AgentProtocolError(`directory listing line: ${r.error.issues[0]?.message ?? 'invalid'}`);
      return { name: r.data.name, type: TYPES[r.data.type], size: r.data.size };
    });
}
