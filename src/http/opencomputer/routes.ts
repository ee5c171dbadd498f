import { clientOrigin } from '../client-origin.js';
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { CheckpointRecord } from '../../store/checkpoints.js';
import type { InstanceRecord } from '../../store/instances.js';
import type { Readable } from 'node:stream';
import { InvalidRequestError, QuotaExceededError } from '../../core/errors.js';
import { MAX_FILE_LINK_TTL_S } from '../../core/previews.js';
import { declareFace } from '../errors.js';
import { removeTree } from '../remove-tree.js';
import { sendFileBytes } from '../file-bytes.js';

const FileLinkRequest = z.object({ path: z.string().min(1).max(4096), expiresIn: z.number().int().min(1).max(MAX_FILE_LINK_TTL_S).default(3600) }).meta({ id: 'OcFileLinkRequest' });
const FileLink = z.object({ url: z.string(), expiresAt: z.string() }).meta({ id: 'OcFileLink' });
const SignedPathQuery = z.object({ path: z.string().min(1).max(4096), signature: z.string().max(600) });

/** OpenComputer's working directory in every sandbox. */
const OC_WORKSPACE = '/workspace';
/** The bundled image of OpenComputer's default sandbox. */
const OC_BASE = 'opencomputer-base';
import { sendWithOutputs } from '../output-json.js';
import { noContent, ok, OPTIONAL_BODY, optionalBody } from '../schemas/common.js';
import {
  Binary, CheckpointInfo, CheckpointOnlyParams, CreateCheckpointBody, CreateSandboxBody, EntryInfo, FromCheckpointBody, ocErrorResponses,
  PathQuery, RunBody, RunResult, SandboxCheckpointParams, SandboxData, SandboxParams, TimeoutBody, WakeBody, AllowedHosts,
} from './schemas.js';
import { execSessionRoutes } from './exec-routes.js';
import { ocImageRoutes } from './image-routes.js';
import { ocSecretStoreRoutes } from './secret-store-routes.js';
import { streamBuild, wantsEvents } from '../streams/build-sse.js';

const STATUS: Record<InstanceRecord['status'], string> = { starting: 'creating', running: 'running', hibernated: 'hibernated', stopped: 'stopped', error: 'error', lost: 'error' };

const sandboxView = (r: InstanceRecord) => ({
  sandboxID: r.id,
  status: STATUS[r.status],
  templateID: r.imageRef ?? r.image,
  alias: r.name,
  envs: r.env,
  metadata: r.metadata,
  cpuCount: Math.max(1, Math.round(r.limits.cpuPercent / 100)),
  memoryMB: r.limits.memoryMb,
  startedAt: r.createdAt,
  // Everything goes through this server; no direct worker URL or token.
  connectURL: '',
  token: '',
  sandboxDomain: '',
});

const checkpointView = (c: CheckpointRecord) => ({
  id: c.id,
  sandboxId: c.instanceId,
  orgId: c.owner,
  name: c.label ?? '',
  sandboxConfig: { memory: c.memory, parentId: c.parentId },
  status: c.status,
  sizeBytes: (c.deltaBytes ?? 0) + (c.memoryBytes ?? 0),
  createdAt: c.createdAt,
});

/** `/api/...`, so that the published `@opencomputer/sdk` works against forkpoint unchanged.
 * Same core, same auth (its `X-API-Key` header); errors in OpenComputer's own envelope. */
