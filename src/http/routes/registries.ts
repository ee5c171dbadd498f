import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { RegistryLoginView } from '../../core/registry-logins.js';
import { errorResponses, noContent, ok, RegistryLogin, RegistryLoginList, RegistryLoginRequest, RegistryParams } from '../schemas/index.js';

const view = (l: RegistryLoginView) => ({ registry: l.registry, username: l.username, created_at: l.createdAt });

/** Your credentials for private registries: kept for your pulls (explicit, or made by a create or
 * a build), never shown back. */
export const registryRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['images'];
    app.put('/registries/:registry/login', {
      schema: {
        operationId: 'setRegistryLogin',
        tags,
        summary: 'Keep credentials for a registry',
        description: 'Your pulls from this registry use them from now on (a pull that names its own credentials uses those). Replaces what you kept for it. The password is kept sealed and never shown back.',
        params: RegistryParams,
        body: RegistryLoginRequest,
        response: { 200: ok('What is kept (without the password)', RegistryLogin), ...errorResponses },
      },
    }, async (req) => view(await fp.registryLogins.set(req.owner, req.params.registry, req.body.username, req.body.password)));

    app.get('/registries', {
      schema: { operationId: 'listRegistryLogins', tags, summary: 'The registries you keep credentials for', description: 'Registry and user name; never a password.', response: { 200: ok('Your registry logins', RegistryLoginList), ...errorResponses } },
    }, async (req) => ({ items: (await fp.registryLogins.list(req.owner)).map(view) }));

    app.delete('/registries/:registry/login', {
      schema: { operationId: 'deleteRegistryLogin', tags, summary: 'Forget a registry\'s credentials', description: 'Images already pulled with them stay yours.', params: RegistryParams, response: { 204: noContent('Forgotten'), ...errorResponses } },
    }, async (req, reply) => {
      await fp.registryLogins.delete(req.owner, req.params.registry);
      return reply.code(204).send(null);
    });
  };
