import { createContextValues } from '@connectrpc/connect';
import { fastifyConnectPlugin } from '@connectrpc/connect-fastify';
import type { FastifyPluginAsync } from 'fastify';
import type { Forkpoint } from '../../core/forkpoint.js';
import { declareFace } from '../errors.js';
import { callerKey, callerOfRequest, dropConnectionKey, ENVD_PORT } from './caller.js';
import { e2bControlRoutes } from './control.js';
import { envdFileRoutes } from './files.js';
import { filesystemService } from './filesystem.js';
import { Filesystem } from './gen/filesystem/filesystem_pb.js';
import { Process } from './gen/process/process_pb.js';
import { processService } from './process.js';
import { e2bVolumeRoutes } from './volumes.js';

/**
 * The E2B-compatible face: its control plane, and the in-sandbox API (envd: Connect RPC for
 * processes and files, plain HTTP for file bytes) that the SDK reaches with `E2b-Sandbox-Id`
 * and the sandbox's access token. Its contract is E2B's own spec, not forkpoint's document:
 * the routes are left out of it.
 */
export const e2bFace = (fp: Forkpoint): FastifyPluginAsync =>
  async (app) => {
    declareFace(app, 'e2b');
    app.addHook('onRoute', (route) => {
      route.schema = { ...route.schema, hide: true };
      // E2B names a sandbox `sandboxID` in its paths: the routing key is declared, not guessed.
      route.config = { ...(route.config as object), instanceParam: 'sandboxID' };
    });
    await app.register(e2bControlRoutes(fp));
    await app.register(envdFileRoutes(fp));
    await app.register(e2bVolumeRoutes(fp));
    await app.register(async (rpc) => {
      // The plugin brings its own parsers (it reads Connect's bodies itself), JSON's included.
      rpc.removeContentTypeParser('application/json');
      rpc.addHook('onRoute', (route) => {
        route.config = { ...(route.config as object), scope: 'sandbox', face: 'connect' };
      });
      await rpc.register(fastifyConnectPlugin, {
        routes: (router) => {
          router.service(Process, processService(fp));
          router.service(Filesystem, filesystemService(fp));
        },
        contextValues: (req) => createContextValues().set(callerKey, callerOfRequest(req)).set(dropConnectionKey, () => req.raw.socket.destroy()),
        shutdownTimeoutMs: 1000,
      });
    });
  };

/** A call E2B's SDKs make to another port inside a sandbox (`E2b-Sandbox-Port`, the code
 * interpreter's 49999): it goes to that port's proxy, with the sandbox's access token. */
export function e2bPortRoute(headers: Record<string, string | string[] | undefined>): { id: string; port: number } | undefined {
  const id = headers['e2b-sandbox-id'];
  const port = Number(headers['e2b-sandbox-port']);
  if (typeof id !== 'string' || !/^[A-Za-z0-9_-]{1,64}$/.test(id) || !Number.isInteger(port) || port < 1 || port > 65535 || port === ENVD_PORT) return undefined;
  return { id, port };
}
