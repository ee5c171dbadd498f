import { z } from 'zod';

/** The OpenComputer-compatible face: camelCase, the shapes `@opencomputer/sdk` reads. */

export const SandboxParams = z.object({ id: z.string().min(1).max(64) });
export const SandboxCheckpointParams = SandboxParams.extend({ checkpointId: z.string().min(1).max(64) });
export const CheckpointOnlyParams = z.object({ checkpointId: z.string().min(1).max(64) });
export const PathQuery = z.object({ path: z.string().min(1).max(4096) });

const Envs = z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string().max(32 * 1024));

export const CreateSandboxBody = z
  .object({
    templateID: z.string().max(63).optional().describe('an image name; "base" means the default image'),
    timeout: z.number().int().min(0).optional().describe('accepted; sandboxes here never hibernate by themselves'),
    envs: Envs.optional(),
    metadata: z.record(z.string().max(64), z.string().max(1024)).optional(),
    cpuCount: z.number().int().min(1).max(64).optional(),
    memoryMB: z.number().int().min(32).max(256 * 1024).optional(),
    diskMB: z.number().int().min(1).optional(),
  })
  .passthrough();

export const SandboxData = z
  .object({
    sandboxID: z.string(),
    status: z.string(),
    templateID: z.string(),
    alias: z.string(),
    envs: z.record(z.string(), z.string()),
    metadata: z.record(z.string(), z.string()),
    cpuCount: z.number(),
    memoryMB: z.number(),
    startedAt: z.string(),
    connectURL: z.string(),
    token: z.string(),
    sandboxDomain: z.string(),
  })
  .meta({ id: 'OpenComputerSandbox' });

export const RunBody = z
  .object({
    cmd: z.string().min(1).max(1 << 16),
    args: z.array(z.string().max(1 << 16)).max(4096).optional(),
    envs: Envs.optional(),
    cwd: z.string().max(4096).optional(),
    timeout: z.number().min(0).max(86400).optional().describe('seconds'),
  })
  .passthrough();

export const RunResult = z.object({ exitCode: z.number(), stdout: z.string(), stderr: z.string() });

export const CreateCheckpointBody = z.object({ name: z.string().max(200).optional() }).passthrough();

export const CheckpointInfo = z
  .object({
    id: z.string(),
    sandboxId: z.string(),
    orgId: z.string(),
    name: z.string(),
    sandboxConfig: z.record(z.string(), z.unknown()),
    status: z.string(),
    sizeBytes: z.number(),
    createdAt: z.string(),
  })
  .meta({ id: 'OpenComputerCheckpoint' });

export const FromCheckpointBody = z
  .object({ timeout: z.number().optional(), envs: Envs.optional() })
  .passthrough();

export const EntryInfo = z.object({ name: z.string(), isDir: z.boolean(), path: z.string(), size: z.number() });
