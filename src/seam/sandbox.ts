import type { AgentPort, AgentProcessInfo, ProcessListener, SpawnRequest } from './agent.js';

export interface Subscription {
  /** Stops following (the process runs on). */
  close(): void;
}

export interface SubscribeOptions {
  survivesRollback?: boolean;
  /** Called once the scrollback from `offsets` on has been delivered (then output is live). */
  onReplayed?: () => void;
}

/**
 * The live side of one running sandbox, as the core sees it: its PID 1 and the way to its
 * agent. During a pause (checkpoint, rollback) callers wait at a gate and the processes
 * followed are picked up again afterwards; that is the implementation's business.
 */
export interface SandboxHandle {
  readonly id: string;
  readonly pid: number;
  readonly startTime: string;
  /** Holds new callers back until the returned release is called (or a pause takes over). */
  hold(): () => void;
  /** The connection, once no pause is under way. */
  agent(): Promise<AgentPort>;
  /** Runs an idempotent request (files, listings); one cut by a pause is sent again after it. */
  call<T>(request: (agent: AgentPort) => Promise<T>): Promise<T>;
  /** A connection of its own, for readers that must not share the main one's subscriptions. */
  sideAgent(): Promise<AgentPort>;
  releaseSide(agent: AgentPort): void;
  /** Starts a process and follows it until it exits or is lost; resolves to its pid. */
  start(id: number, req: SpawnRequest, listener: ProcessListener, opts?: { survivesRollback?: boolean }): Promise<number>;
  /** Follows a running process from the given offsets on. */
  follow(id: number, offsets: [number, number], listener: ProcessListener): Promise<void>;
  subscribe(id: number, offsets: [number, number], listener: ProcessListener, opts?: SubscribeOptions): Promise<Subscription>;
  /** Stops following a process (it runs on). */
  untrack(id: number): void;
  list(): Promise<AgentProcessInfo[]>;
}
