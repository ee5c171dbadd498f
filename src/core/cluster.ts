import { randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import type { Logger } from 'pino';
import { NODE_ID } from '../config.js';
import type { Store } from '../store/index.js';
import type { InstanceRecord } from '../store/instances.js';
import type { NodeRecord } from '../store/nodes.js';

/** Where an instance is, as seen from this node. */
export type Placement =
  | { kind: 'here' }
  | { kind: 'node'; node: NodeRecord }
  /** Its node stopped answering: `recover` brings it back elsewhere. */
  | { kind: 'lost'; node: string | null }
  /** Its node did not answer a forward a moment ago (not yet judged dead): reads are answered
   * from the store, the rest refused until it answers or is lost. */
  | { kind: 'unreachable'; node: NodeRecord }
  | { kind: 'unknown' };

export interface NodeView extends NodeRecord {
  live: boolean;
  /** Instances running on it. */
  load: number;
  self: boolean;
}

/** This node's name: the configured one, or one made at the first start and kept. */
export async function nodeIdOf(configured: string | undefined, file: string): Promise<string> {
  if (configured) return configured;
  const kept = (await readFile(file, 'utf8').catch(() => '')).trim();
  if (NODE_ID.test(kept)) return kept;
  const made = `node-${randomBytes(6).toString('hex')}`;
  await writeFile(file, made + '\n', { mode: 0o600 });
  return made;
}

/**
 * The nodes sharing the store: this one registers and says now and then that it lives; each
 * node, at each beat, marks the instances of nodes silent for too long as `lost`. With one
 * node (the embedded store) all of this is local and cheap.
 */
export class Cluster {
  private timer: NodeJS.Timeout | undefined;
  private beating: Promise<void> | undefined;
  private joined = false;
  private reclaim: (recs: InstanceRecord[]) => Promise<void> = async () => {};
  /** Since when every heartbeat of this node has reached the store. Another node's silence
   * counts only after that long: when the store was away, every node was silent alike. */
  private reachedSince: number | undefined;
  /** Nodes a forward could not reach, until when they count as unreachable here. */
  private readonly unreachable = new Map<string, number>();

  constructor(
    private readonly store: Store,
    readonly nodeId: string,
    private readonly timing: { heartbeatMs: number; deadAfterMs: number },
    private readonly log: Logger,
  ) {}

  /** Registers the node at `url` (where the others reach it) and starts its heartbeat. */
  async join(url: string): Promise<void> {
    await this.store.nodes.register(this.nodeId, url, new Date().toISOString());
    this.joined = true;
    this.reachedSince = Date.now();
    this.timer = setInterval(() => {
      this.beating ??= this.beat()
        .catch((err: unknown) => this.log.warn({ err }, 'heartbeat failed'))
        .finally(() => (this.beating = undefined));
    }, this.timing.heartbeatMs);
    this.timer.unref();
  }

  async leave(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.beating;
  }

  /** Told of this node's instances the others marked lost while it lived on (its heartbeat
   * could not reach the store): they are still its own. */
  whenOwnLost(reclaim: (recs: InstanceRecord[]) => Promise<void>): void {
    this.reclaim = reclaim;
  }

  private async beat(): Promise<void> {
    const now = Date.now();
    try {
      await this.store.nodes.heartbeat(this.nodeId, new Date(now).toISOString());
    } catch (err) {
      this.reachedSince = undefined;
      throw err;
    }
    this.reachedSince ??= now;
    const mine = await this.store.instances.lostOf(this.nodeId);
    if (mine.length) await this.reclaim(mine);
    if (now - this.reachedSince < this.timing.deadAfterMs) return;
    const silent = (await this.store.nodes.all()).filter((n) => n.id !== this.nodeId && !this.isLive(n, now)).map((n) => n.id);
    const lost = await this.store.instances.markLost(silent);
    if (lost.length) this.log.warn({ nodes: silent, instances: lost }, 'nodes stopped answering: their instances are lost');
  }

  private isLive(n: NodeRecord, now = Date.now()): boolean {
    return n.id === this.nodeId || now - Date.parse(n.heartbeatAt) <= this.timing.deadAfterMs;
  }

  async nodes(): Promise<NodeView[]> {
    const load = await this.store.nodes.load();
    return (await this.store.nodes.all()).map((n) => ({ ...n, live: this.isLive(n), load: load.get(n.id) ?? 0, self: n.id === this.nodeId }));
  }

  /** Where the instance is; `here` also for one of no node (from before nodes). */
  async locate(instanceId: string): Promise<Placement> {
    const rec = await this.store.instances.get(instanceId);
    if (!rec) return { kind: 'unknown' };
    if (rec.node === null || rec.node === this.nodeId) return { kind: 'here' };
    if (rec.status === 'lost') return { kind: 'lost', node: rec.node };
    const node = await this.store.nodes.get(rec.node);
    if (!node || !this.isLive(node)) return { kind: 'lost', node: rec.node };
    if ((this.unreachable.get(node.id) ?? 0) > Date.now()) return { kind: 'unreachable', node };
    return { kind: 'node', node };
  }

  /** A forward to the node could not connect: for a heartbeat's time, reads of its instances
   * are answered from the store instead of waiting on it (its heartbeat decides the rest). */
  unreachableNow(nodeId: string): void {
    this.unreachable.set(nodeId, Date.now() + this.timing.heartbeatMs);
    this.log.warn({ node: nodeId }, 'a node did not answer a forward; reads of its instances come from the store meanwhile');
  }

  /** The instance a checkpoint is of (whose node has its data), if it exists. */
  async instanceOfCheckpoint(checkpointId: string): Promise<string | undefined> {
    return (await this.store.checkpoints.get(checkpointId))?.instanceId;
  }

  /** The node a new instance goes to: the live one running fewest, this one on a tie. */
  async placeNew(): Promise<{ kind: 'here' } | { kind: 'node'; node: NodeRecord }> {
    if (!this.joined) return { kind: 'here' };
    const nodes = (await this.nodes()).filter((n) => n.live);
    const self = nodes.find((n) => n.self);
    const best = nodes.reduce<NodeView | undefined>((a, n) => (!a || n.load < a.load ? n : a), self);
    return !best || best.self || (self && best.load >= self.load) ? { kind: 'here' } : { kind: 'node', node: best };
  }
}
