import { z } from 'zod';
import { ImageManifest } from '../../core/build/manifest.js';
import { MAX_EXEC_TIMEOUT_MS } from '../../core/commands.js';

/** The OpenComputer-compatible face: camelCase, the shapes `@opencomputer/sdk` reads. */

export const OcError = z
  .object({ error: z.string() })
  .meta({ id: 'OpenComputerError', description: 'Every failure under /api, as OpenComputer answers them.', examples: [{ error: 'instance inst_0123456789abcdef not found' }] });

const failure = (description: string) => ({ description, content: { 'application/json': { schema: OcError } } });

/** The error statuses any route of this face can answer with. */
export const ocErrorResponses = {
  400: failure('Bad input'),
  401: failure('No token, or not a valid one'),
  403: failure('A valid credential that does not open this route (a sandbox\'s access token)'),
  404: failure('No such route or sandbox'),
  409: failure('The sandbox is not in a state for this'),
  413: failure('The body is too large'),
  429: failure('A quota is reached'),
  500: failure('A bug in forkpoint'),
  503: failure('The engine could not do it now'),
  507: failure('The disk is full'),
};

export const SandboxParams = z.object({ id: z.string().min(1).max(64) });
export const SandboxCheckpointParams = SandboxParams.extend({ checkpointId: z.string().min(1).max(64) });
export const CheckpointOnlyParams = z.object({ checkpointId: z.string().min(1).max(64) });
export const PathQuery = z.object({ path: z.string().min(1).max(4096) });

const Envs = z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string().max(32 * 1024));

export const CreateSandboxBody = z
  .object({
    templateID: z.string().max(512).optional().describe('an image name or a registry reference (pulled); "base" means the default image'),
    timeout: z.number().int().min(0).max(30 * 86400).optional().describe('seconds idle (no call, no attached client) before the sandbox hibernates by itself, its memory kept; 0: never'),
    envs: Envs.optional(),
    metadata: z.record(z.string().max(64), z.string().max(1024)).optional(),
    cpuCount: z.number().int().min(1).max(64).optional(),
    memoryMB: z.number().int().min(32).max(256 * 1024).optional(),
    diskMB: z.number().int().min(1).optional(),
    image: ImageManifest.optional().describe('an Image builder manifest: built (or found built, by its hash) and booted'),
    snapshot: z.string().max(63).optional().describe('a snapshot (a template) to start from, its processes running'),
    secretStore: z.string().min(1).max(63).optional().describe('a secret store (by name): each of its secrets in a variable of its name, as an `osb_sealed_` placeholder the egress proxy replaces for the secret\'s hosts; the store\'s egress allowlist. Not with `snapshot` (a snapshot\'s sandboxes keep the secrets it was made with)'),
  })
  .strip()
  .meta({ id: 'OpenComputerCreateSandboxRequest', examples: [{ templateID: 'base', envs: { A: '1' } }] });

export const SandboxData = z
  .object({
    sandboxID: z.string(),
    status: z.string(),
    templateID: z.string(),
    alias: z.string(),
    envs: z.record(z.string(), z.string()),
    metadata: z.record(z.string(), z.string()),
    cpuCount: z.number().int(),
    memoryMB: z.number().int(),
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
    timeout: z.number().min(0).max(MAX_EXEC_TIMEOUT_MS / 1000).optional().describe('seconds'),
  })
  .strip()
  .meta({ id: 'OpenComputerRunRequest', examples: [{ cmd: 'echo', args: ['hi'] }] });

export const RunResult = z
  .object({ exitCode: z.number().int(), stdout: z.string(), stderr: z.string() })
  .meta({ id: 'OpenComputerRunResult', examples: [{ exitCode: 0, stdout: 'hi\n', stderr: '' }] });

export const CreateCheckpointBody = z
  .object({ name: z.string().max(200).optional() })
  .strip()
  .meta({ id: 'OpenComputerCreateCheckpointRequest', examples: [{ name: 'before' }] });

export const CheckpointInfo = z
  .object({
    id: z.string(),
    sandboxId: z.string(),
    orgId: z.string(),
    name: z.string(),
    sandboxConfig: z.object({ memory: z.boolean(), parentId: z.string().nullable() }),
    status: z.string(),
    sizeBytes: z.number().int(),
    createdAt: z.string(),
  })
  .meta({ id: 'OpenComputerCheckpoint' });

