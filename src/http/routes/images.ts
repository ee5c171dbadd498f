import type { Readable } from 'node:stream';
import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { InvalidRequestError } from '../../core/errors.js';
import type { ImageView } from '../../core/images.js';
import type { TemplateRecord } from '../../store/templates.js';
import {
  Binary, BuildContextQuery, BuildImageRequest, CreateTemplateRequest, errorResponses, Image, ImageList, ImageNameParams, ImageRefParams, noContent, ok, PulledImage, PullImageRequest, Template, TemplateList,
} from '../schemas/index.js';
import { streamBuild, streamWork, wantsEvents } from '../streams/build-sse.js';
import type { PullProgress } from '../../core/pulls.js';

export const imageView = (i: ImageView) => ({
  name: i.name,
  kind: i.kind,
  base: i.base,
  layers: i.layers,
  config: { env: i.config.env, workdir: i.config.workdir, user: i.config.user, cmd: i.config.cmd, entrypoint: i.config.entrypoint, labels: i.config.labels, exposed_ports: i.config.exposedPorts, volumes: i.config.volumes ?? [] },
  created_at: i.createdAt,
});

export const templateView = (t: TemplateRecord) => ({
  name: t.name,
  status: t.status,
  source: t.source,
  start_command: t.startCommand,
  error: t.error,
  created_at: t.createdAt,
});

/** How long an explicit pull may take before it is given up. */
const PULL_DEADLINE_MS = 30 * 60_000;

const built = {
  201: ok('The image, built (or, with `Accept: text/event-stream`, 200 and the build log as events: `build_log`, then `result` or `error`)', Image),
  422: { description: 'A step failed: BUILD_STEP_FAILED, with its line and the end of its output', content: { 'application/json': { schema: errorResponses[400].content['application/json'].schema } } },
  ...errorResponses,
};

function parseBuildArgs(text: string | undefined): Record<string, string> | undefined {
  if (text === undefined) return undefined;
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw new InvalidRequestError('build_args is a JSON object of strings');
  }
  const r = z.record(z.string(), z.string()).safeParse(v);
  if (!r.success) throw new InvalidRequestError('build_args is a JSON object of strings');
  return r.data;
}

