import { request as httpRequest } from 'node:http';
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';
import { sleep, until } from './helpers/wait.js';

// A hostile client against the HTTP server itself: slow and many connections.
const PER_CLIENT = 40;
let s: TestServer;
let port: number;
beforeAll(async () => {
  s = await startServer({ httpHeadersTimeoutMs: 1000, httpBodyStallMs: 1000, httpConnectionsPerClient: PER_CLIENT });
  port = Number(new URL(s.url).port);
});
afterAll(async () => s?.close());

/** A GET from another loopback address than the test's own client. */
const getFrom = (localAddress: string, path: string) =>
  new Promise<number>((resolve, reject) => {
    httpRequest({ host: '127.0.0.1', port, path, localAddress, headers: { authorization: `Bearer ${s.token}` } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    })
      .on('error', reject)
      .end();
  });

describe('the HTTP server under a connection flood', () => {
  it('a client trickling headers or bodies on many connections is cut at its bound and at the deadlines, while an authorised client is served', async () => {
    const flood: { socket: Socket; closedAt?: number }[] = [];
    const started = Date.now();
    try {
      for (let i = 0; i < 200; i++) {
        const socket = connect({ host: '127.0.0.1', port, localAddress: '127.0.0.2' });
        const entry: { socket: Socket; closedAt?: number } = { socket };
        socket.on('error', () => {});
        socket.resume(); // reads (and drops) what the server answers: its end is then seen
        socket.on('close', () => (entry.closedAt = Date.now()));
        socket.on('connect', () => {
          // Half never finish their headers; half announce a body and send a few bytes of it.
          if (i % 2) socket.write('POST /instances HTTP/1.1\r\nHost: x\r\nX-Slow: ');
          else socket.write(`PUT /instances/inst_x/files?path=/tmp/f HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n0123456789`);
        });
        flood.push(entry);
      }
      // Past its bound a client's connections are closed at once.
      await until('the connections past the bound closed', async () => flood.filter((f) => f.closedAt).length >= 200 - PER_CLIENT, 5000);
      // The flood holds its share; an authorised client (another address) is served meanwhile.
      for (let i = 0; i < 10; i++) expect((await s.api('GET', '/instances')).status).toBe(200);
      // The deadlines cut the rest: headers not whole in 1 s, a body that stopped moving.
      await until('every connection of the flood closed', async () => flood.every((f) => f.closedAt), 15_000).catch((err: unknown) => {
        const open = flood.map((f, i) => (f.closedAt ? -1 : i)).filter((i) => i >= 0);
        throw new Error(`${open.length} still open (${open.filter((i) => i % 2).length} without whole headers) after ${Date.now() - started} ms; first at ${JSON.stringify(flood.map((f) => f.closedAt && f.closedAt - started).slice(0, 12))}`, { cause: err });
      });
      const held = flood.map((f) => f.closedAt! - started).sort((a, b) => b - a).slice(0, PER_CLIENT);
      expect(Math.min(...held)).toBeGreaterThanOrEqual(900); // held until a deadline, not refused
      // With its connections gone the client is served again.
      expect(await getFrom('127.0.0.2', '/instances')).toBe(200);
    } finally {
      for (const f of flood) f.socket.destroy();
    }
  });

  it('a slow upload that keeps moving is not cut', async () => {
    const inst = await s.instance();
    const status = await new Promise<number>((resolve, reject) => {
      const req = httpRequest(
        { host: '127.0.0.1', port, method: 'PUT', path: `/instances/${inst.id}/files?path=/tmp/slow`, headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/octet-stream', 'content-length': 10 * 8192 } },
        (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        },
      ).on('error', reject);
      void (async () => {
        for (let i = 0; i < 10; i++) {
          req.write(Buffer.alloc(8192, 0x61));
          await sleep(300); // 3 s in all: three times the stall window
        }
        req.end();
      })();
    });
    expect(status).toBe(200);
    expect((await s.exec(inst.id, { command: 'wc -c < /tmp/slow' })).stdout.trim()).toBe(String(10 * 8192));
  });
});

describe('a closing server', () => {
  it('attack: half a request held open does not hold the server\'s close for its headers timeout; the close ends within its grace', async () => {
    const other = await startServer({ httpHeadersTimeoutMs: 60_000 });
    const sock = connect(Number(new URL(other.url).port), '127.0.0.1');
    await new Promise<void>((r) => sock.once('connect', () => r()));
    sock.on('error', () => {});
    sock.write('GET /healthz HTTP/1.1\r\nHost: x\r\n'); // and never the end of the headers
    await sleep(200);
    const started = Date.now();
    await other.close();
    expect(Date.now() - started).toBeLessThan(15_000);
    sock.destroy();
  });
});
