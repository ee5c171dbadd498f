import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { SecretEntryView, SecretStoreView } from '../../core/secret-stores.js';
import { noContent, ok } from '../schemas/common.js';
import { ocErrorResponses } from './schemas.js';

const HostList = z.array(z.string().min(1).max(253)).max(64);
const StoreParams = z.object({ id: z.string().min(1).max(64) });
const EntryParams = z.object({ id: z.string().min(1).max(64), name: z.string().min(1).max(64) });
const CreateStoreBody = z.object({ name: z.string().min(1).max(63), egressAllowlist: HostList.optional() }).strip().meta({ id: 'OcCreateSecretStoreRequest', examples: [{ name: 'prod', egressAllowlist: ['api.openai.com'] }] });
const UpdateStoreBody = z.object({ name: z.string().min(1).max(63).optional(), egressAllowlist: HostList.optional() }).strip().meta({ id: 'OcUpdateSecretStoreRequest' });
const SetSecretBody = z.object({ value: z.string().min(1).max(8192), allowedHosts: z.array(z.string().min(1).max(253)).max(16).optional() }).strip().meta({ id: 'OcSetSecretRequest', examples: [{ value: 'sk-...', allowedHosts: ['api.openai.com'] }] });
const SecretStoreInfo = z
  .object({ id: z.string(), orgId: z.string(), name: z.string(), egressAllowlist: z.array(z.string()), createdAt: z.string(), updatedAt: z.string() })
  .meta({ id: 'OcSecretStore' });
const SecretEntryInfo = z
  .object({ id: z.string(), storeId: z.string(), name: z.string(), allowedHosts: z.array(z.string()), createdAt: z.string(), updatedAt: z.string() })
  .meta({ id: 'OcSecretEntry' });
const SecretSet = z.object({ name: z.string(), status: z.literal('set'), refreshed: z.number().int().describe('running sandboxes here whose requests carry the new value from now on') }).meta({ id: 'OcSecretSet' });

const storeView = (owner: string, s: SecretStoreView) => ({ id: s.id, orgId: owner, name: s.name, egressAllowlist: s.egressAllowlist, createdAt: s.createdAt, updatedAt: s.updatedAt });
const entryView = (e: SecretEntryView) => ({ id: `${e.storeId}/${e.name}`, storeId: e.storeId, name: e.name, allowedHosts: e.allowedHosts, createdAt: e.createdAt, updatedAt: e.updatedAt });

/** OpenComputer's secret stores (its SDK's `SecretStore`): named groups of secrets a sandbox
 * created with `secretStore` sees only as `osb_sealed_` placeholders. */
export const ocSecretStoreRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['opencomputer'];
    const errors = ocErrorResponses;
    const SEALED = 'Values are sealed at rest and never shown back; a sandbox created with the store sees each secret as an `osb_sealed_` placeholder, which the egress proxy replaces with the value in requests to its `allowedHosts` (else the store\'s allowlisted host names) only.';

    app.post('/secret-stores', {
      schema: { operationId: 'ocCreateSecretStore', tags, summary: 'Create a secret store', description: `A named group of secrets, and the egress allowlist its sandboxes get (empty: anywhere public). ${SEALED}`, body: CreateStoreBody, response: { 201: ok('The store', SecretStoreInfo), ...errors } },
    }, async (req, reply) => reply.code(201).send(storeView(req.owner, await fp.secretStores.create(req.owner, req.body))));

    app.get('/secret-stores', {
      schema: { operationId: 'ocListSecretStores', tags, summary: 'List secret stores', description: 'The owner\'s stores, by name.', response: { 200: ok('The stores', z.array(SecretStoreInfo)), ...errors } },
    }, async (req) => (await fp.secretStores.list(req.owner)).map((s) => storeView(req.owner, s)));

    app.get('/secret-stores/:id', {
      schema: { operationId: 'ocGetSecretStore', tags, summary: 'Get a secret store', description: 'Its name and egress allowlist.', params: StoreParams, response: { 200: ok('The store', SecretStoreInfo), ...errors } },
    }, async (req) => storeView(req.owner, await fp.secretStores.get(req.owner, req.params.id)));

    app.put('/secret-stores/:id', {
      schema: { operationId: 'ocUpdateSecretStore', tags, summary: 'Rename a secret store or change its allowlist', description: 'Sandboxes made with it before keep what they were made with.', params: StoreParams, body: UpdateStoreBody, response: { 200: ok('The store', SecretStoreInfo), ...errors } },
    }, async (req) => storeView(req.owner, await fp.secretStores.update(req.owner, req.params.id, req.body)));

    app.delete('/secret-stores/:id', {
      schema: { operationId: 'ocDeleteSecretStore', tags, summary: 'Delete a secret store', description: 'With its secrets: sandboxes made with it keep their placeholders, which from now on go out as they are.', params: StoreParams, response: { 204: noContent('Gone'), ...errors } },
    }, async (req, reply) => {
      await fp.secretStores.delete(req.owner, req.params.id);
      await fp.instances.refreshSecret(req.owner, undefined, req.params.id);
      return reply.code(204).send(null);
    });

    app.put('/secret-stores/:id/secrets/:name', {
      schema: { operationId: 'ocSetSecret', tags, summary: 'Set a secret of a store', description: `Creates or replaces it; its name is the variable sandboxes see it in. Running sandboxes made with the store get the new value in their requests from now on. ${SEALED}`, params: EntryParams, body: SetSecretBody, response: { 200: ok('Set', SecretSet), ...errors } },
    }, async (req) => {
      await fp.secretStores.setSecret(req.owner, req.params.id, req.params.name, req.body.value, req.body.allowedHosts);
      const refreshed = await fp.instances.refreshSecret(req.owner, req.params.name, req.params.id);
      return { name: req.params.name, status: 'set' as const, refreshed };
    });

    app.get('/secret-stores/:id/secrets', {
      schema: { operationId: 'ocListSecrets', tags, summary: 'List the secrets of a store', description: 'Names and hosts, never values.', params: StoreParams, response: { 200: ok('The secrets', z.array(SecretEntryInfo)), ...errors } },
    }, async (req) => (await fp.secretStores.listSecrets(req.owner, req.params.id)).map(entryView));

    app.delete('/secret-stores/:id/secrets/:name', {
      schema: { operationId: 'ocDeleteSecret', tags, summary: 'Delete a secret of a store', description: 'Sandboxes made with the store keep its placeholder, which from now on goes out as it is.', params: EntryParams, response: { 204: noContent('Gone'), ...errors } },
    }, async (req, reply) => {
      await fp.secretStores.deleteSecret(req.owner, req.params.id, req.params.name);
      await fp.instances.refreshSecret(req.owner, req.params.name, req.params.id);
      return reply.code(204).send(null);
    });
  };
