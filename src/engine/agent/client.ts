import { connect, type Socket } from 'node:net';
import { randomInt } from 'node:crypto';
import {
  ENOENT,
  FrameDecoder,
  T,
  encodeFrame,
  encodeSpawn,
  parseDir,
  parseList,
  type AgentProcessInfo,
  type DirEntry,
  type Frame,
  type SpawnRequest,
} from './protocol.js';

export class AgentError extends Error {
  override readonly name = 'AgentError';
  constructor(
    readonly errno: number,
    message: string,
  ) {
    super(message);
  }
}

/** The connection closed before the answer came: a pause, or the sandbox went away. */
export class AgentClosedError extends Error {
  override readonly name = 'AgentClosedError';
  constructor() {
    super('agent connection closed');
  }
}

export interface ProcessListener {
  onOutput(stream: 1 | 2, offset: number, data: Buffer): void;
  onExit(exitCode: number, signal: number): void;
  /** The agent no longer knows the process (the sandbox was rolled back or restarted). */
  onLost(err: AgentError): void;
}

interface Pending {
  resolve(frame: Frame): void;
  reject(err: Error): void;
}

/** One multiplexed connection to a sandbox's agent. Closed before every dump: CRIU cannot
 * dump a unix socket whose peer is outside the sandbox. */
export class AgentClient {
  private readonly decoder = new FrameDecoder();
  private readonly listeners = new Map<number, ProcessListener>();
  private readonly pending = new Map<number, Pending>();
  private closed = false;
  private readonly closeWaiters: (() => void)[] = [];

  private constructor(private readonly socket: Socket) {
    socket.on('data', (chunk: Buffer) => {
      let frames: Frame[];
      try {
        frames = this.decoder.push(chunk);
      } catch (err) {
        socket.destroy(err as Error);
        return;
      }
      for (const f of frames) this.dispatch(f);
    });
    socket.on('close', () => this.onClose());
    socket.on('error', () => {});
  }

  static connect(path: string, timeoutMs = 5000): Promise<AgentClient> {
    return new Promise((resolve, reject) => {
      const socket = connect(path);
      const timer = setTimeout(() => socket.destroy(new Error(`agent at ${path} did not answer`)), timeoutMs);
      socket.once('connect', () => {
        clearTimeout(timer);
        socket.setNoDelay(true);
        resolve(new AgentClient(socket));
      });
      socket.once('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
    });
  }

  get isOpen(): boolean {
    return !this.closed;
  }

  static newProcessId(): number {
    return randomInt(1, 0xffffffff);
  }

  private dispatch(f: Frame): void {
    if (f.type === T.OUTPUT) {
      const offset = Number(f.payload.readBigUInt64LE(0));
      this.listeners.get(f.id)?.onOutput(f.flags === 2 ? 2 : 1, offset, f.payload.subarray(8));
      return;
    }
    if (f.type === T.EXIT) {
      const l = this.listeners.get(f.id);
      this.listeners.delete(f.id);
      l?.onExit(f.payload.readInt32LE(0), f.payload.readInt32LE(4));
      return;
    }
    const p = this.pending.get(f.id);
    if (f.type === T.ERROR) {
      const err = new AgentError(f.payload.readInt32LE(0), f.payload.subarray(4).toString('utf8'));
      if (p) {
        this.pending.delete(f.id);
        p.reject(err);
        return;
      }
      const l = this.listeners.get(f.id);
      this.listeners.delete(f.id);
      l?.onLost(err);
      return;
    }
    if (p) {
      this.pending.delete(f.id);
      p.resolve(f);
    }
  }

  private onClose(): void {
    this.closed = true;
    for (const p of this.pending.values()) p.reject(new AgentClosedError());
    this.pending.clear();
    this.listeners.clear();
    for (const w of this.closeWaiters.splice(0)) w();
  }

  private request(type: number, id: number, payload?: Buffer, flags = 0): Promise<Frame> {
    if (this.closed) return Promise.reject(new AgentClosedError());
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
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
      const f = await this.request(T.SPAWN, id, payload, flags);
      return f.payload.readInt32LE(0);
    } catch (err) {
      this.listeners.delete(id);
      throw err;
    }
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
    const f = await this.request(T.LIST, AgentClient.newProcessId());
    return parseList(f.payload);
  }

  async ping(): Promise<void> {
    await this.request(T.PING, AgentClient.newProcessId());
  }

  /** Creates or replaces a file inside the sandbox; the agent resolves the path in its root. */
  async writeFile(path: string, data: Buffer | string, mode = 0o600): Promise<void> {
    const head = Buffer.alloc(4);
    head.writeUInt32LE(mode, 0);
    await this.request(T.WRITE_FILE, AgentClient.newProcessId(), Buffer.concat([head, Buffer.from(`${path}\0`), Buffer.from(data)]));
  }

  /** Reads up to `max` bytes of a file inside the sandbox; undefined when it does not exist. */
  async readFile(path: string, max: number): Promise<{ data: Buffer; truncated: boolean } | undefined> {
    const head = Buffer.alloc(4);
    head.writeUInt32LE(max, 0);
    try {
      const f = await this.request(T.READ_FILE, AgentClient.newProcessId(), Buffer.concat([head, Buffer.from(`${path}\0`)]));
      return { data: Buffer.from(f.payload), truncated: f.flags === 1 };
    } catch (err) {
      if (err instanceof AgentError && err.errno === ENOENT) return undefined;
      throw err;
    }
  }

  /** Removes a file or an empty directory; a missing one is no error. */
  async removeFile(path: string): Promise<void> {
    await this.request(T.REMOVE_FILE, AgentClient.newProcessId(), Buffer.from(`${path}\0`));
  }

  async listDir(path: string): Promise<DirEntry[]> {
    return parseDir((await this.request(T.LIST_DIR, AgentClient.newProcessId(), Buffer.from(`${path}\0`))).payload);
  }

  async mkdir(path: string): Promise<void> {
    await this.request(T.MKDIR, AgentClient.newProcessId(), Buffer.from(`${path}\0`));
  }

  /** Closes the connection and resolves once the agent has closed its end too: CRIU cannot
   * dump a socket whose peer is gone but not yet released ("Unix socket N not found"), and a
   * warm CRIU starts dumping right away. A silent agent is cut off after `graceMs`. */
  close(graceMs = 1000): Promise<void> {
    if (this.closed) return Promise.resolve();
    return new Promise((resolve) => {
      const force = setTimeout(() => this.socket.destroy(), graceMs);
      force.unref();
      this.closeWaiters.push(() => {
        clearTimeout(force);
        resolve();
      });
      this.socket.end();
    });
  }
}