/** Images (system and built from Dockerfiles) and templates. */
export const imageRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['images'];
    app.addContentTypeParser(['application/x-tar', 'application/gzip', 'application/x-gzip', 'application/octet-stream'], (_req, payload, done) => done(null, payload));

    app.get('/images', {
      schema: { operationId: 'listImages', tags, summary: 'List images', description: 'The system images every owner shares and your built ones.', response: { 200: ok('The images', ImageList), ...errorResponses } },
    }, async (req) => ({ images: (await fp.catalog.list(req.owner)).map(imageView) }));

    app.get('/images/:name', {
      schema: { operationId: 'getImage', tags, summary: 'Get an image', description: 'Its kind, base, layers and configuration.', params: ImageRefParams, response: { 200: ok('The image', Image), ...errorResponses } },
    }, async (req) => imageView(await fp.catalog.get(req.owner, req.params.name)));

    app.post('/images/pull', {
      schema: {
        operationId: 'pullImage',
        tags,
        summary: 'Pull an image from a registry',
        description:
          'Resolves the reference for this host\'s platform (a multi-platform index is followed), fetches what is not here yet (each blob checked against its digest), applies the layers\' whiteouts, and records the image as yours under its full reference (`docker.io/library/python:3.12-slim`), the name instances and `FROM` use (`image` at create also pulls by itself). ' +
          'A pull asks the registry every time (a tag may have moved; another owner\'s pull of the same image lets you in to nothing): what is here already is not fetched again. Plain HTTP only for registries on loopback or in `FORKPOINT_INSECURE_REGISTRIES`. ' +
          'With `Accept: text/event-stream` the pull is told as it goes: `pull_progress` events ({stage: resolve, fetch or unpack, message}), then `result` (the answer) or `error`. ' +
          'Errors carry `details.reason`: REGISTRY_DENIED (403), REGISTRY_NOT_IN_REGISTRY (404), REGISTRY_TOO_LARGE (413, FORKPOINT_MAX_PULL_MB), REGISTRY_NO_PLATFORM (400), REGISTRY_CORRUPT or REGISTRY_UNREACHABLE (503); nothing of a failed pull is kept.',
        body: PullImageRequest,
        response: { 201: ok('The image, pulled', PulledImage), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body;
      const credentials = b.username !== undefined && b.password !== undefined ? { username: b.username, password: b.password } : undefined;
      const run = (onProgress?: (p: PullProgress) => void) => fp.catalog.pull(req.owner, b.reference, credentials, AbortSignal.any([req.clientGone, AbortSignal.timeout(PULL_DEADLINE_MS)]), onProgress);
      const answer = (r: Awaited<ReturnType<typeof run>>) => ({ image: imageView(r.image), digest: r.digest, fetched_bytes: r.fetchedBytes });
      if (wantsEvents(req)) return streamWork(req, reply, 'pull_progress', run, answer);
      return reply.code(201).send(answer(await run()));
    });

    app.post('/images', {
      schema: {
        operationId: 'buildImage',
        tags,
        summary: 'Build an image from a Dockerfile',
        description:
          'Each step runs in a sandbox on the layers so far and what it writes becomes a layer; steps are cached by a hash of the parent and the step, so an unchanged build makes nothing. Supports FROM (an image or a template), RUN, COPY/ADD, ENV, WORKDIR, USER, ARG, LABEL, EXPOSE, CMD, ENTRYPOINT. With `Accept: text/event-stream` the log comes as it happens. A build of an existing name replaces it (instances on the old one keep it).',
        body: BuildImageRequest,
        response: built,
      },
    }, async (req, reply) => {
      const b = req.body;
      const run = (onLog?: Parameters<typeof fp.builds.buildDockerfile>[2]) =>
        fp.builds.buildDockerfile(req.owner, { name: b.name, dockerfile: b.dockerfile, buildArgs: b.build_args, memoryMb: b.memory_mb, signal: req.clientGone }, onLog);
      if (wantsEvents(req)) return streamBuild(req, reply, run, imageView);
      return reply.code(201).send(imageView(await run()));
    });

    app.post('/images/:name/build', {
      schema: {
        operationId: 'buildImageFromContext',
        tags,
        summary: 'Build an image from a build context (a tar)',
        description: 'The body is a tar (gzip or not) of the build context, with the Dockerfile in it; `.dockerignore` applies to COPY. Links in the context are copied as links, never followed. Otherwise as POST /images.',
        params: ImageNameParams,
        querystring: BuildContextQuery,
        consumes: ['application/x-tar', 'application/gzip'],
        body: Binary,
        response: built,
      },
    }, async (req, reply) => {
      const q = req.query;
      const run = (onLog?: Parameters<typeof fp.builds.buildDockerfile>[2]) =>
        fp.builds.buildDockerfile(req.owner, { name: req.params.name, dockerfilePath: q.dockerfile, contextTar: req.body as Readable, buildArgs: parseBuildArgs(q.build_args), memoryMb: q.memory_mb, signal: req.clientGone }, onLog);
      if (wantsEvents(req)) return streamBuild(req, reply, run, imageView);
      return reply.code(201).send(imageView(await run()));
    });

    app.post('/images/prune', {
      schema: {
        operationId: 'pruneBuildCache',
        tags,
        summary: 'Empty the build cache',
        description: 'Forgets every cached build step of yours (the next build runs every step again). Images keep their layers; layers only the cache held are deleted. Steps unused for 7 days go by themselves at each start.',
        response: { 200: ok('How many cached steps went', z.object({ removed: z.number().int() }).meta({ id: 'PrunedCache' })), ...errorResponses },
      },
    }, async (req) => ({ removed: await fp.builds.prune(new Date(Date.now() + 1000), req.owner) }));

    app.delete('/images/:name', {
      schema: { operationId: 'deleteImage', tags, summary: 'Delete a built image', description: 'A built or pulled image of yours. Refused (409) while instances stand on it, and for system images. Its layers go once nothing else holds them.', params: ImageRefParams, response: { 204: noContent('Deleted'), ...errorResponses } },
    }, async (req, reply) => {
      await fp.catalog.delete(req.owner, req.params.name);
      await fp.instances.collectLayers();
      return reply.code(204).send(null);
    });

    const ttags = ['templates'];
    app.post('/templates', {
      schema: {
        operationId: 'createTemplate',
        tags: ttags,
        summary: 'Make a template',
        description: 'Boots the image (or restores the checkpoint), starts the start command, waits for the ready command, and takes a memory checkpoint. Instances created with `template` are restored from it: what was running is up from their first call.',
        body: CreateTemplateRequest,
        response: { 201: ok('The template, ready', Template), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body;
      const t = await fp.templates.create(req.owner, { name: b.name, fromImage: b.from_image, fromCheckpoint: b.from_checkpoint, startCommand: b.start_command, readyCommand: b.ready_command, readyTimeoutS: b.ready_timeout_s });
      return reply.code(201).send(templateView(t));
    });

    app.get('/templates', {
      schema: { operationId: 'listTemplates', tags: ttags, summary: 'List templates', description: 'Yours, by name.', response: { 200: ok('The templates', TemplateList), ...errorResponses } },
    }, async (req) => ({ templates: (await fp.templates.list(req.owner)).map(templateView) }));

    app.get('/templates/:name', {
      schema: { operationId: 'getTemplate', tags: ttags, summary: 'Get a template', description: 'Its status and source.', params: ImageNameParams, response: { 200: ok('The template', Template), ...errorResponses } },
    }, async (req) => templateView(await fp.templates.get(req.owner, req.params.name)));

    app.delete('/templates/:name', {
      config: { sharedWithE2b: true }, // E2B's Sandbox.deleteSnapshot
      schema: { operationId: 'deleteTemplate', tags: ttags, summary: 'Delete a template', description: 'Instances made from it go on (they hold their own layers).', params: ImageNameParams, response: { 204: noContent('Deleted'), ...errorResponses } },
    }, async (req, reply) => {
      await fp.templates.delete(req.owner, req.params.name);
      return reply.code(204).send(null);
    });
  };
