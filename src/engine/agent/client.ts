import { connect, type Socket } from 'node:net';
import { AgentClosedError, AgentError, AgentProtocolError, AgentTimeoutError } from '../../seam/errors.js';
import { ENOENT, newProcessId, type AgentPort, type OwnerModeChange, type ProcessListener, type UnixIds, type WatchListener } from '../../seam/agent.js';
import { decodeFrame, parseDir, parseList, parseStat, type AgentMessage, type AgentProcessInfo, type DirEntry, type FileStat } from './frames.js';
import { AS_USER, FrameDecoder, T, WRITE_TRUNCATE, encodeFrame, encodeIds, encodeSpawn, type SpawnRequest } from './protocol.js';

/** FP_PING_DUMP_FOLLOWS (native/protocol.h). */
const PING_DUMP_FOLLOWS = 1;

export { AgentClosedError, AgentError, AgentProtocolError, AgentTimeoutError } from '../../seam/errors.js';

export type { ProcessListener } from '../../seam/agent.js';

export interface ClientEvents {
  /** The connection is gone; `expected` when `close()` asked for it. */
  onClose?(expected: boolean): void;
  /** The agent broke the protocol, or handling its message threw: the connection was closed. */
  onFailure?(err: Error): void;
}

interface Pending {
  resolve(msg: AgentMessage): void;
  reject(err: Error): void;
  timer: NodeJS.Timeout;
}

/** How long the agent may take to answer a request before the connection is given up. */
export const REQUEST_TIMEOUT_MS = 30_000;

/**
 * One multiplexed connection to a sandbox's agent. Closed before every dump: CRIU cannot dump
 * a unix socket whose peer is outside the sandbox. Everything the agent sends is validated
 * (frames.ts); anything else closes this connection, and no exception leaves it.
 */
export class AgentClient implements AgentPort {
  private readonly decoder = new FrameDecoder();
  private readonly listeners = new Map<number, ProcessListener>();
  private readonly watchers = new Map<number, WatchListener>();
  private readonly pending = new Map<number, Pending>();
  private closed = false;
  private closing = false;
  private readonly closeWaiters: (() => void)[] = [];

  private constructor(
    private readonly socket: Socket,
    private readonly events: ClientEvents,
  ) {
    socket.on('data', (chunk: Buffer) => this.receive(chunk));
    socket.on('close', () => this.onClose());
    socket.on('error', () => {});
  }

  /** Connects to a socket path the caller vouches for (see agent/socket.ts for a sandbox's). */
  static async connect(path: string, events: ClientEvents = {}, timeoutMs = 5000): Promise<AgentClient> {
    return new AgentClient(await AgentClient.connectSocket(path, timeoutMs), events);
  }

  /** A connection to a socket path the caller vouches for, with no client on it yet (`over`
   * takes it later): a warm standby's, made before it is frozen. */
  static connectSocket(path: string, timeoutMs = 5000): Promise<Socket> {
    return new Promise((resolve, reject) => {
      const socket = connect(path);
      const timer = setTimeout(() => socket.destroy(new AgentTimeoutError(`the agent did not accept a connection within ${timeoutMs} ms`)), timeoutMs);
      socket.once('connect', () => {
        clearTimeout(timer);
        socket.setNoDelay(true);
        resolve(socket);
      });
      socket.once('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
    });
  }

  /** Over a socket already connected to an agent (one the engine started with it: a volume's
   * file agent). */
  static over(socket: Socket, events: ClientEvents = {}): AgentClient {
    socket.setNoDelay?.(true);
    return new AgentClient(socket, events);
  }

  get isOpen(): boolean {
    return !this.closed;
  }

  static newProcessId(): number {
    return newProcessId();
  }

  /** The last line of defence: whatever goes wrong with this connection's input stays here. */
  private receive(chunk: Buffer): void {
    try {
      for (const frame of this.decoder.push(chunk)) {
        if (this.closed) return;
        this.dispatch(decodeFrame(frame));
      }
    } catch (err) {
      this.fail(err instanceof Error ? err : new AgentProtocolError(String(err)));
    }
  }

  private fail(err: Error): void {
    if (this.closed) return;
    this.socket.destroy();
    try {
      this.events.onFailure?.(err);
    } catch {
      // the owner's handler must not bring the process down either
    }
  }

  private dispatch(m: AgentMessage): void {
    if (m.kind === 'output') {
      this.listeners.get(m.id)?.onOutput(m.stream, m.offset, m.data);
      return;
    }
    if (m.kind === 'watch') {
      this.watchers.get(m.id)?.onEvent({ op: m.op, name: m.name });
      return;
    }
    if (m.kind === 'exit') {
      const l = this.listeners.get(m.id);
      this.listeners.delete(m.id);
      l?.onExit(m.code, m.signal);
      return;
    }
    const p = this.pending.get(m.id);
    if (p) {
      this.pending.delete(m.id);
      clearTimeout(p.timer);
      if (m.kind === 'error') p.reject(new AgentError(m.errno, m.message));
      else p.resolve(m);
      return;
    }
    if (m.kind === 'error' && this.watchers.has(m.id) && !this.pending.has(m.id)) {
      const w = this.watchers.get(m.id)!;
      this.watchers.delete(m.id);
      w.onEnd(new AgentError(m.errno, m.message));
      return;
    }
    if (m.kind === 'error') {
      const l = this.listeners.get(m.id);
      this.listeners.delete(m.id);
      l?.onLost(new AgentError(m.errno, m.message));
    }
    // Anything else answers nothing we asked: ignored, as a late answer to a timed-out request is.
  }

  private onClose(): void {
    this.closed = true;
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(new AgentClosedError());
    }
    this.pending.clear();
    this.listeners.clear();
    const watchers = [...this.watchers.values()];
    this.watchers.clear();
    for (const w of watchers) {
      try {
        w.onEnd(new AgentClosedError());
      } catch {
        // as below
      }
    }
    for (const w of this.closeWaiters.splice(0)) w();
    try {
      this.events.onClose?.(this.closing);
    } catch {
      // as in fail()
    }
  }

