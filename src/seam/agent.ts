import { randomInt } from 'node:crypto';

/** What the core may ask of a sandbox's agent: processes and files, by plain data. The engine's
 * agent client implements it over the sandbox's socket (every frame checked there); a fake
 * engine implements it in memory. */

/** What `setOwnerMode` changes: the sandbox's own ids, permission bits. */
export interface OwnerModeChange {
  uid?: number;
  gid?: number;
  mode?: number;
}

export interface ProcessListener {
  onOutput(stream: 1 | 2, offset: number, data: Buffer): void;
  onExit(exitCode: number, signal: number): void;
  /** The agent no longer knows the process (the sandbox was rolled back or restarted). */
  onLost(err: Error): void;
}

/** A user of the sandbox by its own ids (inside its user namespace), as read from its
 * /etc/passwd and /etc/group: who a process runs as, or a file operation is done for. */
export interface UnixIds {
  uid: number;
  gid: number;
  /** Supplementary groups, at most MAX_GROUPS. */
  groups: number[];
}

/** native/protocol.h FP_MAX_GROUPS. */
export const MAX_GROUPS = 32;

export interface SpawnRequest {
  argv: string[];
  env: string[];
  cwd: string;
  pty?: { rows: number; cols: number; echo: boolean } | undefined;
  /** Runs as this user (all its ids); the agent's own root when absent. */
  user?: UnixIds | undefined;
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

export interface FileStat {
  type: 'dir' | 'file' | 'link' | 'other';
  size: number;
  mode: number;
  mtimeMs: number;
  /** Where a symlink points (as written in it). */
  target: string | null;
  /** User-defined metadata (envd's), kept on the file as `user.e2b.*` xattrs. */
  metadata?: Record<string, string>;
  /** The owner's ids, the sandbox's own (agents before them: absent). */
  uid?: number;
  gid?: number;
}

/** What a metadata key and value may be: an HTTP header's name and printable ASCII (they
 * travel as `X-Metadata-<key>` headers), within the agent's bounds (native/agent_files.c). */
export const METADATA_KEY = /^[A-Za-z0-9!#$%&'*+\-.^_`|~]{1,128}$/;
export const METADATA_VALUE = /^[\x20-\x7e]{0,1024}$/;
export const MAX_METADATA_ENTRIES = 64;

export interface DirEntry {
  name: string;
  type: 'dir' | 'file' | 'link' | 'other';
  size: number;
}

/** What a directory watch reports, in the order of native/protocol.h's FP_WATCH_*. */
export const WATCH_OPS = ['create', 'write', 'remove', 'rename', 'chmod'] as const;
export type WatchOp = (typeof WATCH_OPS)[number];

export interface WatchEvent {
  op: WatchOp;
  /** Relative to the watched directory ("sub/file" below it in a recursive watch). */
  name: string;
}

export interface WatchListener {
  onEvent(event: WatchEvent): void;
  /** The watch ended: the connection closed, the sandbox is being checkpointed, or the agent
   * gave it up (its queue overflowed). Called once, and nothing follows it. */
  onEnd(err: Error): void;
}

/** The errno an agent answers for a path that is not there. */
export const ENOENT = 2;

/** A process id the core picks for a spawn (the agent's key for it, not a pid). */
export function newProcessId(): number {
  return randomInt(1, 0xffffffff);
}

/** One connection to a sandbox's agent. */
export interface AgentPort {
  readonly isOpen: boolean;
  spawn(id: number, req: SpawnRequest, listener: ProcessListener): Promise<number>;
  /** Follows a process from the given offsets on: its scrollback from there is replayed. */
  attach(id: number, stdoutOffset: number, stderrOffset: number, listener: ProcessListener): void;
  detach(id: number): void;
  stdin(id: number, data: Buffer | string): void;
  closeStdin(id: number): void;
  signal(id: number, signo: number, foreground?: boolean): void;
  resize(id: number, rows: number, cols: number): void;
  forget(id: number): void;
  list(): Promise<AgentProcessInfo[]>;
  /** Answered once every frame sent before it has been handled. */
  ping(): Promise<void>;
  // The file operations take `as`: done with that user's permissions, and what they create is
  // that user's (the agent's own root when absent).
  writeFile(path: string, data: Buffer | string, mode?: number, as?: UnixIds): Promise<void>;
  readFile(path: string, max: number, offset?: number, as?: UnixIds): Promise<{ data: Buffer; truncated: boolean } | undefined>;
  writeAt(path: string, offset: number, data: Buffer, opts: { truncate: boolean; mode?: number }, as?: UnixIds): Promise<void>;
  rename(from: string, to: string, as?: UnixIds): Promise<void>;
  stat(path: string, as?: UnixIds): Promise<FileStat | undefined>;
  removeFile(path: string, as?: UnixIds): Promise<void>;
  listDir(path: string, as?: UnixIds): Promise<DirEntry[]>;
  mkdir(path: string, as?: UnixIds): Promise<void>;
  /** Sets user-defined metadata on a file (agents older than it: EINVAL, unknown frame type). */
  setMetadata(path: string, metadata: Record<string, string>, as?: UnixIds): Promise<void>;
  /** Changes the owner and, but for a link, the mode of what `path` names (a link is not
   * followed); what is absent stays. */
  setOwnerMode(path: string, change: OwnerModeChange): Promise<void>;
  /** Watches a directory (and, `recursive`, those below it, as they come); resolves once the
   * watch is in place. Ends with the connection, or by `unwatch`. */
  watch(id: number, path: string, recursive: boolean, listener: WatchListener): Promise<void>;
  unwatch(id: number): void;
}
