/** Engine failures, with a code the core maps to an API error. The engine knows nothing of HTTP. */
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
  /** A step did not finish within its deadline; the operation was abandoned. */
  | 'TIMEOUT'
  | 'PROCESS_LOST'
  | 'SPAWN_FAILED'
  | 'NOT_RUNNING'
  | 'CGROUP_FAILED'
  | 'CRIU_FAILED'
  /** Setting up a sandbox's network (its link, the host's firewall) failed. */
  | 'NETWORK_FAILED';

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
