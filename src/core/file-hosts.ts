import type { AgentPort } from '../seam/agent.js';

/** Where file operations run: an instance's sandbox, or a volume's own file agent. */
export interface FileHost {
  /** Runs an idempotent request on the agent (sent again if a pause cut it). */
  call<T>(request: (agent: AgentPort) => Promise<T>): Promise<T>;
}

/** Finds the host of an owner's object by its id (an instance's, a volume's). */
export interface FileHosts {
  host(owner: string, id: string): Promise<FileHost>;
}
