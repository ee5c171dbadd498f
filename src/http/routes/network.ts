import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import type { PortForwardRecord } from '../../store/port-forwards.js';
import {
  CreatePortForwardRequest, errorResponses, IdParams, noContent, ok, optionalBody, OPTIONAL_BODY, PortForwardAnswer, PortForwardList, PortForwardParams,
  PortParams, PreviewLink, PreviewRequest,
} from '../schemas/index.js';
import { UnauthenticatedError } from '../../core/errors.js';
import { PREVIEW_PARAM, previewPath } from './proxy.js';
import { clientOrigin } from '../client-origin.js';

const forwardView = (f: PortForwardRecord) => ({
  id: f.id,
  instance_id: f.instanceId,
  guest_port: f.guestPort,
  host_port: f.hostPort,
  protocol: f.protocol,
  label: f.label,
  created_at: f.createdAt,
});

export const networkRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['network'];
    app.post('/instances/:id/port-forwards', {
      schema: {
        operationId: 'createPortForward',
        tags,
        summary: 'Forward a host port to a port of the instance',
        description:
          'A TCP listener on the server\'s address (`host_port`, or any free one, in the server\'s host-port range, 30000-32767 unless configured: 400 with reason HOST_PORT_OUT_OF_RANGE outside it) that leads to `guest_port` inside the instance. It follows the instance through rollbacks and hibernation (a connection wakes a hibernated instance); forks do not inherit it. 409 if the host port is taken.',
        params: IdParams,
        body: CreatePortForwardRequest,
        response: { 201: ok('The forward', PortForwardAnswer), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body;
      const f = await fp.ports.create(req.owner, req.params.id, { guestPort: b.guest_port, hostPort: b.host_port, label: b.label });
      return reply.code(201).send({ port_forward: forwardView(f) });
    });

    app.get('/instances/:id/port-forwards', {
      schema: { operationId: 'listPortForwards', tags, summary: 'List port forwards', description: 'The instance\'s forwards, oldest first.', params: IdParams, response: { 200: ok('The forwards', PortForwardList), ...errorResponses } },
    }, async (req) => ({ port_forwards: (await fp.ports.list(req.owner, req.params.id)).map(forwardView) }));

    app.delete('/instances/:id/port-forwards/:forward_id', {
      schema: { operationId: 'deletePortForward', tags, summary: 'Remove a port forward', description: 'Its listener closes; connections through it end.', params: PortForwardParams, response: { 204: noContent('Removed'), ...errorResponses } },
    }, async (req, reply) => {
      await fp.ports.delete(req.owner, req.params.id, req.params.forward_id);
      return reply.code(204).send(null);
    });

    app.post('/instances/:id/ports/:port/preview', {
      schema: {
        operationId: 'createPreviewLink',
        tags,
        summary: 'A link that opens a port of the instance in a browser',
        description:
          'A link to `<port>-<instance id>.<previewDomain>` (and OpenComputer\'s `sb-<instance id>-p<port>.<previewDomain>`): every request there is proxied (HTTP and WebSocket) to that port inside the instance, for anyone with this signed link until it expires (the link sets a cookie of that host name only, so the page\'s own requests work too). Each preview is an origin of its own: no page of one can read another, or the API. The preview domain is the name the client reached the API by unless configured (a load balancer\'s: `<port>-<id>.lb.example`; `localhost` when it used an address: browsers resolve `*.localhost` to the machine they run on); with `none`, 409 with reason PREVIEW_DOMAIN_REQUIRED. ' +
          'Under the API\'s own address, `/instances/{id}/ports/{port}/` is proxied the same for the API token (or the instance\'s access token), never for a preview link.',
        params: PortParams,
        body: optionalBody(PreviewRequest),
        ...OPTIONAL_BODY,
        response: { 200: ok('The link', PreviewLink), ...errorResponses },
      },
    }, async (req) => {
      const { id, port } = req.params;
      await fp.instances.get(req.owner, id);
      if (req.credential?.kind !== 'owner') throw new UnauthenticatedError();
      const url = previewPath(fp, clientOrigin(req), id, port);
      const { token, expiresAt } = fp.credentials.previewLinkFor(req.credential, id, port, req.body?.ttl_s ?? 3600);
      return { url: `${url}?${PREVIEW_PARAM}=${token}`, expires_at: expiresAt.toISOString() };
    });
  };
