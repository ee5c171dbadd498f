import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { EngineError } from '../../seam/errors.js';
import { run } from '../run.js';

import type { SandboxNetwork } from '../../seam/runtime.js';

export type { SandboxNetwork } from '../../seam/runtime.js';

/** What `fp-agent net-setup` (or a restorer's 'N' request) makes: see native/netlink.c. */
export interface LinkRequest {
  hostIf: string;
  address: string;
  gateway: string;
  mac: string;
}

/** A fresh host-side name: each boot or restore gets its own link (the one it replaces may
 * still exist while its netns is torn down). */
export function newHostIf(prefix: string): string {
  return `${prefix}${randomBytes(5).toString('hex')}`;
}

/** Makes the link of a sandbox just booted: `pid` is its PID 1 on the host. */
export async function setUpLink(agentPath: string, pid: number, req: LinkRequest): Promise<void> {
  const r = await run(agentPath, ['net-setup', String(pid), req.hostIf, req.address, req.gateway, req.mac]);
  if (r.code !== 0) throw new EngineError('NETWORK_FAILED', `the sandbox's link: ${r.stderr.trim()}`);
}

/** Bytes through the host's end of a link: what it received the sandbox sent. */
export function linkCounters(hostIf: string): { sent: number; received: number } | undefined {
  // Two small sysfs reads: cheap enough for a synchronous view.
  const read = (f: string) => {
    try {
      return Number(readFileSync(`/sys/class/net/${hostIf}/statistics/${f}`, 'utf8'));
    } catch {
      return NaN;
    }
  };
  const rx = read('rx_bytes');
  const tx = read('tx_bytes');
  if (!Number.isFinite(rx) || !Number.isFinite(tx)) return undefined;
  return { sent: rx, received: tx };
}
