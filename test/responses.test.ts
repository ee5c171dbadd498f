/**
 * An answer never carries more or fewer bytes than it announces (issue 20): a sandbox that makes
 * a file's bytes run past its announced length must not get them read as the next answer on a
 * connection the client reuses, the answer about another tenant's sandbox included.
 */
import { Sandbox } from 'e2b';
import { connect, type Socket } from 'node:net';
import { Client } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually, startServer, type TestServer } from './helpers/server.js';

let s: TestServer;
let client: Client;
let a: string; // the attacker's sandbox
let b: string; // another tenant's
let bToken: string;
beforeAll(async () => {
  s = await startServer();
  bToken = (await s.fp.store.tokens.create('tenant-b', 'test')).token;
  a = (await s.instance({ name: 'spiller' })).id;
  b = (await s.api('POST', '/instances', { name: 'victim' }, { authorization: `Bearer ${bToken}` })).body.id;
  await s.api('POST', `/instances/${b}/exec`, { command: 'printf genuine > /root/b' }, { authorization: `Bearer ${bToken}` });
  // One connection, reused for every request: what a pooled client does.
  client = new Client(s.url, { pipelining: 1 });
});
afterAll(async () => {
  await client?.close();
  await s?.close();
});

/** GET on the shared connection: the announced length, and the bytes that came as the body. */
async function get(path: string, token: string): Promise<{ status: number; announced: number | undefined; body: Buffer }> {
  const r = await client.request({ method: 'GET', path, headers: { authorization: `Bearer ${token}` } });
  const body = Buffer.from(await r.body.arrayBuffer());
  const length = r.headers['content-length'];
  return { status: r.statusCode, announced: typeof length === 'string' ? Number(length) : undefined, body };
}

/**
 * A plain HTTP/1.1 keep-alive client, as trusting as most are: it reads an answer's headers, then
 * exactly the bytes announced, and takes whatever follows on the connection as the next answer.
 */
class PlainClient {
  private buffered = Buffer.alloc(0);
  private waiter: (() => void) | undefined;
  private constructor(private readonly socket: Socket) {
    socket.on('data', (d: Buffer) => {
      this.buffered = Buffer.concat([this.buffered, d]);
      this.waiter?.();
    });
  }

  static async open(url: string): Promise<PlainClient> {
    const { hostname, port } = new URL(url);
    const socket = connect(Number(port), hostname);
    await new Promise((r) => socket.once('connect', r));
    return new PlainClient(socket);
  }

  private async take(n: number): Promise<Buffer> {
    const deadline = Date.now() + 30_000;
    while (this.buffered.length < n) {
      if (Date.now() > deadline) throw new Error(`waited for ${n} bytes, have ${this.buffered.length}`);
      await new Promise<void>((r) => {
        this.waiter = r;
        setTimeout(r, 100);
      });
    }
    const out = this.buffered.subarray(0, n);
    this.buffered = this.buffered.subarray(n);
    return out;
  }

  async get(path: string, token: string): Promise<{ status: number; body: Buffer }> {
    this.socket.write(`GET ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}\r\n\r\n`);
    let end: number;
    for (;;) {
      end = this.buffered.indexOf('\r\n\r\n');
      if (end >= 0) break;
      await this.take(this.buffered.length + 1).then((b) => (this.buffered = Buffer.concat([b, this.buffered])));
    }
    const head = (await this.take(end + 4)).toString('latin1');
    const length = /(?:^|\r\n)content-length: *(\d+)/i.exec(head);
    if (!length) throw new Error(`no length announced: ${head}`);
    return { status: Number(head.split(' ')[1]), body: await this.take(Number(length[1])) };
  }

  close(): void {
    this.socket.destroy();
  }
}

const victimsFile = async () => {
  const r = await get(`/instances/${b}/files?path=/root/b`, bToken);
  expect([r.status, r.body.toString()]).toEqual([200, 'genuine']);
};

describe('answers carry what they announce', () => {
  it('a procfs file (whose stat says 0 bytes) is announced as what was read, and the next answer on the connection is its own', async () => {
    const truth = (await s.exec(a, { command: 'cat /proc/version' })).stdout;
    expect(truth.length).toBeGreaterThan(0);
    for (let i = 0; i < 3; i++) {
      const r = await get(`/instances/${a}/files?path=/proc/version`, s.token);
      expect([r.status, r.announced, r.body.toString()]).toEqual([200, truth.length, truth]);
      await victimsFile();
    }
  });

  it('a file growing while it is read (its bytes a forged HTTP answer) never spills into the next answer', async () => {
    const forged = 'HTTP/1.1 200 OK\\r\\ncontent-length: 8\\r\\n\\r\\nFORGED-A';
    // Past the first 4 MiB piece, so that the read takes the stat's size and several pieces.
    // It grows to 16 MB at most: unbounded, a loaded machine made each read larger than the
    // client's deadline (42 MB in 10 s), which says nothing of what the answer announced.
    await s.exec(a, { command: `head -c 5000000 /dev/zero > /tmp/g; (while [ $(stat -c %s /tmp/g) -lt 16000000 ]; do for i in 1 2 3 4 5 6 7 8; do printf '${forged}' >> /tmp/g; done; done) >/dev/null 2>&1 &`, session: 'grow' });
    await eventually(async () => Number((await s.exec(a, { command: 'stat -c %s /tmp/g' })).stdout) > 5_100_000);
    const plain = await PlainClient.open(s.url);
    try {
      for (let i = 0; i < 8; i++) {
        expect((await plain.get(`/instances/${a}/files?path=/tmp/g`, s.token)).status).toBe(200);
        const victim = await plain.get(`/instances/${b}/files?path=/root/b`, bToken);
        expect([victim.status, victim.body.toString()]).toEqual([200, 'genuine']);
      }
    } finally {
      plain.close();
      await s.exec(a, { command: 'kill %1; true', session: 'grow' });
    }
  });

  it('through the unchanged e2b SDK, sandbox A\'s procfs read and sandbox B\'s file each come back whole and their own', async () => {
    process.env.E2B_API_URL = s.url;
    process.env.E2B_SANDBOX_URL = s.url;
    process.env.E2B_API_KEY = s.token;
    try {
      const [sa, sb] = await Promise.all([Sandbox.create(), Sandbox.create()]);
      await sb.files.write('b', 'genuine-b');
      const truth = (await sa.commands.run('cat /proc/version')).stdout;
      for (let i = 0; i < 3; i++) {
        expect(await sa.files.read('/proc/version')).toBe(truth);
        expect(await sb.files.read('b')).toBe('genuine-b');
      }
      await Promise.all([sa.kill(), sb.kill()]);
    } finally {
      delete process.env.E2B_API_URL;
      delete process.env.E2B_SANDBOX_URL;
      delete process.env.E2B_API_KEY;
    }
  });
});
