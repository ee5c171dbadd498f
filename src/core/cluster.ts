import { randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import type { Logger } from 'pino';
import { NODE_ID } from '../config.js';
import type { Store } from '../store/index.js';
import type { InstanceRecord } from '../store/instances.js';
import type { NodeRecord } from '../store/nodes.js';
import { isStoreAway } from './errors.js';
import { isStandby } from './warm-standbys.js';

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

/** What a node does with its sandboxes as its lease goes and comes back. */
export interface LeaseHolder {
  /** The lease may be ending (no renewal for half the dead-after time): stop every sandbox
   * where it stands, before another node may judge this one dead and take them over. */
  fence(): Promise<void>;
  /** The lease holds again. `ended`: another node ended it meanwhile (this node has a new one),
   * so some instances may be another node's now: let go of those, thaw the rest. */
  settle(ended: boolean): Promise<void>;
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
  private watchdog: NodeJS.Timeout | undefined;
  private beating: Promise<void> | undefined;
  /** The epoch of this node's lease (its fencing token), once joined. */
  private epoch = 0;
  /** When the last heartbeat that renewed the lease was sent. */
  private renewedAt = 0;
  /** Frozen: the lease could not be renewed in time. */
  private fencedNow = false;
  private fencing: Promise<void> | undefined;
  private holder: LeaseHolder = { fence: async () => {}, settle: async () => {} };
  /** Other nodes live at the last look: with none, no one could end this node's lease. */
  private livePeers = 0;
  /** Nodes this one has judged lost (and told `nodeLost` listeners of), until they answer again. */
  private readonly judgedLost = new Set<string>();
  private readonly lostListeners: ((node: NodeRecord) => void)[] = [];
  private joined = false;
  private reclaim: (recs: InstanceRecord[]) => Promise<void> = async () => {};
  private takeOver: (recs: InstanceRecord[]) => Promise<void> = async () => {};
  /** This node is being drained: it takes no new instances and none handed over. */
  private drainingNow = false;
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
    /** Whether the instance's sandbox runs on this node (what it knows without the store). */
    private readonly liveHere: (instanceId: string) => boolean = () => false,
  ) {}

  /** Registers the node at `url` (where the others reach it) and starts its heartbeat. */
  async join(url: string): Promise<void> {
    const now = Date.now();
    this.epoch = await this.store.nodes.register(this.nodeId, url, new Date(now).toISOString());
    this.store.fence.set(this.nodeId, this.epoch);
    this.livePeers = (await this.store.nodes.all()).filter((n) => n.id !== this.nodeId && this.isLive(n, now)).length;
    this.renewedAt = now;
    this.joined = true;
    this.reachedSince = now;
    this.timer = setInterval(() => {
      this.beating ??= this.beat()
        .catch((err: unknown) => this.log.warn({ err }, 'heartbeat failed'))
        .finally(() => (this.beating = undefined));
    }, this.timing.heartbeatMs);
    this.timer.unref();
    // The embedded store is one machine's file: no other node can take over, so a node that is
    // merely slow to write it has nothing to fence against.
    if (this.store.dialect === 'sqlite') return;
    this.watchdog = setInterval(() => {
      // Alone on the store (at the last look), no other node could take anything over: a node
      // and its database parted for a while (a failover) keep their sandboxes running.
      if (this.livePeers === 0) return;
      if (!this.fencedNow && Date.now() - this.renewedAt > this.fenceAfterMs) void this.fence();
    }, Math.min(Math.max(this.timing.heartbeatMs / 2, 50), 1000));
    this.watchdog.unref();
  }

  /** Half the dead-after time: the other nodes wait all of it before they end this node's
   * lease, so everything here is frozen well before any of them may take it over. */
  private get fenceAfterMs(): number {
    return this.timing.deadAfterMs / 2;
  }

  /** The embedded store is one machine's file: this node is the only one there can be, and
   * every instance and checkpoint is its own (no placement to look up). */
  get soleNode(): boolean {
    return this.store.dialect === 'sqlite';
  }

  /** Whether this node has frozen its sandboxes, its lease in doubt. */
  get fenced(): boolean {
    return this.fencedNow;
  }

  /** Told when the lease is in doubt and when it holds again. */
  holdLeaseWith(holder: LeaseHolder): void {
    this.holder = holder;
  }

  private fence(): Promise<void> {
    if (this.fencedNow) return this.fencing ?? Promise.resolve();
    this.fencedNow = true;
    this.log.error({ silentForMs: Date.now() - this.renewedAt }, 'this node could not renew its lease: its sandboxes are frozen until it can');
    this.fencing = this.holder.fence().catch((err: unknown) => this.log.error({ err }, 'freezing the sandboxes failed'));
    return this.fencing;
  }

  async leave(): Promise<void> {
    clearInterval(this.timer);
    clearInterval(this.watchdog);
    this.timer = undefined;
    this.watchdog = undefined;
    await this.beating;
  }

  /** Told of instances a draining node handed over, for this node to take (it races the other
   * nodes for each; the store lets one win). */
  whenHandedOver(takeOver: (recs: InstanceRecord[]) => Promise<void>): void {
    this.takeOver = takeOver;
  }

  /** Marks this node draining: the others send it nothing new and take what it hands over. */
  async drain(): Promise<void> {
    this.drainingNow = true;
    await this.store.nodes.setDraining(this.nodeId, true);
  }

  /** Told of this node's instances the others marked lost while it lived on (its heartbeat
   * could not reach the store): they are still its own. */
  whenOwnLost(reclaim: (recs: InstanceRecord[]) => Promise<void>): void {
    this.reclaim = reclaim;
  }

  private async beat(): Promise<void> {
    const now = Date.now();
    let renewed: boolean;
    try {
      renewed = await this.store.nodes.heartbeat(this.nodeId, new Date(now).toISOString(), this.epoch);
    } catch (err) {
      this.reachedSince = undefined;
      throw err;
    }
    this.reachedSince ??= now;
    if (!renewed) {
      // Another node ended this node's lease (it was silent too long): whatever it took over
      // is its own now. Frozen first, then a new lease, then let go of what is not ours.
      await this.fence();
      this.epoch = await this.store.nodes.renewLease(this.nodeId, new Date(now).toISOString());
      this.store.fence.set(this.nodeId, this.epoch);
      this.log.warn({ epoch: this.epoch }, 'this node\'s lease was ended by another node; it holds a new one and lets go of what was taken over');
      await this.holder.settle(true);
    } else if (this.fencedNow) {
      // Renewed before anyone could end it: nothing was taken, everything thaws.
      await this.fencing;
      await this.holder.settle(false);
    }
    this.renewedAt = now;
    this.fencedNow = false;
    this.fencing = undefined;
    const peers = await this.store.nodes.all();
    this.livePeers = peers.filter((n) => n.id !== this.nodeId && this.isLive(n, now)).length;
    const mine = (await this.store.instances.lostOf(this.nodeId)).filter(() => !this.drainingNow);
    if (mine.length) await this.reclaim(mine);
    if (!this.drainingNow) {
      const handed = await this.store.instances.handedOver();
      if (handed.length) await this.takeOver(handed);
    }
    if (now - this.reachedSince < this.timing.deadAfterMs) return;
    const cutoff = new Date(now - this.timing.deadAfterMs).toISOString();
    for (const n of peers) if (n.id !== this.nodeId) this.judge(n, now);
    const silent = peers.filter((n) => n.id !== this.nodeId && !this.isLive(n, now)).map((n) => n.id);
    if (silent.length === 0) return;
    // A lease ends only if its heartbeat is still that old when it is ended (one that landed
    // meanwhile keeps it), and its instances are lost in the same transaction.
    const lost = await this.store.transaction(async (tx) => {
      const ids = await tx.instances.markLost(await tx.nodes.endLeases(silent, cutoff));
      // Their warm standbys are nobody's and no node will take them: their records (an
      // address, a uid range each) go now; the node, if it comes back, removes their sandboxes
      // as it does whatever the store does not know.
      const kept: string[] = [];
      for (const id of ids) {
        const rec = await tx.instances.get(id);
        if (!rec || !isStandby(rec)) {
          kept.push(id);
          continue;
        }
        await tx.layers.dropHolder(`instance:${id}`);
        await tx.executions.removeAllOf(id);
        await tx.instances.delete(id);
      }
      return kept;
    });
    if (lost.length) this.log.warn({ nodes: silent, instances: lost }, 'nodes stopped answering: their leases ended, their instances are lost');
  }

  /** Calls `listener` with each node this one judges lost (silent for the dead-after time). */
  whenNodeLost(listener: (node: NodeRecord) => void): void {
    this.lostListeners.push(listener);
  }

  private judge(n: NodeRecord, now = Date.now()): void {
    if (this.isLive(n, now)) {
      this.judgedLost.delete(n.id);
      return;
    }
    if (this.judgedLost.has(n.id)) return;
    this.judgedLost.add(n.id);
    for (const l of this.lostListeners) l(n);
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
    let rec: InstanceRecord | undefined;
    try {
      rec = await this.store.instances.get(instanceId);
    } catch (err) {
      // The database away: an instance whose sandbox runs here is answered here meanwhile.
      if (isStoreAway(err) && this.liveHere(instanceId)) return { kind: 'here' };
      throw err;
    }
    if (!rec) return { kind: 'unknown' };
    if (rec.node === null || rec.node === this.nodeId) return { kind: 'here' };
    if (rec.status === 'lost') return { kind: 'lost', node: rec.node };
    const node = await this.store.nodes.get(rec.node);
    if (node) this.judge(node);
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

  /** The node a new instance that mounts an owner's volume goes to: the volume's (instances
   * mount volumes only where they are). Here when the volume is unknown (the create says so) or
   * its node is not live (the create refuses it with the reason). */
  async placeForVolume(owner: string, volume: { name: string } | { id: string }): Promise<{ kind: 'here' } | { kind: 'node'; node: NodeRecord }> {
    if (!this.joined) return { kind: 'here' };
    const v = 'id' in volume ? await this.store.volumes.get(volume.id) : await this.store.volumes.byName(owner, volume.name);
    if (!v || v.owner !== owner || v.node === this.nodeId) return { kind: 'here' };
    const node = await this.store.nodes.get(v.node);
    return node && this.isLive(node) ? { kind: 'node', node } : { kind: 'here' };
  }

  /** The node a new instance goes to: the live one running fewest, this one on a tie. */
  async placeNew(): Promise<{ kind: 'here' } | { kind: 'node'; node: NodeRecord }> {
    if (!this.joined) return { kind: 'here' };
    const nodes = (await this.nodes()).filter((n) => n.live && !n.draining);
    const self = nodes.find((n) => n.self);
    const best = nodes.reduce<NodeView | undefined>((a, n) => (!a || n.load < a.load ? n : a), self);
    return !best || best.self || (self && best.load >= self.load) ? { kind: 'here' } : { kind: 'node', node: best };
  }
}