export const FromCheckpointBody = z
  .object({ timeout: z.number().int().min(0).max(30 * 86400).optional().describe('its idle timeout, seconds (0: never)'), envs: Envs.optional().describe('added to the source sandbox\'s') })
  .strip()
  .meta({ id: 'OpenComputerFromCheckpointRequest', examples: [{ envs: { ROLE: 'worker' } }] });

export const EntryInfo = z
  .object({ name: z.string(), isDir: z.boolean(), path: z.string(), size: z.number().int() })
  .meta({ id: 'OpenComputerEntryInfo' });

/** Raw bytes, both ways. */
export const Binary = z.custom<unknown>(() => true).meta({ type: 'string', format: 'binary' });

export const TimeoutBody = z
  .object({ timeout: z.number().int().min(0).max(30 * 86400).describe('seconds idle before the sandbox hibernates by itself; 0: never') })
  .strip()
  .meta({ id: 'OpenComputerTimeoutRequest', examples: [{ timeout: 300 }] });

export const WakeBody = z
  .object({ timeout: z.number().int().min(0).max(30 * 86400).optional().describe('the idle timeout from now on, seconds; 0: never') })
  .strip()
  .meta({ id: 'OpenComputerWakeRequest', examples: [{ timeout: 0 }] });

export const ExecSessionBody = z
  .object({
    cmd: z.string().min(1).max(1 << 16),
    args: z.array(z.string().max(1 << 16)).max(4096).optional(),
    envs: Envs.optional(),
    cwd: z.string().max(4096).optional(),
    timeout: z.number().min(0).max(7 * 86400).optional().describe('seconds; the command is killed after it (0 or none: never)'),
    maxRunAfterDisconnect: z.number().min(0).max(7 * 86400).optional().describe('seconds the command may run with no client attached before it is killed (none: forever)'),
  })
  .strip()
  .meta({ id: 'OpenComputerExecSessionRequest', examples: [{ cmd: 'bash', args: ['-c', 'for i in 1 2 3; do echo $i; sleep 1; done'] }] });

export const ExecSessionCreated = z.object({ sessionID: z.string() }).meta({ id: 'OpenComputerExecSessionCreated' });

export const ExecSessionInfo = z
  .object({
    sessionID: z.string(),
    sandboxID: z.string(),
    command: z.string(),
    args: z.array(z.string()),
    running: z.boolean(),
    exitCode: z.number().int().optional(),
    startedAt: z.string(),
    attachedClients: z.number().int(),
  })
  .meta({ id: 'OpenComputerExecSessionInfo' });

export const SessionParams = SandboxParams.extend({ sessionId: z.string().min(1).max(64) });
export const ExecIdParams = SandboxParams.extend({ execId: z.string().min(1).max(64) });

export const KillBody = z
  .object({ signal: z.number().int().min(1).max(64).optional().describe('default SIGKILL (9)') })
  .strip()
  .meta({ id: 'OpenComputerKillRequest', examples: [{ signal: 15 }] });

export const ExecResultBody = z
  .object({
    execId: z.string(),
    running: z.boolean(),
    exitCode: z.number().int().optional(),
    stdout: z.string().optional(),
    stderr: z.string().optional(),
    startedAt: z.string().optional(),
    error: z.string().optional().describe('why there is no result (the command was lost: the sandbox was rolled back past it, stopped or deleted)'),
  })
  .meta({ id: 'OpenComputerExecResult', examples: [{ execId: 'exec_0a1b2c3d', running: false, exitCode: 0, stdout: 'hi\n', stderr: '' }] });

export const PtyBody = z
  .object({ cols: z.number().int().min(1).max(1000).default(80), rows: z.number().int().min(1).max(1000).default(24) })
  .strip()
  .meta({ id: 'OpenComputerPtyRequest', examples: [{ cols: 80, rows: 24 }] });

export const ResizeBody = z
  .object({ cols: z.number().int().min(1).max(1000), rows: z.number().int().min(1).max(1000) })
  .strip()
  .meta({ id: 'OpenComputerResizeRequest', examples: [{ cols: 120, rows: 40 }] });

export const AllowedHosts = z
  .object({ sandboxID: z.string(), egressAllowlist: z.array(z.string()), perSecretAllowedHosts: z.record(z.string(), z.array(z.string())) })
  .meta({ id: 'OpenComputerAllowedHosts' });
