/** Engine failures, with a code the core maps to an API error. The engine knows nothing of HTTP.
 * Part of the seam: the core tells failures apart by these classes and codes alone. */
export type EngineErrorCode =
  | 'MOUNT_FAILED'
  | 'UNMOUNT_FAILED'
  | 'LAYER_LIMIT'
  | 'BOOT_FAILED'
  | 'DUMP_FAILED'
  | 'RESTORE_FAILED'
  | 'AGENT_UNREACHABLE'
  /** The agent broke the protocol (a malformed frame): its connection is closed, the
   * sandbox is not trusted to answer again until it is rolled back or restarted. */
  | 'AGENT_BROKEN'
  /** A lazily restored sandbox whose memory could not all come in (its lazy-pages daemon
   * failed): its processes were killed rather than read zeros; it answers nothing until it is
   * rolled back or restarted. */
  | 'MEMORY_LOST'
  /** A step did not finish within its deadline; the operation was abandoned. */
  | 'TIMEOUT'
  | 'PROCESS_LOST'
  | 'SPAWN_FAILED'
  | 'NOT_RUNNING'
  | 'CGROUP_FAILED'
  | 'CRIU_FAILED'
  /** Setting up a sandbox's network (its link, the host's firewall) failed. */
  | 'NETWORK_FAILED'
  /** A files-only checkpoint could not copy the sandbox's upper in a short freeze (too large,
   * or the copy failed): the sandbox runs on untouched; freeze the upper by rename instead. */
  | 'UPPER_NOT_COPIED'
  /** A persistent volume still mounted by a sandbox (it cannot be removed). */
  | 'VOLUME_BUSY'
  /** A persistent volume this node does not hold. */
  | 'VOLUME_NOT_HERE';

export class EngineError extends Error {
  override readonly name = 'EngineError';
  constructor(
    readonly code: EngineErrorCode,
    message: string,
    readonly log?: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** Why an image could not be pulled from its registry. */
export type PullFailure = 'DENIED' | 'NOT_IN_REGISTRY' | 'UNREACHABLE' | 'CORRUPT' | 'TOO_LARGE' | 'NO_PLATFORM' | 'FAILED';

/** A pull from a registry failed; nothing of it is kept. */
export class PullError extends Error {
  override readonly name = 'PullError';
  constructor(
    readonly reason: PullFailure,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** The agent refused the request, with an errno from inside the sandbox. */
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
  constructor(message = 'agent connection closed') {
    super(message);
  }
}

/** No answer within the request's deadline; the connection was given up. */
export class AgentTimeoutError extends Error {
  override readonly name = 'AgentTimeoutError';
}

/** The agent sent something that is not the protocol; the connection was closed. */
export class AgentProtocolError extends Error {
  override readonly name = 'AgentProtocolError';
}
