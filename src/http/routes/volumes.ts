import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { CreateVolumeRequest, errorResponses, noContent, ok, Volume, VolumeList, VolumeParams } from '../schemas/index.js';
import { volumeView } from '../views.js';

/** Persistent volumes: yours, on the node that made them, mounted by instances that name them. */
export const volumeRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['volumes'];
    app.post('/volumes', {
      config: { placement: 'here' },
      schema: {
        operationId: 'createVolume',
        tags,
        summary: 'Create a persistent volume',
        description:
          'A filesystem of `size_mb` on this node\'s disk, empty and owned by root. Instances mount it with `volumes: [{name, path}]` at creation; several may mount it at once. It is not part of any checkpoint (a rollback leaves it as it is) and outlives the instances that mount it.',
        body: CreateVolumeRequest,
        response: { 201: ok('The volume', Volume), ...errorResponses },
      },
    }, async (req, reply) => reply.code(201).send(volumeView(await fp.volumes.create(req.owner, { name: req.body.name, sizeMb: req.body.size_mb }))));

    app.get('/volumes', {
      config: { placement: 'here' },
      schema: { operationId: 'listVolumes', tags, summary: 'Your volumes', description: 'Each with its size, what its files take (when this node holds it) and the instances that mount it.', response: { 200: ok('Your volumes, by name', VolumeList), ...errorResponses } },
    }, async (req) => ({ items: (await fp.volumes.list(req.owner)).map(volumeView) }));

    app.get('/volumes/:name', {
      config: { placement: 'volume' },
      schema: { operationId: 'getVolume', tags, summary: 'A volume', description: 'Its size, what its files take now, its node and the instances that mount it.', params: VolumeParams, response: { 200: ok('The volume', Volume), ...errorResponses } },
    }, async (req) => volumeView(await fp.volumes.get(req.owner, req.params.name)));

    app.delete('/volumes/:name', {
      config: { placement: 'volume' },
      schema: {
        operationId: 'deleteVolume',
        tags,
        summary: 'Delete a volume and its files',
        description: 'Refused (409 `VOLUME_IN_USE`) while an instance mounts it: delete those first.',
        params: VolumeParams,
        response: { 204: noContent('Deleted'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.volumes.delete(req.owner, req.params.name);
      return reply.code(204).send(null);
    });
  };
