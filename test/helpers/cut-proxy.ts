import { connect, createServer, type Server, type Socket } from 'node:net';
import { rm } from 'node:fs/promises';

/**
 * A proxy in front of a unix socket that a test can cut the way a network partition does
 * (bytes stop flowing both ways, nothing is refused or closed: every call waits out its own
 * deadline) and heal (connections that lived through the cut are reset, as a peer's TCP stack
 * does once packets flow again; new ones go through).
 */
export class CutProxy {
  private cutNow = false;
  private refusing = false;
  private readonly pairs = new Set<[Socket, Socket]>();
  private readonly held = new Set<Socket>();

  private constructor(private readonly server: Server, readonly path: string) {}

  static async start(path: string, target: string): Promise<CutProxy> {
    await rm(path, { force: true });
    let proxy!: CutProxy;
    const server = createServer((client) => proxy.accept(client, target));
    proxy = new CutProxy(server, path);
    await new Promise<void>((resolve, reject) => server.once('error', reject).listen(path, resolve));
    return proxy;
  }

  private accept(client: Socket, target: string): void {
    client.on('error', () => {});
    if (this.refusing) {
      client.destroy();
      return;
    }
    if (this.cutNow) {
      client.pause();
      this.held.add(client);
      return;
    }
    const upstream = connect(target);
    upstream.on('error', () => client.destroy());
    client.on('error', () => upstream.destroy());
    const pair: [Socket, Socket] = [client, upstream];
    this.pairs.add(pair);
    const forget = () => this.pairs.delete(pair);
    client.once('close', forget);
    upstream.once('close', forget);
    client.pipe(upstream);
    upstream.pipe(client);
  }

  /** From now on nothing gets through, either way. */
  cut(): void {
    this.cutNow = true;
    for (const [a, b] of this.pairs) {
      a.pause();
      b.pause();
      a.unpipe(b);
      b.unpipe(a);
    }
  }

  /** The database stopped, as its host would say so: every connection is reset, new ones are
   * refused, until `heal`. */
  refuse(): void {
    this.cutNow = true;
    this.refusing = true;
    this.resetAll();
  }

  /** Packets flow again: what the cut held is reset, new connections go through. */
  heal(): void {
    this.cutNow = false;
    this.refusing = false;
    this.resetAll();
  }

  /** Every connection, forwarded or held, is reset. */
  private resetAll(): void {
    for (const [a, b] of this.pairs) {
      a.destroy();
      b.destroy();
    }
    this.pairs.clear();
    for (const s of this.held) s.destroy();
    this.held.clear();
  }

  async close(): Promise<void> {
    this.heal();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    await rm(this.path, { force: true });
  }
}
