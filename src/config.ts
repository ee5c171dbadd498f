import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { packagePath } from './lib/package-root.js';

/** Every setting, with its default. Precedence: flags > FORKPOINT_* environment > file > default. */
/** A node's name: a DNS name, like a Kubernetes node's. */
export const NODE_ID = /^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/;

export const configSchema = z.object({
  dataDir: z.string().min(1).default('/var/lib/forkpoint'),
  /** A PostgreSQL database shared by several nodes (postgres://...); unset: the embedded SQLite
   * file in the data directory. */
  databaseUrl: z
    .string()
    .regex(/^postgres(ql)?:\/\//, 'a postgres:// or postgresql:// URL')
    .optional(),
  /** This node's name among the nodes sharing the store (default: one made at its first start
   * and kept in the data directory). */
  nodeId: z.string().regex(NODE_ID, 'a DNS name: up to 253 lowercase letters, digits, dots or dashes').optional(),
  /** Where the other nodes reach this one (default: http://<host>:<port> as it listens). */
  nodeUrl: z.string().url().optional(),
  /** How often the node says it lives, and after how long without a word it counts as gone
   * (its instances become `lost`). */
  nodeHeartbeatS: z.coerce.number().positive().max(3600).default(5),
  nodeDeadAfterS: z.coerce.number().positive().max(86400).default(30),
  /** How long a starting node waits for its database and object store to answer (a cluster
   * booting together, a failover) before it gives up. */
  startupWaitS: z.coerce.number().positive().max(86400).default(300),
  /** While the database is away, an API token it vouched for this recently is still taken: the
   * longest a revocation may take to bite then. 0: none is. */
  tokenGraceS: z.coerce.number().min(0).max(3600).default(60),
  host: z.string().min(1).default('127.0.0.1'),
  port: z.coerce.number().int().min(0).max(65535).default(7878),
  logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  /** The server's nice value: above its sandboxes (they start at 0), below CRIU's workers (-10). */
  serverNice: z.coerce.number().int().min(-20).max(19).default(-5),
  /** Where criu (>= 4.2) is; set-up puts a private one here when the host has none. */
  criuPath: z.string().min(1).default('/opt/forkpoint/bin/criu'),
  /** A tmpfs for CRIU's kernel-probe cache (mounted by the server when missing). */
  criuCacheDir: z.string().min(1).default('/run/forkpoint/criu-cache'),
  /** A tmpfs a memory checkpoint's image is written to while the sandbox is frozen, then copied
   * to the data directory (bounded: engine/dump-staging.ts); empty: straight to disk. */
  dumpStagingDir: z.string().default('/dev/shm'),
  /** A fork, rollback or wake whose memory image holds at least this many MiB of pages, and a
   * checkpoint's restore in its pause, is restored lazily (its pages filled on demand and in the
   * background); 0: never. */
  lazyRestoreMb: z.coerce.number().int().min(0).default(128),
  /** A memory checkpoint of a sandbox left running that uses at least this many MiB tracks what
   * it writes from then on, so that its next one copies only that (engine/memory-tracking.ts);
   * 0: never. */
  incrementalCheckpointMb: z.coerce.number().int().min(0).default(64),
  /** The static agent binary; set-up builds it. */
  agentPath: z.string().min(1).default(packagePath('native', 'build', 'fp-agent')),
  /** Images are copied from here into the data directory on first use. */
  imageSeedDir: z.string().min(1).default('/opt/forkpoint/images'),
  defaultImage: z.string().min(1).default('default'),
  /** E2B template names and what they are here (images or templates), as JSON; `base` is the
   * default image unless this says otherwise. */
  e2bTemplates: z
    .string()
    .default('{}')
    .refine((t) => {
      try {
        const v: unknown = JSON.parse(t);
        return typeof v === 'object' && v !== null && !Array.isArray(v) && Object.values(v).every((x) => typeof x === 'string');
      } catch {
        return false;
      }
    }, 'a JSON object of strings'),
  /** An S3-compatible object store for durable checkpoints (all of endpoint, bucket and
   * credentials, or none: checkpoints stay on this host's disk only). */
  s3Endpoint: z.string().url().optional(),
  s3Bucket: z.string().min(3).max(63).optional(),
  s3Region: z.string().min(1).default('us-east-1'),
  s3AccessKeyId: z.string().min(1).optional(),
  s3SecretAccessKey: z.string().min(1).optional(),
  /** Every key starts with it. */
  s3Prefix: z.string().max(200).default('forkpoint/'),
  /** What an OpenComputer image manifest's `base` and an E2B-style build stand on (apt works). */
  manifestBaseImage: z.string().min(1).default('debian'),
  bodyLimitBytes: z.coerce.number().int().positive().default(16 * 1024 * 1024),
  /** Registries (host or host:port, comma-separated) pulled from in plain HTTP; those on
   * loopback always may be. Any other is spoken to in TLS, its certificate checked. */
  insecureRegistries: z.string().regex(/^[^,\s]+(,[^,\s]+)*$|^$/, 'registries, comma-separated').default(''),
  /** The key registry passwords are sealed with in the store (32 bytes, mode 0600; made when
   * missing). Nodes sharing a database share it. Default: secrets.key in the data directory. */
  secretsKeyFile: z.string().min(1).optional(),
  /** The most an image pulled from a registry may weigh as fetched (its compressed layers). */
  maxPullMb: z.coerce.number().int().positive().default(8192),
  /** What one owner's pulled images may weigh in all, as fetched (each counted whole, even when
   * another owner pulled it too). */
  ownerMaxPulledMb: z.coerce.number().int().positive().default(32768),
  /** The node's cache of registry blobs beyond what its pulled images are made of (those of
   * images deleted since, kept so that a pull again fetches nothing): the oldest used go first. */
  imageCacheMb: z.coerce.number().int().min(0).default(4096),
  /** CA certificates (a PEM file) the egress proxy also trusts when it takes a sandbox's request
   * with a secret on to its host (beyond the system's): a private registry's or API's CA. */
  egressCaFile: z.string().min(1).optional(),
  /** The largest persistent volume, in MiB. */
  maxVolumeMb: z.coerce.number().int().min(64).default(16384),
  /** All of one owner's persistent volumes together, in MiB (their declared sizes). */
  ownerMaxVolumeMb: z.coerce.number().int().min(64).default(65536),
  /** What a build context a client sends may unpack to (its tar stream decompressed) and how
   * many members it may have; checked before anything is unpacked. */
  buildContextMaxMb: z.coerce.number().int().positive().default(2048),
  buildContextMaxEntries: z.coerce.number().int().positive().default(200_000),
  /** The HTTP server's deadlines and bounds (http/connection-limits.ts): headers whole within
   * this, a body moving at least a KiB in every window this long, and at most this many
   * connections per client address (0: none; behind a reverse proxy, raise it). */
  httpHeadersTimeoutMs: z.coerce.number().int().min(100).default(30_000),
  httpBodyStallMs: z.coerce.number().int().min(100).default(30_000),
  httpConnectionsPerClient: z.coerce.number().int().min(0).default(512),
  checkpointConcurrency: z.coerce.number().int().positive().default(2),
  /** Warm forks: sandboxes restored ahead from checkpoints that were forked from, held frozen
   * for the next fork (README, "Warm forks"): how many at most, and the memory they may hold
   * together. 0: none. */
  warmForks: z.coerce.number().int().min(0).max(256).default(4),
  warmForksMemoryMb: z.coerce.number().int().min(0).default(1024),
  maxCheckpointsPerInstance: z.coerce.number().int().positive().default(10),
  /** Past this many layers under an instance, its oldest ones are squashed into one. */
  squashAfterLayers: z.coerce.number().int().min(2).max(400).default(64),
  /** How many of the newest layers a squash leaves as they are. */
  squashKeepLayers: z.coerce.number().int().min(1).max(399).default(16),
  defaultMemoryMb: z.coerce.number().int().positive().default(1024),
  defaultPids: z.coerce.number().int().positive().default(512),
  defaultCpuPercent: z.coerce.number().int().positive().default(100),
  /** A disk limit for instances that do not ask for one (0: none). See engine/volumes.ts. */
  defaultDiskMb: z.coerce.number().int().min(0).default(0),
  /** What one owner's instances may hold together, whatever their state (README, "Security"):
   * past it a create or fork answers 429 QUOTA_EXCEEDED with the bound as its reason. 0: no
   * bound. Unset: memory 8 times the host's, CPU 128 times the host's CPUs (100 each), addresses
   * half the subnet's. Disk counts instances' disk limits, and with a bound every instance needs
   * one. */
  ownerMaxInstances: z.coerce.number().int().min(0).default(256),
  ownerMaxMemoryMb: z.coerce.number().int().min(0).optional(),
  ownerMaxCpuPercent: z.coerce.number().int().min(0).optional(),
  ownerMaxDiskMb: z.coerce.number().int().min(0).default(0),
  ownerMaxAddresses: z.coerce.number().int().min(0).optional(),
  /** `on`: every sandbox runs in a user namespace of its own, its ids 0..65535 a range of host
   * ids no other sandbox and no host account has (README, "Security"); `off`: the host's ids, as
   * before (weaker). An instance may ask for either at create. */
  userNamespaces: z.enum(['on', 'off']).default('on'),
  /** The pool ranges are taken from: `uidRanges` ranges of 65536 ids from `uidRangeStart`, a
   * multiple of 65536, all below 2^31. Shared by the nodes of a cluster (one store). */
  uidRangeStart: z.coerce.number().int().min(65536).multipleOf(65536).default(1073741824),
  uidRanges: z.coerce.number().int().positive().default(8192),
  /** How many of them one owner's instances may hold (a tenant cannot drain the pool). */
  uidRangesPerOwner: z.coerce.number().int().positive().default(2048),
  /** `on`: the host's cgroup hierarchy is remounted `favordynmods` at start, so that moving a
   * restore into its sandbox's cgroups does not wait out an RCU grace period (engine/cgroup-moves.ts;
   * host-wide, until the next boot); `off`: the hierarchy is left as it is. */
  cgroupFavordynmods: z.enum(['on', 'off']).default('on'),
  /** `off`: sandboxes get only loopback (no link, no firewall, no DNS), as before networking. */
  networking: z.enum(['on', 'off']).default('on'),
  /** The sandboxes' subnet (the host keeps its first address as their gateway). Two servers on
   * one host need two subnets. */
  networkCidr: z
    .string()
    .regex(/^(\d{1,3}\.){3}\d{1,3}\/(1[6-9]|2[0-8])$/, 'an IPv4 CIDR from /16 to /28')
    .default('10.88.0.0/16'),
  /** A domain whose names `<port>-<instance id>.<domain>` lead to instances' ports (its DNS
   * points `*.<domain>` at this server): every preview on an origin of its own. `auto`: the
   * name the client reached the API by (a load balancer's, whose DNS then needs `*.` too), or
   * `localhost` when it used an address (browsers resolve `*.localhost` to their machine);
   * `none` turns preview links off (ports stay reachable with the API token). */
  previewDomain: z
    .string()
    .regex(/^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$|^localhost$|^auto$|^none$/, 'a domain name, localhost, auto or none')
    .default('auto'),
  /** The host ports port forwards may listen on, `first-last` (unprivileged by default, like
   * Kubernetes' NodePorts): a tenant cannot take the host's SSH port or any other service's. */
  hostPortRange: z
    .string()
    .regex(/^\d{1,5}-\d{1,5}$/, 'first-last, e.g. 30000-32767')
    .refine((r) => {
      const [a, b] = r.split('-').map(Number) as [number, number];
      return a >= 1 && a <= b && b <= 65535;
    }, 'a range of ports from 1 to 65535, first <= last')
    .default('30000-32767'),
  /** Owners whose API tokens are the operator's, comma-separated: only they see the cluster's
   * nodes (`GET /nodes`: addresses and load). */
  operators: z.string().regex(/^[^,\s]+(,[^,\s]+)*$|^$/, 'owner names, comma-separated').default('default'),
  /** Resolvers the sandboxes' DNS forwards to, comma-separated (default: the host's resolv.conf). */
  dnsServers: z
    .string()
    .regex(/^((\d{1,3}\.){3}\d{1,3})(,(\d{1,3}\.){3}\d{1,3})*$/, 'comma-separated IPv4 addresses')
    .optional(),
});

export type Config = z.infer<typeof configSchema>;
export type ConfigInput = z.input<typeof configSchema>;

const envNames: Record<keyof Config, string> = {
  dataDir: 'FORKPOINT_DATA_DIR',
  databaseUrl: 'FORKPOINT_DATABASE_URL',
  nodeId: 'FORKPOINT_NODE_ID',
  nodeUrl: 'FORKPOINT_NODE_URL',
  nodeHeartbeatS: 'FORKPOINT_NODE_HEARTBEAT_S',
  nodeDeadAfterS: 'FORKPOINT_NODE_DEAD_AFTER_S',
  startupWaitS: 'FORKPOINT_STARTUP_WAIT_S',
  tokenGraceS: 'FORKPOINT_TOKEN_GRACE_S',
  host: 'FORKPOINT_HOST',
  port: 'FORKPOINT_PORT',
  logLevel: 'FORKPOINT_LOG_LEVEL',
  serverNice: 'FORKPOINT_SERVER_NICE',
  criuPath: 'FORKPOINT_CRIU',
  criuCacheDir: 'FORKPOINT_CRIU_CACHE_DIR',
  dumpStagingDir: 'FORKPOINT_DUMP_STAGING_DIR',
  lazyRestoreMb: 'FORKPOINT_LAZY_RESTORE_MB',
  incrementalCheckpointMb: 'FORKPOINT_INCREMENTAL_CHECKPOINT_MB',
  agentPath: 'FORKPOINT_AGENT',
  imageSeedDir: 'FORKPOINT_IMAGE_SEED_DIR',
  defaultImage: 'FORKPOINT_DEFAULT_IMAGE',
  manifestBaseImage: 'FORKPOINT_MANIFEST_BASE_IMAGE',
  e2bTemplates: 'FORKPOINT_E2B_TEMPLATES',
  s3Endpoint: 'FORKPOINT_S3_ENDPOINT',
  s3Bucket: 'FORKPOINT_S3_BUCKET',
  s3Region: 'FORKPOINT_S3_REGION',
  s3AccessKeyId: 'FORKPOINT_S3_ACCESS_KEY_ID',
  s3SecretAccessKey: 'FORKPOINT_S3_SECRET_ACCESS_KEY',
  s3Prefix: 'FORKPOINT_S3_PREFIX',
  bodyLimitBytes: 'FORKPOINT_BODY_LIMIT_BYTES',
  insecureRegistries: 'FORKPOINT_INSECURE_REGISTRIES',
  maxPullMb: 'FORKPOINT_MAX_PULL_MB',
  imageCacheMb: 'FORKPOINT_IMAGE_CACHE_MB',
  ownerMaxPulledMb: 'FORKPOINT_OWNER_MAX_PULLED_MB',
  egressCaFile: 'FORKPOINT_EGRESS_CA_FILE',
  maxVolumeMb: 'FORKPOINT_MAX_VOLUME_MB',
  ownerMaxVolumeMb: 'FORKPOINT_OWNER_MAX_VOLUME_MB',
  secretsKeyFile: 'FORKPOINT_SECRETS_KEY_FILE',
  buildContextMaxMb: 'FORKPOINT_BUILD_CONTEXT_MAX_MB',
  buildContextMaxEntries: 'FORKPOINT_BUILD_CONTEXT_MAX_ENTRIES',
  httpHeadersTimeoutMs: 'FORKPOINT_HTTP_HEADERS_TIMEOUT_MS',
  httpBodyStallMs: 'FORKPOINT_HTTP_BODY_STALL_MS',
  httpConnectionsPerClient: 'FORKPOINT_HTTP_CONNECTIONS_PER_CLIENT',
  checkpointConcurrency: 'FORKPOINT_CHECKPOINT_CONCURRENCY',
  warmForks: 'FORKPOINT_WARM_FORKS',
  warmForksMemoryMb: 'FORKPOINT_WARM_FORKS_MEMORY_MB',
  maxCheckpointsPerInstance: 'FORKPOINT_MAX_CHECKPOINTS',
  squashAfterLayers: 'FORKPOINT_SQUASH_AFTER_LAYERS',
  squashKeepLayers: 'FORKPOINT_SQUASH_KEEP_LAYERS',
  defaultMemoryMb: 'FORKPOINT_DEFAULT_MEMORY_MB',
  defaultPids: 'FORKPOINT_DEFAULT_PIDS',
  defaultCpuPercent: 'FORKPOINT_DEFAULT_CPU_PERCENT',
  defaultDiskMb: 'FORKPOINT_DEFAULT_DISK_MB',
  userNamespaces: 'FORKPOINT_USER_NAMESPACES',
  cgroupFavordynmods: 'FORKPOINT_CGROUP_FAVORDYNMODS',
  ownerMaxInstances: 'FORKPOINT_OWNER_MAX_INSTANCES',
  ownerMaxMemoryMb: 'FORKPOINT_OWNER_MAX_MEMORY_MB',
  ownerMaxCpuPercent: 'FORKPOINT_OWNER_MAX_CPU_PERCENT',
  ownerMaxDiskMb: 'FORKPOINT_OWNER_MAX_DISK_MB',
  ownerMaxAddresses: 'FORKPOINT_OWNER_MAX_ADDRESSES',
  uidRangeStart: 'FORKPOINT_UID_RANGE_START',
  uidRanges: 'FORKPOINT_UID_RANGES',
  uidRangesPerOwner: 'FORKPOINT_UID_RANGES_PER_OWNER',
  networking: 'FORKPOINT_NETWORKING',
  networkCidr: 'FORKPOINT_NETWORK_CIDR',
  previewDomain: 'FORKPOINT_PREVIEW_DOMAIN',
  dnsServers: 'FORKPOINT_DNS_SERVERS',
  hostPortRange: 'FORKPOINT_HOST_PORT_RANGE',
  operators: 'FORKPOINT_OPERATORS',
};

export const configEnvNames: Readonly<Record<keyof Config, string>> = envNames;

function fromEnv(env: NodeJS.ProcessEnv): Partial<Record<keyof Config, string>> {
  const out: Partial<Record<keyof Config, string>> = {};
  for (const [key, name] of Object.entries(envNames) as [keyof Config, string][]) {
    const value = env[name];
    if (value !== undefined && value !== '') out[key] = value;
  }
  return out;
}

function fromFile(path: string | undefined): Record<string, unknown> {
  if (!path) return {};
  const parsed: unknown = JSON.parse(readFileSync(path, 'utf8'));
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw new Error(`config file ${path}: expected a JSON object`);
  }
  return parsed as Record<string, unknown>;
}