  /** A file operation, for a user when `as` says so (the agent wears its ids for it). */
  private fileRequest(type: number, payload: Buffer, as: UnixIds | undefined): Promise<AgentMessage> {
    const id = AgentClient.newProcessId();
    return as ? this.request(type, id, Buffer.concat([encodeIds(as), payload]), AS_USER) : this.request(type, id, payload);
  }

  private request(type: number, id: number, payload?: Buffer, flags = 0, timeoutMs = REQUEST_TIMEOUT_MS): Promise<AgentMessage> {
    if (this.closed) return Promise.reject(new AgentClosedError());
    return new Promise((resolve, reject) => {
      // An agent that does not answer in time cannot be trusted to be in step any more.
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new AgentTimeoutError(`the agent did not answer within ${timeoutMs} ms`));
        this.socket.destroy();
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.socket.write(encodeFrame(type, id, payload, flags));
    });
  }

  private send(type: number, id: number, payload?: Buffer, flags = 0): void {
    if (!this.closed) this.socket.write(encodeFrame(type, id, payload, flags));
  }

  /** Starts a process; the listener gets its output and exit. Resolves with its pid. */
  async spawn(id: number, req: SpawnRequest, listener: ProcessListener): Promise<number> {
    const { payload, flags } = encodeSpawn(req);
    this.listeners.set(id, listener);
    try {
      const m = await this.request(T.SPAWN, id, payload, flags);
      if (m.kind !== 'spawned') throw this.unexpected(m, 'spawned');
      return m.pid;
    } catch (err) {
      this.listeners.delete(id);
      throw err;
    }
  }

  /** An answer of the wrong kind: the agent is out of step, which is a protocol error. */
  private unexpected(m: AgentMessage, wanted: string): AgentProtocolError {
    const err = new AgentProtocolError(`the agent answered "${m.kind}" where "${wanted}" was due`);
    this.fail(err);
    return err;
  }

  /** Replays output from the given offsets, then streams; a gone process calls onLost. */
  attach(id: number, stdoutOffset: number, stderrOffset: number, listener: ProcessListener): void {
    const p = Buffer.alloc(16);
    p.writeBigUInt64LE(BigInt(stdoutOffset), 0);
    p.writeBigUInt64LE(BigInt(stderrOffset), 8);
    this.listeners.set(id, listener);
    this.send(T.ATTACH, id, p);
  }

  detach(id: number): void {
    this.listeners.delete(id);
    this.send(T.DETACH, id);
  }

  stdin(id: number, data: Buffer | string): void {
    const buf = typeof data === 'string' ? Buffer.from(data) : data;
    for (let off = 0; off < buf.length; off += 1 << 20) this.send(T.STDIN, id, buf.subarray(off, off + (1 << 20)));
  }

  closeStdin(id: number): void {
    this.send(T.STDIN, id, Buffer.alloc(0));
  }

  signal(id: number, signo: number, foreground = false): void {
    const p = Buffer.alloc(4);
    p.writeInt32LE(signo, 0);
    this.send(T.SIGNAL, id, p, foreground ? 1 : 0);
  }

  resize(id: number, rows: number, cols: number): void {
    const p = Buffer.alloc(4);
    p.writeUInt16LE(rows, 0);
    p.writeUInt16LE(cols, 2);
    this.send(T.RESIZE, id, p);
  }

  forget(id: number): void {
    this.send(T.FORGET, id);
  }

  async list(): Promise<AgentProcessInfo[]> {
    const m = await this.request(T.LIST, AgentClient.newProcessId());
    if (m.kind !== 'list') throw this.unexpected(m, 'list');
    return this.parsed(() => parseList(m.data));
  }

  /**
   * Calls `done` once the agent has answered a ping: right when the answer is dispatched, so
   * after every frame it sent before and before any it sends after (a promise would call back
   * a microtask later, behind frames read in the same chunk). Called on a close or a timeout
   * too: whoever waits is never left waiting.
   */
  barrier(done: () => void): void {
    let called = false;
    const once = () => {
      if (!called) {
        called = true;
        done();
      }
    };
    if (this.closed) return once();
    const id = AgentClient.newProcessId();
    const timer = setTimeout(() => {
      this.pending.delete(id);
      once();
    }, REQUEST_TIMEOUT_MS);
    this.pending.set(id, { resolve: once, reject: once, timer });
    this.socket.write(encodeFrame(T.PING, id));
  }

  /** `dumpFollows`: CRIU dumps the sandbox next; the agent lets it read its namespaces until
   * the engine connects again (native/agent.c, FP_T_PING). */
  async ping(opts: { dumpFollows?: boolean } = {}): Promise<void> {
    const m = await this.request(T.PING, AgentClient.newProcessId(), undefined, opts.dumpFollows ? PING_DUMP_FOLLOWS : 0);
    if (m.kind !== 'pong') throw this.unexpected(m, 'pong');
  }

  /** Creates or replaces a file inside the sandbox; the agent resolves the path in its root. */
  async writeFile(path: string, data: Buffer | string, mode = 0o600, as?: UnixIds): Promise<void> {
    const head = Buffer.alloc(4);
    head.writeUInt32LE(mode, 0);
    const m = await this.fileRequest(T.WRITE_FILE, Buffer.concat([head, Buffer.from(`${path}\0`), Buffer.from(data)]), as);
    if (m.kind !== 'ok') throw this.unexpected(m, 'ok');
  }

  /** Reads up to `max` bytes of a file inside the sandbox, from `offset` on (agents older than
   * READ_AT answer offsets with EINVAL); undefined when it does not exist. */
  async readFile(path: string, max: number, offset = 0, as?: UnixIds): Promise<{ data: Buffer; truncated: boolean } | undefined> {
    const head = Buffer.alloc(offset ? 12 : 4);
    head.writeUInt32LE(max, 0);
    if (offset) head.writeBigUInt64LE(BigInt(offset), 4);
    try {
      const m = await this.fileRequest(offset ? T.READ_AT : T.READ_FILE, Buffer.concat([head, Buffer.from(`${path}\0`)]), as);
      if (m.kind !== 'file') throw this.unexpected(m, 'file');
      if (m.data.length > max) throw this.unexpected(m, `file of at most ${max} bytes`);
      return { data: Buffer.from(m.data), truncated: m.truncated };
    } catch (err) {
      if (err instanceof AgentError && err.errno === ENOENT) return undefined;
      throw err;
    }
  }

  /** Writes a piece of a file at `offset`; `truncate` creates or empties it first (the first
   * piece of a file streamed in). Agents older than WRITE_AT answer EINVAL. */
  async writeAt(path: string, offset: number, data: Buffer, opts: { truncate: boolean; mode?: number }, as?: UnixIds): Promise<void> {
    const head = Buffer.alloc(16);
    head.writeUInt32LE(opts.mode ?? 0o644, 0);
    head.writeUInt32LE(opts.truncate ? WRITE_TRUNCATE : 0, 4);
    head.writeBigUInt64LE(BigInt(offset), 8);
    const m = await this.fileRequest(T.WRITE_AT, Buffer.concat([head, Buffer.from(`${path}\0`), data]), as);
    if (m.kind !== 'ok') throw this.unexpected(m, 'ok');
  }

  async rename(from: string, to: string, as?: UnixIds): Promise<void> {
    const m = await this.fileRequest(T.RENAME, Buffer.from(`${from}\0${to}\0`), as);
    if (m.kind !== 'ok') throw this.unexpected(m, 'ok');
  }

  /** What is at `path` (not following a final symlink); undefined when nothing is. */
  async stat(path: string, as?: UnixIds): Promise<FileStat | undefined> {
    try {
      const m = await this.fileRequest(T.STAT, Buffer.from(`${path}\0`), as);
      if (m.kind !== 'file') throw this.unexpected(m, 'file');
      return this.parsed(() => parseStat(m.data));
    } catch (err) {
      if (err instanceof AgentError && err.errno === ENOENT) return undefined;
      throw err;
    }
  }

  /** Removes a file or an empty directory; a missing one is no error. */
  async removeFile(path: string, as?: UnixIds): Promise<void> {
    const m = await this.fileRequest(T.REMOVE_FILE, Buffer.from(`${path}\0`), as);
    if (m.kind !== 'ok') throw this.unexpected(m, 'ok');
  }

  async listDir(path: string, as?: UnixIds): Promise<DirEntry[]> {
    const m = await this.fileRequest(T.LIST_DIR, Buffer.from(`${path}\0`), as);
    if (m.kind !== 'file') throw this.unexpected(m, 'file');
    return this.parsed(() => parseDir(m.data));
  }

  async mkdir(path: string, as?: UnixIds): Promise<void> {
    const m = await this.fileRequest(T.MKDIR, Buffer.from(`${path}\0`), as);
    if (m.kind !== 'ok') throw this.unexpected(m, 'ok');
  }

  async setMetadata(path: string, metadata: Record<string, string>, as?: UnixIds): Promise<void> {
    const lines = Object.entries(metadata).map(([k, v]) => `${k}\t${v}\n`).join('');
    const m = await this.fileRequest(T.SET_METADATA, Buffer.from(`${path}\0${lines}`), as);
    if (m.kind !== 'ok') throw this.unexpected(m, 'ok');
  }

  async setOwnerMode(path: string, change: OwnerModeChange): Promise<void> {
    const head = Buffer.alloc(16);
    head.writeUInt32LE((change.uid === undefined ? 0 : 1) | (change.gid === undefined ? 0 : 2) | (change.mode === undefined ? 0 : 4), 0);
    head.writeUInt32LE(change.uid ?? 0, 4);
    head.writeUInt32LE(change.gid ?? 0, 8);
    head.writeUInt32LE((change.mode ?? 0) & 0o7777, 12);
    const m = await this.fileRequest(T.SET_OWNER_MODE, Buffer.concat([head, Buffer.from(`${path}\0`)]), undefined);
    if (m.kind !== 'ok') throw this.unexpected(m, 'ok');
  }

  async watch(id: number, path: string, recursive: boolean, listener: WatchListener): Promise<void> {
    const head = Buffer.alloc(4);
    head.writeUInt32LE(recursive ? 1 : 0, 0);
    // Listening before the answer: the first events may come in the same chunk as the OK.
    this.watchers.set(id, listener);
    try {
      const m = await this.request(T.WATCH, id, Buffer.concat([head, Buffer.from(`${path}\0`)]));
      if (m.kind !== 'ok') throw this.unexpected(m, 'ok');
    } catch (err) {
      this.watchers.delete(id);
      throw err;
    }
  }

  unwatch(id: number): void {
    if (this.watchers.delete(id)) this.send(T.UNWATCH, id);
  }

  /** Parses an answer's body; one that does not parse is a protocol error like a bad frame. */
  private parsed<R>(parse: () => R): R {
    try {
      return parse();
    } catch (err) {
      if (err instanceof AgentProtocolError) this.fail(err);
      throw err;
    }
  }

  /** Closes the connection and resolves once the agent has closed its end too: CRIU cannot
   * dump a socket whose peer is gone but not yet released ("Unix socket N not found"), and a
   * warm CRIU starts dumping right away. A silent agent is cut off after `graceMs`. */
  close(graceMs = 1000): Promise<void> {
    if (this.closed) return Promise.resolve();
    this.closing = true;
    return new Promise((resolve) => {
      // No grace: the connection is dropped at once (an agent about to be killed need not
      // answer the close).
      const force = graceMs > 0 ? setTimeout(() => this.socket.destroy(), graceMs) : undefined;
      force?.unref();
      this.closeWaiters.push(() => {
        clearTimeout(force);
        resolve();
      });
      if (force) this.socket.end();
      else this.socket.destroy();
    });
  }
}
