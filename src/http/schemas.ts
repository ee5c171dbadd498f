import { z } from 'zod';

/** The Firecase-style face: snake_case in and out. These schemas are the OpenAPI spec. */

export const ErrorEnvelope = z
  .object({
    error: z.object({
      code: z.enum(['INVALID_REQUEST', 'UNAUTHENTICATED', 'NOT_FOUND', 'CONFLICT', 'QUOTA_EXCEEDED', 'PAYLOAD_TOO_LARGE', 'UNAVAILABLE', 'INSUFFICIENT_STORAGE', 'INTERNAL']),
      message: z.string(),
      details: z.unknown().optional(),
    }),
  })
  .meta({ id: 'Error' });

const MAX_ENV_VARS = 256;
const MAX_ENV_BYTES = 64 * 1024;

export const Env = z
  .record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'names are letters, digits and _'), z.string().max(32 * 1024))
  .refine((e) => Object.keys(e).length <= MAX_ENV_VARS, `at most ${MAX_ENV_VARS} variables`)
  .refine(
    (e) => Object.entries(e).reduce((n, [k, v]) => n + k.length + v.length + 2, 0) <= MAX_ENV_BYTES,
    `at most ${MAX_ENV_BYTES} bytes of variables in all`,
  );

export const Limits = z.object({
  memory_mb: z.number().int().min(32).max(256 * 1024).optional(),
  pids: z.number().int().min(16).max(1 << 20).optional(),
  cpu_percent: z.number().int().min(1).max(6400).optional(),
  disk_mb: z
    .number()
    .int()
    .min(64)
    .max(16 << 20)
    .optional()
    .describe('a limit on everything the instance writes, its checkpoints\' changes included (a size-limited filesystem of its own); default: the server\'s (none unless configured)'),
});

export const IdParams = z.object({ id: z.string().min(1).max(64) });
export const CheckpointParams = IdParams.extend({ checkpoint_id: z.string().min(1).max(64) });
export const ProcessParams = IdParams.extend({ process_id: z.coerce.number().int().min(1).max(0xffffffff) });
export const SessionParams = IdParams.extend({ name: z.string().min(1).max(64) });

export const PageQuery = z.object({
  limit: z.coerce.number().int().min(1).max(500).default(50),
  cursor: z.string().max(64).optional(),
});

export const CreateInstanceBody = z
  .object({
    name: z.string().max(63).optional().describe('hostname-safe; defaults to the id'),
    image: z.string().max(63).optional().describe('an image name; defaults to the server default'),
    env: Env.optional(),
    limits: Limits.optional(),
    metadata: z.record(z.string().max(64), z.string().max(1024)).optional(),
    max_checkpoints: z.number().int().min(1).max(1000).optional(),
  })
  .strict();

