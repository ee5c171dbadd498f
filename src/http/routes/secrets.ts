import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { SecretView } from '../../core/egress-secrets.js';
import { errorResponses, noContent, ok, PutSecretRequest, Secret, SecretList, SecretParams } from '../schemas/index.js';

const view = (s: SecretView) => ({ name: s.name, created_at: s.createdAt, updated_at: s.updatedAt });

/** Your secrets: kept sealed, never shown back, put into requests by the egress proxy. */
export const secretRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['secrets'];
    app.put('/secrets/:name', {
      schema: {
        operationId: 'putSecret',
        tags,
        summary: 'Keep a secret (or replace its value)',
        description:
          'Instances that name it (`secrets: [{name, hosts}]` at create) see a placeholder in a variable; their requests to those hosts carry the value in its place, put in by the egress proxy. A new value is in force at once for the instances that use it.',
        params: SecretParams,
        body: PutSecretRequest,
        response: { 200: ok('Kept (without its value)', Secret), ...errorResponses },
      },
    }, async (req) => {
      const s = await fp.secrets.put(req.owner, req.params.name, req.body.value);
      await fp.instances.refreshSecret(req.owner, req.params.name);
      return view(s);
    });

    app.get('/secrets', {
      schema: { operationId: 'listSecrets', tags, summary: 'Your secrets', description: 'Names and dates; never a value.', response: { 200: ok('Your secrets', SecretList), ...errorResponses } },
    }, async (req) => ({ items: (await fp.secrets.list(req.owner)).map(view) }));

    app.delete('/secrets/:name', {
      schema: {
        operationId: 'deleteSecret',
        tags,
        summary: 'Delete a secret',
        description: 'Instances that used it send its placeholder from then on.',
        params: SecretParams,
        response: { 204: noContent('Deleted'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.secrets.delete(req.owner, req.params.name);
      await fp.instances.refreshSecret(req.owner, req.params.name);
      return reply.code(204).send(null);
    });
  };
