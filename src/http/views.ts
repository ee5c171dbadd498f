import type { FileInfo } from '../core/files.js';
import type { ExecutionState } from '../core/executions.js';
import type { ExecResult } from '../core/process/exec-once.js';
import type { JsonField, OutputEncoding } from './output-json.js';
import type { DurableState } from '../core/durable.js';
import type { CheckpointRecord } from '../store/checkpoints.js';
import type { InstanceRecord } from '../store/instances.js';
import type { VolumeView } from '../core/volumes.js';

/** Records to the snake_case wire shapes of the Firecase-style face. `net`: the instance's
 * network counters (fp.instances.networkCounters), null where this node does not have them. */
export const instanceView = (r: InstanceRecord, net: { sentBytes: number; receivedBytes: number } | null) => ({
  id: r.id,
  name: r.name,
  image: r.imageRef ?? r.image,
  status: r.status,
  env: r.env,
  limits: { memory_mb: r.limits.memoryMb, pids: r.limits.pids, cpu_percent: r.limits.cpuPercent, disk_mb: r.limits.diskMb ?? null },
  metadata: r.metadata,
  max_checkpoints: r.maxCheckpoints,
  idle_timeout_s: r.idleTimeoutS,
  network: { address: r.address, egress: r.egress.egress, allow: r.egress.allow, deny: r.egress.deny, sent_bytes: net?.sentBytes ?? null, received_bytes: net?.receivedBytes ?? null },
  head_checkpoint_id: r.headCheckpointId,
  source_instance_id: r.sourceInstanceId,
  source_checkpoint_id: r.sourceCheckpointId,
  warm_fork: r.warmFork,
  error: r.error,
  node: r.node,
  user_namespace: r.uidBase !== null,
  volumes: r.volumes.map((v) => ({ name: v.name, path: v.path, read_only: v.readOnly })),
  secrets: r.secrets.map((x) => ({ name: x.name, env: x.env, hosts: x.hosts })),
  created_at: r.createdAt,
  updated_at: r.updatedAt,
});

export const checkpointView = (c: CheckpointRecord, durable: DurableState = { durable: false, uploadedBytes: null }) => ({
  id: c.id,
  instance_id: c.instanceId,
  label: c.label,
  status: c.status,
  memory: c.memory,
  parent_id: c.parentId,
  delta_bytes: c.deltaBytes,
  memory_bytes: c.memoryBytes,
  pause_ms: c.pauseMs,
  error: c.error,
  created_at: c.createdAt,
  ready_at: c.readyAt,
  durable: durable.durable,
  uploaded_bytes: durable.uploadedBytes,
});

/** An exec result as the fields of its JSON answer (outputs streamed when large: output-json.ts). */
export const execFields = (r: ExecResult, encoding: OutputEncoding): JsonField[] => [
  ['exit_code', r.exitCode],
  ['stdout', r.stdout],
  ['stderr', r.stderr],
  ['output_encoding', encoding],
  ['duration_ms', r.durationMs],
  ['timed_out', r.timedOut],
  ['truncated', r.truncated],
];

/** An execution as the process routes show it (by the agent's number for it). */
export const processView = (s: ExecutionState) => ({
  process_id: s.record.processId,
  exec_id: s.record.id,
  pid: s.pid,
  status: s.running ? ('running' as const) : ('exited' as const),
  exit_code: s.exitCode,
  signal: s.signal,
  pty: s.record.kind === 'pty',
  stdout_bytes: s.stdoutBytes,
  stderr_bytes: s.stderrBytes,
  command: commandLine(s.record.argv),
});

/** A command as one line: `sh -c SCRIPT` as its script, as it was given. */
const commandLine = (argv: readonly string[]) => (argv.length === 3 && argv[0] === '/bin/sh' && argv[1] === '-c' ? argv[2]! : argv.join(' '));

export const fileInfoView = (f: FileInfo) => ({
  path: f.path,
  type: f.type,
  size: f.size,
  mode: f.mode,
  mtime_ms: f.mtimeMs,
  target: f.target,
});

export const volumeView = (v: VolumeView) => ({
  id: v.id,
  name: v.name,
  size_mb: v.sizeMb,
  used_bytes: v.usedBytes,
  node: v.node,
  instances: v.instances,
  created_at: v.createdAt,
});