export const Instance = z
  .object({
    id: z.string(),
    name: z.string(),
    image: z.string(),
    status: z.enum(['starting', 'running', 'stopped', 'error']),
    env: z.record(z.string(), z.string()),
    limits: z.object({ memory_mb: z.number(), pids: z.number(), cpu_percent: z.number(), disk_mb: z.number().nullable() }),
    metadata: z.record(z.string(), z.string()),
    max_checkpoints: z.number().nullable(),
    head_checkpoint_id: z.string().nullable(),
    source_instance_id: z.string().nullable(),
    source_checkpoint_id: z.string().nullable(),
    error: z.string().nullable(),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .meta({ id: 'Instance' });

export const InstancePage = z.object({ items: z.array(Instance), next_cursor: z.string().nullable() });

const Command = z.union([z.string().min(1).max(1 << 20), z.array(z.string().max(1 << 16)).min(1).max(4096)]);

export const ExecBody = z
  .object({
    command: Command.describe('an argv array, run directly; or a string, run by /bin/sh -c (or by the session shell)'),
    cwd: z.string().max(4096).optional(),
    env: Env.optional(),
    timeout_ms: z.number().int().min(1).max(24 * 3600 * 1000).optional().describe('default 60000; on expiry the whole process group is killed'),
    stdin: z.string().max(8 << 20).optional(),
    session: z
      .string()
      .regex(/^[A-Za-z0-9_-]{1,32}$/)
      .optional()
      .describe('run in the named persistent shell (created on first use): cd, export and background jobs persist between calls'),
    max_output_bytes: z.number().int().min(0).max(64 << 20).optional().describe('per stream; default 1 MiB'),
    output_encoding: z
      .enum(['utf8', 'base64'])
      .optional()
      .describe('how stdout and stderr are returned: UTF-8 text (default; bytes that are not UTF-8 become U+FFFD) or base64, byte for byte'),
  })
  .strict();

export const ExecResult = z
  .object({
    exit_code: z.number(),
    stdout: z.string(),
    stderr: z.string(),
    output_encoding: z.enum(['utf8', 'base64']),
    duration_ms: z.number(),
    timed_out: z.boolean(),
    truncated: z.boolean(),
  })
  .meta({ id: 'ExecResult' });

export const StartProcessBody = z
  .object({
    command: Command,
    cwd: z.string().max(4096).optional(),
    env: Env.optional(),
    pty: z.object({ rows: z.number().int().min(1).max(1000), cols: z.number().int().min(1).max(1000) }).optional(),
  })
  .strict();

export const ProcessInfo = z
  .object({
    process_id: z.number(),
    pid: z.number(),
    status: z.enum(['running', 'exited']),
    exit_code: z.number().nullable(),
    signal: z.number().nullable(),
    pty: z.boolean(),
    stdout_bytes: z.number(),
    stderr_bytes: z.number(),
    command: z.string(),
  })
  .meta({ id: 'Process' });

export const OutputQuery = z.object({
  stdout_offset: z.coerce.number().int().min(0).default(0),
  stderr_offset: z.coerce.number().int().min(0).default(0),
});

export const ProcessOutput = z.object({
  stdout: z.string(),
  stderr: z.string(),
  stdout_offset: z.number().describe('pass back to read on from here'),
  stderr_offset: z.number(),
  dropped_bytes: z.number().describe('bytes that left the bounded scrollback before they were read'),
  exit_code: z.number().nullable(),
});

export const SignalBody = z.object({ signal: z.number().int().min(1).max(64).default(15) }).strict();

export const Session = z.object({ name: z.string(), process_id: z.number(), running: z.boolean() });

export const CreateCheckpointBody = z
  .object({
    label: z.string().max(200).optional(),
    memory: z.boolean().optional().describe('keep memory and running processes (default true); false: files only'),
    retention: z.object({ mode: z.literal('delete_oldest') }).optional(),
  })
  .strict();

export const WaitQuery = z.object({
  wait: z
    .enum(['true', 'false', '1', '0'])
    .optional()
    .transform((v) => v === 'true' || v === '1')
    .describe('return once the checkpoint is no longer processing'),
});

export const Checkpoint = z
  .object({
    id: z.string(),
    instance_id: z.string(),
    label: z.string().nullable(),
    status: z.enum(['processing', 'ready', 'failed']),
    memory: z.boolean(),
    parent_id: z.string().nullable(),
    delta_bytes: z.number().nullable(),
    memory_bytes: z.number().nullable(),
    pause_ms: z.number().nullable().describe('how long the instance was frozen: dump to restored (null for a stopped instance)'),
    error: z.string().nullable(),
    created_at: z.string(),
    ready_at: z.string().nullable(),
  })
  .meta({ id: 'Checkpoint' });

export const CheckpointPage = z.object({ items: z.array(Checkpoint), next_cursor: z.string().nullable() });

export const RollbackBody = z.object({ checkpoint_id: z.string().min(1).max(64) }).strict();

export const ForkBody = z
  .object({
    name: z.string().max(63).optional(),
    checkpoint_id: z.string().max(64).optional().describe('without it, an implicit checkpoint of the current state is taken'),
    count: z.number().int().min(1).max(64).optional(),
  })
  .strict();

export const ForkResult = z.object({ instances: z.array(Instance) });

export interface LineageShape {
  kind: 'instance' | 'checkpoint';
  id: string;
  label: string | null;
  status: string;
  children: LineageShape[];
}
export const Lineage: z.ZodType<LineageShape> = z
  .object({
    kind: z.enum(['instance', 'checkpoint']),
    id: z.string(),
    label: z.string().nullable(),
    status: z.string(),
    get children(): z.ZodArray<z.ZodType<LineageShape>> {
      return z.array(Lineage);
    },
  })
  .meta({ id: 'LineageNode' });

export const Health = z.object({
  ok: z.boolean(),
  version: z.string(),
  engine: z.object({
    criu: z.object({ path: z.string(), version: z.string().nullable(), ok: z.boolean() }),
    overlay: z.boolean(),
    cgroups: z.number(),
    root: z.boolean(),
  }),
});

export const errorResponses = {
  400: ErrorEnvelope,
  401: ErrorEnvelope,
  404: ErrorEnvelope,
  409: ErrorEnvelope,
  413: ErrorEnvelope,
  429: ErrorEnvelope,
  500: ErrorEnvelope,
  503: ErrorEnvelope,
  507: ErrorEnvelope,
} as const;
