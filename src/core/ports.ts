import { createServer, connect, type Server, type Socket } from 'node:net';
import type { Logger } from 'pino';
import type { Store } from '../store/index.js';
import { newId } from '../store/ids.js';
import type { PortForwardRecord } from '../store/port-forwards.js';
import type { SandboxAccess } from './access.js';
import { ConflictError, InvalidRequestError, NotFoundError, UnavailableError } from './errors.js';
import type { InstanceService } from './instances.js';

const CONNECT_TIMEOUT_MS = 10_000;
const MAX_FORWARDS_PER_INSTANCE = 32;
/** How many free-looking ports of the range are tried before the range counts as full. */
const PICK_ATTEMPTS = 64;

/** The host ports forwards may use (FORKPOINT_HOST_PORT_RANGE). */
export interface HostPortRange {
  first: number;
  last: number;
}

export function parseHostPortRange(range: string): HostPortRange {
  const [first, last] = range.split('-').map(Number) as [number, number];
  return { first, last };
}

/**
 * Host ports that lead to a port of an instance (Firecase's port forwards), and the way the HTTP
 * proxy reaches an instance's port. A forward belongs to its instance, not to a moment of it: it
 * follows the instance through rollbacks and hibernation (the instance keeps its address; a
 * connection to a hibernated one wakes it), and forks do not inherit it.
 */
export class PortService {
  private readonly listeners = new Map<string, Server>();

  constructor(
    private readonly store: Store,
    private readonly instances: InstanceService,
    private readonly access: SandboxAccess,
    private readonly bindHost: string,
    private readonly range: HostPortRange,
    private readonly log: Logger,
  ) {}

  /** The address and port to reach an instance's port at, waking it if it hibernates. */
  async target(owner: string, id: string, port: number): Promise<{ host: string; port: number }> {
    const { rec } = await this.access.sandbox(owner, id);
    if (!rec.address) throw new ConflictError(`instance ${id} has no network`);
    return { host: rec.address, port };
  }

  async list(owner: string, id: string): Promise<PortForwardRecord[]> {
    await this.instances.get(owner, id);
    return this.store.portForwards.forInstance(id);
  }

  async create(owner: string, id: string, input: { guestPort: number; hostPort?: number | undefined; label?: string | undefined }): Promise<PortForwardRecord> {
    await this.instances.get(owner, id);
    if ((await this.store.portForwards.forInstance(id)).length >= MAX_FORWARDS_PER_INSTANCE) {
      throw new ConflictError(`an instance has at most ${MAX_FORWARDS_PER_INSTANCE} port forwards`);
    }
    const id_ = newId('pf');
    const server = input.hostPort === undefined ? await this.listenInRange(id_) : await this.listenOn(id_, input.hostPort);
    const rec: PortForwardRecord = {
      id: id_,
      instanceId: id,
      owner,
      guestPort: input.guestPort,
      hostPort: (server.address() as { port: number }).port,
      protocol: 'tcp',
      label: input.label ?? null,
      createdAt: new Date().toISOString(),
    };
    try {
      await this.store.portForwards.insert(rec);
    } catch (err) {
      this.close(id_);
      throw err;
    }
    return rec;
  }

  async delete(owner: string, id: string, forwardId: string): Promise<void> {
    await this.instances.get(owner, id);
    const rec = await this.store.portForwards.get(forwardId);
    if (!rec || rec.instanceId !== id) throw new NotFoundError('port forward', forwardId);
    this.close(forwardId);
    await this.store.portForwards.remove(forwardId);
  }

  /** Listens again on every forward's host port (at start); one whose port is taken now is
   * logged and left closed. */
  async restore(): Promise<void> {
    for (const f of await this.store.portForwards.all()) {
      const inst = await this.store.instances.get(f.instanceId);
      if (inst && !this.instances.isLocal(inst)) continue;
      await this.listen(f.id, f.hostPort).catch((err: unknown) => this.log.warn({ err, forward: f.id, port: f.hostPort }, 'port forward could not listen again'));
    }
  }

  /** Closes the listeners of an instance's forwards (it is gone). */
  async forget(instanceId: string): Promise<void> {
    for (const f of await this.store.portForwards.forInstance(instanceId)) this.close(f.id);
    await this.store.portForwards.removeAllOf(instanceId);
  }

  closeAll(): void {
    for (const id of [...this.listeners.keys()]) this.close(id);
  }

  private close(forwardId: string): void {
    this.listeners.get(forwardId)?.close();
    this.listeners.delete(forwardId);
  }

  /** Listens on the port asked for, which must be in the range. */
  private async listenOn(forwardId: string, port: number): Promise<Server> {
    const { first, last } = this.range;
    if (port < first || port > last) {
      throw new InvalidRequestError(`host_port must be within the server's range ${first}-${last} (FORKPOINT_HOST_PORT_RANGE)`, { reason: 'HOST_PORT_OUT_OF_RANGE', host_port: port, range: `${first}-${last}` });
    }
    return this.listen(forwardId, port).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'EADDRINUSE' || err.code === 'EACCES') throw new ConflictError(`host port ${port} is not available`, { host_port: port }, { cause: err });
      throw err;
    });
  }

  /** Listens on a free port of the range: ones no forward holds, tried from a random place. */
  private async listenInRange(forwardId: string): Promise<Server> {
    const { first, last } = this.range;
    const size = last - first + 1;
    const held = new Set((await this.store.portForwards.all()).map((f) => f.hostPort));
    const start = Math.floor(Math.random() * size);
    let tried = 0;
    for (let i = 0; i < size && tried < PICK_ATTEMPTS; i++) {
      const port = first + ((start + i) % size);
      if (held.has(port)) continue;
      tried++;
      try {
        return await this.listen(forwardId, port);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code !== 'EADDRINUSE' && code !== 'EACCES') throw err;
      }
    }
    throw new UnavailableError(`no free host port in the server's range ${first}-${last} (FORKPOINT_HOST_PORT_RANGE)`, { reason: 'HOST_PORTS_EXHAUSTED', range: `${first}-${last}` });
  }

  private listen(forwardId: string, port: number): Promise<Server> {
    const server = createServer((client) => void this.relay(forwardId, client));
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, this.bindHost, () => {
        server.off('error', reject);
        this.listeners.set(forwardId, server);
        resolve(server);
      });
    });
  }

  private async relay(forwardId: string, client: Socket): Promise<void> {
    client.on('error', () => client.destroy());
    const f = await this.store.portForwards.get(forwardId).catch(() => undefined);
    if (!f) return void client.destroy();
    let to: { host: string; port: number };
    try {
      to = await this.target(f.owner, f.instanceId, f.guestPort);
    } catch (err) {
      this.log.debug({ err, forward: forwardId }, 'port forward: instance not reachable');
      return void client.destroy();
    }
    const upstream = connect({ host: to.host, port: to.port, timeout: CONNECT_TIMEOUT_MS });
    upstream.once('connect', () => upstream.setTimeout(0));
    upstream.once('timeout', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    // Activity while bytes flow: an instance with a forward in use does not hibernate.
    const release = this.access.lease(f.instanceId);
    client.once('close', release);
    client.pipe(upstream);
    upstream.pipe(client);
  }
}
