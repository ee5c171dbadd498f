import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { ImageManifest } from '../../core/build/manifest.js';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { ImageView } from '../../core/images.js';
import type { TemplateRecord } from '../../store/templates.js';
import { noContent, ok } from '../schemas/common.js';
import { streamBuild, wantsEvents } from '../streams/build-sse.js';
import { ocErrorResponses } from './schemas.js';

/** OpenComputer's snapshot: a named, ready-to-start state built from an image manifest. */
export const SnapshotInfo = z
  .object({
    id: z.string(),
    orgId: z.string(),
    name: z.string(),
    contentHash: z.string(),
    checkpointId: z.string(),
    status: z.string(),
    manifest: z.record(z.string(), z.unknown()),
    createdAt: z.string(),
    lastUsedAt: z.string(),
  })
  .meta({ id: 'OpenComputerSnapshot' });

const TemplateInfo = z.object({ templateID: z.string(), name: z.string(), tag: z.string(), status: z.string() }).meta({ id: 'OpenComputerTemplate' });
const NameParams = z.object({ name: z.string().min(1).max(63) });

const snapshotView = (t: TemplateRecord, manifest: Record<string, unknown> = {}) => ({
  id: t.name,
  orgId: t.owner,
  name: t.name,
  contentHash: t.source.replace(/^image:oc-/, ''),
  checkpointId: t.checkpointId ?? '',
  status: t.status,
  manifest,
  createdAt: t.createdAt,
  lastUsedAt: t.createdAt,
});

const templateInfo = (i: ImageView) => ({ templateID: i.name, name: i.name, tag: 'latest', status: 'ready' });

/** OpenComputer's `Snapshots` (an image manifest built, then a template of it) and `Templates`
 * (images built from a Dockerfile), over the same builder and templates as the rest. */
export const ocImageRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['opencomputer'];
    const errors = ocErrorResponses;

    app.post('/snapshots', {
      schema: {
        operationId: 'ocCreateSnapshot',
        tags,
        summary: 'Build an image manifest into a named snapshot',
        description: 'Builds the manifest (cached by its hash: the same manifest is built once), boots it and keeps a memory checkpoint under `name`; `Sandbox.create({snapshot})` starts from it. With `Accept: text/event-stream`, `build_log` events, then `result`.',
        body: z.object({ name: z.string().min(1).max(63), image: ImageManifest }),
        response: { 201: ok('The snapshot, ready', SnapshotInfo), ...errors },
      },
    }, async (req, reply) => {
      const { name, image } = req.body;
      const run = async (onLog?: Parameters<typeof fp.builds.buildDockerfile>[2]) => {
        const built = await fp.builds.buildManifest(req.owner, image, fp.config.manifestBaseImage, onLog, req.clientGone);
        return fp.templates.create(req.owner, { name, fromImage: built.image.name });
      };
      if (wantsEvents(req)) return streamBuild(req, reply, run, (t) => snapshotView(t, image));
      return reply.code(201).send(snapshotView(await run(), image));
    });

    app.get('/snapshots', {
      schema: { operationId: 'ocListSnapshots', tags, summary: 'List snapshots', description: 'Every template of the owner.', response: { 200: ok('The snapshots', z.array(SnapshotInfo)), ...errors } },
    }, async (req) => (await fp.templates.list(req.owner)).map((t) => snapshotView(t)));

    app.get('/snapshots/:name', {
      schema: { operationId: 'ocGetSnapshot', tags, summary: 'Get a snapshot', description: 'By name.', params: NameParams, response: { 200: ok('The snapshot', SnapshotInfo), ...errors } },
    }, async (req) => snapshotView(await fp.templates.get(req.owner, req.params.name)));

    app.delete('/snapshots/:name', {
      schema: { operationId: 'ocDeleteSnapshot', tags, summary: 'Delete a snapshot', description: 'Sandboxes started from it go on.', params: NameParams, response: { 204: noContent('Deleted'), ...errors } },
    }, async (req, reply) => {
      await fp.templates.delete(req.owner, req.params.name);
      return reply.code(204).send(null);
    });

    app.post('/templates', {
      schema: {
        operationId: 'ocBuildTemplate',
        tags,
        summary: 'Build a template (an image) from a Dockerfile',
        description: 'The Dockerfile is built step by step (cached); `Sandbox.create({template: name})` boots it.',
        body: z.object({ name: z.string().min(1).max(63), dockerfile: z.string().min(1).max(1 << 20) }),
        response: { 201: ok('The template', TemplateInfo), ...errors },
      },
    }, async (req, reply) => {
      const image = await fp.builds.buildDockerfile(req.owner, { name: req.body.name, dockerfile: req.body.dockerfile, signal: req.clientGone });
      return reply.code(201).send(templateInfo(image));
    });

    app.get('/templates', {
      schema: { operationId: 'ocListTemplates', tags, summary: 'List templates', description: 'The images a sandbox can be created on.', response: { 200: ok('The templates', z.array(TemplateInfo)), ...errors } },
    }, async (req) => (await fp.catalog.list(req.owner)).map(templateInfo));

    app.get('/templates/:name', {
      schema: { operationId: 'ocGetTemplate', tags, summary: 'Get a template', description: 'By name.', params: NameParams, response: { 200: ok('The template', TemplateInfo), ...errors } },
    }, async (req) => templateInfo(await fp.catalog.get(req.owner, req.params.name)));

    app.delete('/templates/:name', {
      schema: { operationId: 'ocDeleteTemplate', tags, summary: 'Delete a template', description: 'Refused while sandboxes stand on it.', params: NameParams, response: { 204: noContent('Deleted'), ...errors } },
    }, async (req, reply) => {
      await fp.catalog.delete(req.owner, req.params.name);
      await fp.instances.collectLayers();
      return reply.code(204).send(null);
    });
  };
