import type { FastifyPluginAsync } from 'fastify';
import type { Forkpoint } from '../../core/forkpoint.js';
import { checkpointRoutes } from './checkpoints.js';
import { eventRoutes } from './events.js';
import { execRoutes } from './exec.js';
import { executionRoutes } from './executions.js';
import { fileRoutes } from './files.js';
import { imageRoutes } from './images.js';
import { instanceRoutes } from './instances.js';
import { networkRoutes } from './network.js';
import { proxyRoutes } from './proxy.js';
import { registryRoutes } from './registries.js';
import { terminalRoutes } from './terminals.js';
import { volumeRoutes } from './volumes.js';
import { secretRoutes } from './secrets.js';

/** The Firecase-style face: instances, commands, checkpoints, files. Registered at the root and
 * again under /v1 (Firecase's own prefix), where it is left out of the document. */
export const firecaseFace = (fp: Forkpoint, opts: { documented: boolean }): FastifyPluginAsync =>
  async (app) => {
    if (!opts.documented) {
      app.addHook('onRoute', (route) => {
        route.schema = { ...route.schema, hide: true };
      });
    }
    await app.register(instanceRoutes(fp));
    await app.register(execRoutes(fp));
    await app.register(executionRoutes(fp));
    await app.register(terminalRoutes(fp));
    await app.register(eventRoutes(fp));
    await app.register(networkRoutes(fp));
    await app.register(proxyRoutes(fp));
    await app.register(checkpointRoutes(fp));
    await app.register(fileRoutes(fp));
    await app.register(imageRoutes(fp));
    await app.register(registryRoutes(fp));
    await app.register(volumeRoutes(fp));
    await app.register(secretRoutes(fp));
  };