function definedOnly<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

export interface ConfigSources {
  flags?: Partial<Record<keyof Config, unknown>>;
  env?: NodeJS.ProcessEnv;
  /** A JSON file; FORKPOINT_CONFIG names it when this is not given. */
  file?: string;
}

export function loadConfig(sources: ConfigSources = {}): Config {
  const env = sources.env ?? process.env;
  const file = sources.file ?? env.FORKPOINT_CONFIG;
  const merged = { ...fromFile(file), ...fromEnv(env), ...definedOnly(sources.flags ?? {}) };
  const result = configSchema.strict().safeParse(merged);
  if (!result.success) {
    const problems = result.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`);
    throw new Error(`invalid configuration: ${problems.join('; ')}`);
  }
  const c = result.data;
  // The kernel's ping_group_range and PostgreSQL's INTEGER both end at 2^31 - 1.
  if (c.uidRangeStart + c.uidRanges * 65536 > 2 ** 31) {
    throw new Error(`invalid configuration: uidRanges: ${c.uidRanges} ranges from ${c.uidRangeStart} go past 2^31`);
  }
  // Listening on every address, a node cannot tell the others where it is: "any" means
  // "itself" to them, and calls forwarded there would come back.
  if (c.databaseUrl && !c.nodeUrl && /^(0\.0\.0\.0|::|\[::\])$/.test(c.host)) {
    throw new Error(`invalid configuration: nodeUrl: a node sharing a database and listening on ${c.host} needs FORKPOINT_NODE_URL (where the other nodes reach it)`);
  }
  return c;
}
