import { spawn, type ChildProcess } from 'node:child_process';
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import type { AgentPort } from '../seam/agent.js';
import { EngineError } from '../seam/errors.js';
import { AgentClient } from './agent/client.js';

/** How long a volume's file agent waits for the next call before it ends. */
const IDLE_MS = 15_000;
/** What of its complaints is kept for the log when it fails to start. */
const STDERR_BYTES = 4096;

interface Running {
  child: ChildProcess;
  agent: AgentClient;
  busy: number;
  idle?: NodeJS.Timeout;
  stderr: string;
}

/**
 * The file agents of volumes that no sandbox serves (native/volume_files.c): `fp-agent
 * volume-files DIR`, rooted in the volume's directory in a mount namespace of its own, speaking
 * the agent protocol on a socket the engine made with it. One per volume, started by the first
 * call, shared by those that overlap, ended when idle or when the volume goes.
 */
export class VolumeFileAgents {
  private readonly running = new Map<string, Running>();
  /** Volumes being removed: no file agent starts for them meanwhile (its mount would hold the
   * volume's filesystem, and the removal fail as if a sandbox mounted it). */
  private readonly removing = new Set<string>();

  constructor(
    private readonly agentPath: string,
    private readonly log: Logger,
  ) {}

  async call<T>(id: string, dir: string, request: (agent: AgentPort) => Promise<T>): Promise<T> {
    if (this.removing.has(id)) throw new EngineError('VOLUME_NOT_HERE', `volume ${id} is being deleted`);
    const r = this.running.get(id) ?? this.start(id, dir);
    r.busy++;
    clearTimeout(r.idle);
    try {
      return await request(r.agent);
    } catch (err) {
      if (!r.agent.isOpen) throw new EngineError('AGENT_UNREACHABLE', `the file agent of volume ${id} ended${r.stderr ? `: ${r.stderr.trim()}` : ''}`, undefined, { cause: err });
      throw err;
    } finally {
      r.busy--;
      if (r.busy === 0 && this.running.get(id) === r) r.idle = setTimeout(() => this.end(id), IDLE_MS).unref();
    }
  }

  private start(id: string, dir: string): Running {
    // fd 3 is a socket pair: libuv makes an extra 'pipe' of stdio with socketpair(2).
    const child = spawn(this.agentPath, ['volume-files', dir], { stdio: ['ignore', 'ignore', 'pipe', 'pipe'] });
    const r: Running = { child, agent: AgentClient.over(child.stdio[3] as Socket), busy: 0, stderr: '' };
    child.stderr!.on('data', (chunk: Buffer) => {
      if (r.stderr.length < STDERR_BYTES) r.stderr += chunk.toString('utf8').slice(0, STDERR_BYTES - r.stderr.length);
    });
    child.once('exit', (code, signal) => {
      if (this.running.get(id) === r) this.running.delete(id);
      clearTimeout(r.idle);
      void r.agent.close().catch(() => {});
      if (code !== 0 && signal !== 'SIGKILL') this.log.warn({ volume: id, code, signal, stderr: r.stderr.trim() }, 'a volume\'s file agent failed');
    });
    child.once('error', (err) => this.log.warn({ err, volume: id }, 'a volume\'s file agent did not start'));
    this.running.set(id, r);
    return r;
  }

  /** Ends the volume's file agent, if one runs, and waits for it to be gone (its mount of the
   * volume with it). */
  async end(id: string): Promise<void> {
    const r = this.running.get(id);
    if (!r) return;
    this.running.delete(id);
    clearTimeout(r.idle);
    if (r.child.exitCode === null && r.child.signalCode === null) {
      const gone = new Promise<void>((resolve) => r.child.once('exit', () => resolve()));
      r.child.kill('SIGKILL');
      await gone;
    }
    await r.agent.close().catch(() => {});
  }

  /** Runs `removal` with the volume's file agent ended and none started until it is over. */
  async whileRemoving<T>(id: string, removal: () => Promise<T>): Promise<T> {
    this.removing.add(id);
    try {
      await this.end(id);
      return await removal();
    } finally {
      this.removing.delete(id);
    }
  }

  async endAll(): Promise<void> {
    await Promise.all([...this.running.keys()].map((id) => this.end(id)));
  }
}
