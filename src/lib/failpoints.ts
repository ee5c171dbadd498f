/**
 * Points in the middle of checkpoints, rollbacks, forks, hibernations and builds where a test can
 * make the server die exactly as `kill -9` would, to test what a restart makes of each phase
 * instead of hoping a timed kill lands in it. Armed only by FORKPOINT_FAILPOINTS (a comma-separated
 * list of names), which nothing but the tests sets; unarmed, a failpoint is one Set lookup.
 */
export const FAILPOINTS = [
  /** Checkpoint: connections closed, the sandbox about to be dumped (the freeze). */
  'checkpoint.paused',
  /** Checkpoint: dumped (the sandbox gone), its upper not yet renamed into a layer. */
  'checkpoint.dumped',
  /** Checkpoint: the upper renamed into the new layer, nothing restored yet. */
  'checkpoint.renamed',
  /** Checkpoint: the sandbox restored on the new layer (thawed), the store not yet told. */
  'checkpoint.restored',
  /** Files-only checkpoint: the sandbox frozen, its upper not yet copied. */
  'checkpoint.frozen',
  /** Files-only checkpoint: the upper copied into the new layer, the sandbox still frozen. */
  'checkpoint.copied',
  /** Memory checkpoint (copied upper): the sandbox thawed, its image still in memory (the
   * staging tmpfs), not yet on disk. */
  'checkpoint.staged',
  /** Rollback: the old sandbox killed, the checkpoint not yet restored. */
  'rollback.killed',
  /** Rollback: the checkpoint restored, the store not yet told. */
  'rollback.restored',
  /** Warm rollback: the host's route moved to the standby's link, the old sandbox killed,
   * nothing renamed. */
  'rollback.routed',
  /** Warm rollback: the standby's disk and groups renamed into the instance's, still frozen. */
  'rollback.swapped',
  /** Fork: the fork's sandbox restored, the store not yet told it runs. */
  'fork.restored',
  /** Hibernation: dumped, the upper not yet renamed. */
  'hibernate.dumped',
  /** Hibernation: the upper renamed into its layer, the store not yet told. */
  'hibernate.renamed',
  /** Build: a step's command has run in the build's sandbox, its layer not yet made. */
  'build.step-ran',
] as const;

export type Failpoint = (typeof FAILPOINTS)[number];

/** The names a comma-separated environment variable arms. */
const armedBy = (variable: string) => new Set((process.env[variable] ?? '').split(',').map((s) => s.trim()).filter(Boolean));

const armed = armedBy('FORKPOINT_FAILPOINTS');

/** Dies here, as by `kill -9`, if the test armed this point. */
export function failpoint(name: Failpoint): void {
  if (armed.has(name)) process.kill(process.pid, 'SIGKILL');
}

/**
 * Points just past a sandbox's launch where a test can make the launch fail as a link set-up or
 * the agent's connection failing would (the process tree runs, the call fails): what a failed
 * launch leaves must be nothing. Armed by FORKPOINT_FAULTS, which nothing but the tests sets.
 */
export const FAULTS = [
  /** A boot or a restore (create, fork, wake): launched, the agent not yet connected. */
  'launch.attach',
  /** A rollback: the checkpoint restored in the old sandbox's place, not yet running as it. */
  'rollback.launched',
] as const;

export type Fault = (typeof FAULTS)[number];

const armedFaults = armedBy('FORKPOINT_FAULTS');

/** Whether the test armed this fault (the caller fails there as it would for real). */
export function faultArmed(name: Fault): boolean {
  return armedFaults.has(name);
}
