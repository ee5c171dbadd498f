import type { Generated } from 'kysely';
/** The tables as the query builder sees them: one set of queries for SQLite and PostgreSQL.
 * Booleans are 0/1 integers and structured values JSON text in both, so that a row reads the
 * same whichever database holds it. */
export interface Tables {
  schema_migrations: { version: number; name: string; applied_at: string };
  tokens: {
    id: string;
    owner: string;
    name: string;
    secret_hash: Buffer;
    created_at: string;
    last_used_at: string | null;
    revoked_at: string | null;
  };
  instances: InstancesTable;
  checkpoints: CheckpointsTable;
  layers: { id: string; created_at: string; synced: number; pending_instance_id: string | null };
  layer_refs: { layer_id: string; holder: string };
  executions: {
    instance_id: string;
    id: string;
    process_id: number;
    kind: 'exec' | 'pty';
    argv: string;
    cwd: string;
    started_at: string;
    ended_at: string | null;
    exit_code: number | null;
    signal: number | null;
    timed_out: number;
  };
  port_forwards: {
    id: string;
    instance_id: string;
    owner: string;
    guest_port: number;
    host_port: number;
    protocol: 'tcp';
    label: string | null;
    created_at: string;
  };
  images: { owner: string; name: string; base: string; layers: string; config: string; build_key: string; created_at: string; pulled_bytes: number | string | null };
  volumes: { id: string; owner: string; name: string; size_mb: number; node: string; created_at: string };
  owner_secrets: { owner: string; name: string; sealed_value: string; created_at: string; updated_at: string };
  secret_stores: { id: string; owner: string; name: string; egress_allowlist: string; created_at: string; updated_at: string };
  secret_store_entries: { store_id: string; name: string; sealed_value: string; allowed_hosts: string; created_at: string; updated_at: string };
  registry_credentials: { owner: string; registry: string; username: string; sealed_password: string; created_at: string };
  build_cache: { owner: string; key: string; layers: string; config: string; used_at: string };
  templates: {
    owner: string;
    name: string;
    instance_id: string | null;
    checkpoint_id: string | null;
    source: string;
    start_command: string | null;
    status: 'building' | 'ready' | 'failed';
    error: string | null;
    created_at: string;
  };
  durable_checkpoints: { checkpoint_id: string; manifest: string; uploaded_bytes: number; durable_at: string };
  durable_blobs: { sha: string; bytes: number; created_at: string };
  durable_refs: { checkpoint_id: string; sha: string };
  layer_blobs: { layer_id: string; sha: string };
  nodes: { id: string; url: string; started_at: string; heartbeat_at: string; epoch: Generated<number>; draining: Generated<number> };
  secrets: { name: string; value: string; created_at: string };
}

export interface InstancesTable {
  id: string;
  owner: string;
  name: string;
  image: string;
  status: 'starting' | 'running' | 'hibernated' | 'stopped' | 'error' | 'lost';
  layers: string;
  base_layer: number;
  agent_layer: string;
  env: string;
  limits: string;
  metadata: string;
  pid: number | null;
  pid_start: string | null;
  source_instance_id: string | null;
  source_checkpoint_id: string | null;
  max_checkpoints: number | null;
  head_checkpoint_id: string | null;
  hibernation_id: string | null;
  idle_timeout_s: number | null;
  address: string | null;
  egress: string | null;
  image_ref: string | null;
  workdir: string | null;
  expires_at: string | null;
  on_expiry: 'delete' | 'hibernate' | 'stop' | null;
  error: string | null;
  created_at: string;
  updated_at: string;
  node: string | null;
  uid_base: number | null;
  restoring_from: string | null;
  volumes: string;
  secrets: string;
  egress_ca: string | null;
  warm_fork: number;
  default_user: string | null;
  image_volumes: string;
  version: Generated<number>;
}

export interface CheckpointsTable {
  id: string;
  instance_id: string;
  owner: string;
  label: string | null;
  status: 'processing' | 'ready' | 'failed';
  memory: number;
  parent_id: string | null;
  layers: string;
  base_layer: number;
  image: string;
  agent_layer: string;
  hostname: string;
  delta_bytes: number | null;
  memory_bytes: number | null;
  pause_ms: number | null;
  error: string | null;
  created_at: string;
  ready_at: string | null;
  user_namespace: number;
}
