import { readFileSync } from 'node:fs';
import type { Logger } from 'pino';
import type { Config } from './config.js';
import { Forkpoint } from './core/forkpoint.js';
import { Engine, type EngineOptions } from './engine/engine.js';

/** The composition root of a node: the core over this host's engine. The one place that knows
 * both (the core knows the engine only through src/seam). */
export function openLocalForkpoint(config: Config, log: Logger, version: string, overrides: Pick<EngineOptions, 'unconfinedForBenchmarks'> = {}): Promise<Forkpoint> {
  return Forkpoint.open(config, log, version, (nodeId) => localEngine(config, log, nodeId, overrides));
}

export function localEngine(config: Config, log: Logger, nodeId: string, overrides: Pick<EngineOptions, 'unconfinedForBenchmarks'> = {}): Engine {
  return new Engine({
    dataDir: config.dataDir,
    criuPath: config.criuPath,
    criuCacheDir: config.criuCacheDir,
    dumpStagingDir: config.dumpStagingDir || undefined,
    lazyRestoreMb: config.lazyRestoreMb,
    incrementalCheckpointMb: config.incrementalCheckpointMb,
    agentPath: config.agentPath,
    imageSeedDir: config.imageSeedDir,
    logger: log,
    network: { cidr: config.networkCidr, dnsServers: config.dnsServers?.split(','), upstreamCa: config.egressCaFile ? readFileSync(config.egressCaFile, 'utf8') : undefined },
    uidRanges: config.uidRanges,
    favourCgroupMoves: config.cgroupFavordynmods === 'on',
    nodeId,
    ...overrides,
  });
}