export const openComputerRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    declareFace(app, 'opencomputer');
    const tags = ['opencomputer'];
    const errors = ocErrorResponses;

    app.post('/sandboxes', {
      config: { placement: 'new' },
      schema: { operationId: 'ocCreateSandbox', tags, summary: 'Create a sandbox', description: 'Boots a sandbox on `templateID` (an image; `base` or none: the Debian image, with Python, Node.js, git and curl, its commands run as `sandbox`, uid 1000, who may `sudo`) with `envs`, `memoryMB` and `cpuCount`; answers once it runs.', body: CreateSandboxBody, response: { 201: ok('The sandbox, running', SandboxData), ...errors } },
    }, async (req, reply) => {
      const b = req.body;
      const input = {
        env: b.envs,
        metadata: b.metadata,
        limits: { memoryMb: b.memoryMB, cpuPercent: b.cpuCount ? b.cpuCount * 100 : undefined },
        idleTimeoutS: b.timeout,
        secretStore: b.secretStore,
      };
      const boot = async (onLog?: Parameters<typeof fp.builds.buildDockerfile>[2]) => {
        // A snapshot, or a template of that name, starts from its checkpoint; an image manifest
        // is built (or found built) first; otherwise templateID is an image.
        const template = b.snapshot ?? (b.templateID && (await fp.templates.list(req.owner)).some((t) => t.name === b.templateID) ? b.templateID : undefined);
        if (template && b.secretStore !== undefined) {
          // Its sandboxes are forks: they keep the secrets it was made with (OpenComputer refuses the same).
          throw new InvalidRequestError('secretStore cannot be given with a snapshot or template: its sandboxes keep the secrets it was made with', { reason: 'SECRET_STORE_WITH_SNAPSHOT' });
        }
        if (template) return fp.templates.instantiate(req.owner, template, input);
        if (b.image) {
          const built = await fp.builds.buildManifest(req.owner, b.image, fp.config.manifestBaseImage, onLog, req.clientGone);
          return fp.instances.create(req.owner, { ...input, image: built.image.name });
        }
        // OpenComputer's default sandbox (no template, or `base`): Debian's image with its
        // `sandbox` user (images/opencomputer-base), made for the owner the first time.
        const image = !b.templateID || b.templateID === 'base' ? await fp.bundled.image(req.owner, OC_BASE) : b.templateID;
        return fp.instances.create(req.owner, { ...input, image });
      };
      // OpenComputer's sandboxes have /workspace, its examples' working directory, whatever
      // the image: made here once, as the E2B face makes E2B's home.
      const create = async (onLog?: Parameters<typeof fp.builds.buildDockerfile>[2]) => {
        const rec = await boot(onLog);
        await fp.files.mkdir(req.owner, rec.id, OC_WORKSPACE);
        return rec;
      };
      if ((b.image || b.snapshot) && wantsEvents(req)) return streamBuild(req, reply, create, sandboxView);
      return reply.code(201).send(sandboxView(await create()));
    });

    app.get('/sandboxes', {
      schema: { operationId: 'ocListSandboxes', tags, summary: 'List sandboxes', description: 'Every sandbox of the token\'s owner, newest first.', response: { 200: ok('The sandboxes', z.array(SandboxData)), ...errors } },
    }, async (req) => (await fp.instances.list(req.owner, 500)).items.map(sandboxView));

    app.get('/sandboxes/:id', {
      schema: { operationId: 'ocGetSandbox', tags, summary: 'Get a sandbox', description: 'Its status (`running`, `hibernated`, `creating`, `error`) and settings.', params: SandboxParams, response: { 200: ok('The sandbox', SandboxData), ...errors } },
    }, async (req) => sandboxView(await fp.instances.get(req.owner, req.params.id)));

    app.delete('/sandboxes/:id', {
      schema: { operationId: 'ocKillSandbox', tags, summary: 'Kill a sandbox', description: 'Deletes the sandbox, its disk and its checkpoints; sandboxes made from its checkpoints keep running.', params: SandboxParams, response: { 204: noContent('Gone'), ...errors } },
    }, async (req, reply) => {
      await fp.deleteInstance(req.owner, req.params.id);
      return reply.code(204).send(null);
    });

    app.post('/sandboxes/:id/hibernate', {
      schema: { operationId: 'ocHibernateSandbox', tags, summary: 'Hibernate: memory to disk, RAM freed', description: 'Its memory, processes and exec sessions go to an image and its RAM is freed; `wake`, or any call that needs it (exec, files, attach), restores it exactly as it was.', params: SandboxParams, response: { 200: ok('The sandbox, hibernated', SandboxData), ...errors } },
    }, async (req) => sandboxView(await fp.instances.hibernate(req.owner, req.params.id)));

    app.post('/sandboxes/:id/wake', {
      schema: { operationId: 'ocWakeSandbox', tags, summary: 'Wake a hibernated sandbox', description: 'Restores it exactly as it was hibernated (a stopped one boots on its files); `timeout` becomes its idle timeout (0: never).', params: SandboxParams, body: optionalBody(WakeBody), ...OPTIONAL_BODY, response: { 200: ok('The sandbox, running', SandboxData), ...errors } },
    }, async (req) => {
      const rec = await fp.instances.start(req.owner, req.params.id);
      const timeout = req.body?.timeout;
      return sandboxView(timeout === undefined ? rec : await fp.instances.setIdleTimeout(req.owner, rec.id, timeout));
    });

    app.get('/sandboxes/:id/allowed-hosts', {
      schema: {
        operationId: 'ocGetAllowedHosts',
        tags,
        summary: 'Where the sandbox may connect to',
        description: 'Its egress policy in OpenComputer\'s shape: `egressAllowlist` lists what is allowed when egress is denied by default (empty: anywhere public).',
        params: SandboxParams,
        response: { 200: ok('The allowlist', AllowedHosts), ...errors },
      },
    }, async (req) => {
      const r = await fp.instances.get(req.owner, req.params.id);
      return { sandboxID: r.id, egressAllowlist: r.egress.egress === 'deny' ? r.egress.allow : [], perSecretAllowedHosts: Object.fromEntries(r.secrets.map((s) => [s.env, s.hosts])) };
    });

    app.post('/sandboxes/:id/timeout', {
      schema: { operationId: 'ocSetTimeout', tags, summary: 'Set the idle timeout', description: 'Seconds without activity (no call, no attached client) after which the sandbox hibernates by itself; 0: never.', params: SandboxParams, body: TimeoutBody, response: { 204: noContent('Set'), ...errors } },
    }, async (req, reply) => {
      await fp.instances.setIdleTimeout(req.owner, req.params.id, req.body.timeout);
      return reply.code(204).send(null);
    });

    app.post('/sandboxes/:id/exec/run', {
      schema: { operationId: 'ocRunCommand', tags, summary: 'Run a command and wait for it', description: 'Runs `cmd` with `args` (no shell) and answers when it ends, with its exit code and output.', params: SandboxParams, body: RunBody, response: { 200: ok('How it ended', RunResult), ...errors } },
    }, async (req, reply) => {
      const b = req.body;
      const r = await fp.commands.exec(req.owner, req.params.id, {
        command: [b.cmd, ...(b.args ?? [])],
        env: b.envs,
        cwd: b.cwd,
        startIn: 'home',
        timeoutMs: b.timeout ? Math.round(b.timeout * 1000) : undefined,
        signal: req.clientGone,
      });
      return sendWithOutputs(reply, [['exitCode', r.exitCode], ['stdout', r.stdout], ['stderr', r.stderr]], 'utf8');
    });

    // Signed file links (OpenComputer's downloadUrl / uploadUrl): one path, one direction, until
    // they expire or the API token that made them is revoked; usable with no key (a browser).
    for (const direction of ['download', 'upload'] as const) {
      app.post(`/sandboxes/:id/files/${direction}-url`, {
        schema: {
          operationId: direction === 'download' ? 'ocFileDownloadUrl' : 'ocFileUploadUrl',
          tags,
          summary: direction === 'download' ? 'A signed link that reads a file' : 'A signed link that writes a file',
          description: `A URL that ${direction === 'download' ? 'GETs' : 'PUTs'} that one path of the sandbox without an API key, for \`expiresIn\` seconds (at most a day).`,
          params: SandboxParams,
          body: FileLinkRequest,
          response: { 200: ok('The link', FileLink), ...errors },
        },
      }, async (req) => {
        const credential = req.credential;
        if (credential?.kind !== 'owner') throw new InvalidRequestError('a file link is made with an API token');
        await fp.instances.get(req.owner, req.params.id);
        const { token, expiresAt } = fp.credentials.fileLinkFor(credential, req.params.id, req.body.path, direction, req.body.expiresIn);
        const { host, scheme } = clientOrigin(req);
        const query = new URLSearchParams({ path: req.body.path, signature: token });
        return { url: `${scheme}://${host}/api/sandboxes/${req.params.id}/files/signed?${query}`, expiresAt: expiresAt.toISOString() };
      });
    }

    app.post('/sandboxes/:id/checkpoints', {
      schema: {
        operationId: 'ocCreateCheckpoint',
        tags,
        summary: 'Take a checkpoint (memory and files)', description: 'Checkpoints files, memory and running processes; the checkpoint is `processing`, then `ready`.',
        params: SandboxParams,
        body: CreateCheckpointBody,
        response: { 201: ok('The checkpoint, processing', CheckpointInfo), ...errors },
      },
    }, async (req, reply) => {
      const { checkpoint } = await fp.checkpoints.create(req.owner, req.params.id, { label: req.body.name, memory: true, uniqueLabel: true }).catch((err: unknown) => {
        // OpenComputer answers its per-sandbox checkpoint limit with 400, not 429.
        if (err instanceof QuotaExceededError && (err.details as { reason?: string } | undefined)?.reason === 'CHECKPOINTS_PER_INSTANCE') {
          throw new InvalidRequestError(err.message, err.details, { cause: err });
        }
        throw err;
      });
      return reply.code(201).send(checkpointView(checkpoint));
    });

    app.get('/sandboxes/:id/checkpoints', {
      schema: { operationId: 'ocListCheckpoints', tags, summary: 'List checkpoints', description: 'The sandbox\'s checkpoints, newest first.', params: SandboxParams, response: { 200: ok('The checkpoints', z.array(CheckpointInfo)), ...errors } },
    }, async (req) => (await fp.checkpoints.list(req.owner, req.params.id, 500)).items.map(checkpointView));

    app.post('/sandboxes/:id/checkpoints/:checkpointId/restore', {
      schema: {
        operationId: 'ocRestoreCheckpoint',
        tags,
        summary: 'Roll the sandbox back to a checkpoint', description: 'Rolls the sandbox back in place: files, memory and processes as they were at the checkpoint.',
        params: SandboxCheckpointParams,
        response: { 200: ok('The sandbox, on the checkpoint', SandboxData), ...errors },
      },
    }, async (req) => sandboxView(await fp.checkpoints.rollback(req.owner, req.params.id, req.params.checkpointId)));

    app.delete('/sandboxes/:id/checkpoints/:checkpointId', {
      schema: { operationId: 'ocDeleteCheckpoint', tags, summary: 'Delete a checkpoint', description: '409 while it is processing or being forked from.', params: SandboxCheckpointParams, response: { 204: noContent('Deleted'), ...errors } },
    }, async (req, reply) => {
      await fp.checkpoints.delete(req.owner, req.params.id, req.params.checkpointId);
      return reply.code(204).send(null);
    });

    app.post('/sandboxes/from-checkpoint/:checkpointId', {
      config: { placement: 'fork' },
      schema: {
        operationId: 'ocCreateFromCheckpoint',
        tags,
        summary: 'A new sandbox from a checkpoint (a fork)', description: 'A fork: a new sandbox running exactly what the checkpoint holds, with `envs` added.',
        params: CheckpointOnlyParams,
        body: FromCheckpointBody,
        response: { 201: ok('The new sandbox', SandboxData), ...errors },
      },
    }, async (req, reply) => {
      const c = await fp.checkpoints.find(req.owner, req.params.checkpointId);
      const [rec] = await fp.checkpoints.fork(req.owner, c.instanceId, { checkpointId: c.id, env: req.body.envs });
      const timeout = req.body.timeout;
      return reply.code(201).send(sandboxView(timeout ? await fp.instances.setIdleTimeout(req.owner, rec!.id, timeout) : rec!));
    });

    await app.register(execSessionRoutes(fp));
    await app.register(ocImageRoutes(fp));
    await app.register(ocSecretStoreRoutes(fp));
    await app.register(fileRoutes(fp));
  };

const fileRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['opencomputer'];
    const errors = ocErrorResponses;
    // File bodies are raw bytes whatever their content type, streamed.
    app.removeAllContentTypeParsers();
    app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));

    app.get('/sandboxes/:id/files', {
      schema: {
        operationId: 'ocReadFile',
        tags,
        summary: 'Read a file (a directory is a 400)', description: 'The bytes as they are, streamed; a directory is a 400.',
        params: SandboxParams,
        querystring: PathQuery,
        produces: ['application/octet-stream'],
        response: { 200: { description: 'The file\'s bytes', content: { 'application/octet-stream': { schema: Binary } } }, ...errors },
      },
    }, async (req, reply) => {
      return sendFileBytes(reply, fp.files.readStream(req.owner, req.params.id, req.query.path));
    });

    app.put('/sandboxes/:id/files', {
      schema: {
        operationId: 'ocWriteFile',
        tags,
        summary: 'Write a file (the raw body), making parent directories', description: 'The raw body becomes the file (streamed into a temporary name, renamed once whole); parent directories are made.',
        params: SandboxParams,
        querystring: PathQuery,
        consumes: ['application/octet-stream'],
        body: Binary,
        response: { 204: noContent('Written'), ...errors },
      },
    }, async (req, reply) => {
      await fp.files.writeStream(req.owner, req.params.id, req.query.path, req.body as Readable);
      return reply.code(204).send(null);
    });

    const signed = { scope: 'file' as const };
    app.get('/sandboxes/:id/files/signed', {
      config: signed,
      schema: { operationId: 'ocReadSignedFile', tags, summary: 'Read a file by its signed link', description: 'The bytes, with no API key: the link\'s `signature` is for this path and for reading.', params: SandboxParams, querystring: SignedPathQuery, produces: ['application/octet-stream'], response: { 200: { description: 'The file\'s bytes', content: { 'application/octet-stream': { schema: Binary } } }, ...errors } },
    }, async (req, reply) => {
      return sendFileBytes(reply, fp.files.readStream(req.owner, req.params.id, req.query.path));
    });
    app.put('/sandboxes/:id/files/signed', {
      config: signed,
      schema: { operationId: 'ocWriteSignedFile', tags, summary: 'Write a file by its signed link', description: 'The raw body becomes the file, with no API key: the link\'s `signature` is for this path and for writing.', params: SandboxParams, querystring: SignedPathQuery, consumes: ['application/octet-stream'], body: Binary, response: { 204: noContent('Written'), ...errors } },
    }, async (req, reply) => {
      await fp.files.writeStream(req.owner, req.params.id, req.query.path, req.body as Readable);
      return reply.code(204).send(null);
    });

    app.delete('/sandboxes/:id/files', {
      schema: { operationId: 'ocDeleteFile', tags, summary: 'Remove a file, or a directory and everything in it', description: 'As OpenComputer\'s agent does (`os.RemoveAll`): a link itself, never what it points to; removing what is not there is no error.', params: SandboxParams, querystring: PathQuery, response: { 204: noContent('Removed'), ...errors } },
    }, async (req, reply) => {
      await removeTree(fp, req.owner, req.params.id, req.query.path);
      return reply.code(204).send(null);
    });

    app.get('/sandboxes/:id/files/list', {
      schema: { operationId: 'ocListFiles', tags, summary: 'List a directory', description: 'Its entries, with whether each is a directory and its size.', params: SandboxParams, querystring: PathQuery, response: { 200: ok('Its entries', z.array(EntryInfo)), ...errors } },
    }, async (req) => {
      const base = req.query.path.replace(/\/+$/, '');
      return (await fp.files.list(req.owner, req.params.id, req.query.path)).map((e) => ({
        name: e.name,
        isDir: e.type === 'dir',
        path: `${base}/${e.name}`,
        size: e.size,
      }));
    });

    app.post('/sandboxes/:id/files/mkdir', {
      schema: { operationId: 'ocMakeDirectory', tags, summary: 'Make a directory and its parents', description: 'Like mkdir -p.', params: SandboxParams, querystring: PathQuery, response: { 204: noContent('Made'), ...errors } },
    }, async (req, reply) => {
      await fp.files.mkdir(req.owner, req.params.id, req.query.path);
      return reply.code(204).send(null);
    });
  };
