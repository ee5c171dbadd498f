/**
 * The agent's side of the wire is hostile input. A fake agent on a real unix socket answers the
 * real client with random, oversized and truncated frames: every request must settle, every
 * bad connection must close, and no exception may escape (vitest fails on any unhandled one).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, AgentProtocolError } from '../src/engine/agent/client.js';
import { encodeFrame, FrameDecoder, HEADER_LEN, MAX_FRAME, T } from '../src/engine/agent/protocol.js';
import { until } from './helpers/wait.js';

let dir: string;
let server: Server;
let respond: (s: Socket) => void = (s) => s.end();
const open = new Set<Socket>();
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'forkpoint-protocol-'));
  server = createServer((s) => {
    open.add(s);
    s.on('close', () => open.delete(s));
    s.on('error', () => {});
    respond(s);
  });
  await new Promise<void>((r) => server.listen(join(dir, 'agent.sock'), r));
});
afterAll(async () => {
  for (const s of open) s.destroy();
  await new Promise((r) => server.close(r));
  await rm(dir, { recursive: true, force: true });
});

/** xorshift: the same garbage on every run. */
function prng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return x >>> 0;
  };
}

const AGENT_TYPES = [T.OUTPUT, T.SPAWNED, T.EXIT, T.LIST_REPLY, T.ERROR, T.PONG, T.FILE, T.OK, T.WATCH_EVENT];

/** A frame of a real type with a payload of the right shape, or of random type, length and
 * bytes, or a header that lies about its length; now and then cut short. */
function garbageFrame(next: () => number): Buffer {
  const pick = next() % 10;
  if (pick < 6) {
    const type = AGENT_TYPES[next() % AGENT_TYPES.length]!;
    const sizes: Record<number, number> = { [T.SPAWNED]: 4, [T.EXIT]: 8, [T.PONG]: 0, [T.OK]: 0 };
    const len = sizes[type] ?? next() % 64;
    const payload = Buffer.alloc(len);
    for (let i = 0; i < len; i++) payload[i] = next() & 0xff;
    return encodeFrame(type, next() % 4, payload, next() % 4);
  }
  if (pick < 9) {
    const len = next() % 48;
    const payload = Buffer.alloc(len);
    for (let i = 0; i < len; i++) payload[i] = next() & 0xff;
    return encodeFrame(next() & 0xff, next(), payload, next() & 0xff);
  }
  const h = Buffer.alloc(HEADER_LEN);
  h.writeUInt32LE(next() % 2 ? MAX_FRAME + 1 + (next() % 1000) : next(), 0);
  h[4] = next() & 0xff;
  return h;
}

/** Opens a client, asks it things, and waits until every request has settled and the
 * connection is closed (or is still healthy). */
async function drive(): Promise<{ failures: Error[]; settled: number }> {
  const failures: Error[] = [];
  let closed!: () => void;
  const gone = new Promise<void>((r) => (closed = r));
  const c = await AgentClient.connect(join(dir, 'agent.sock'), { onFailure: (e) => failures.push(e), onClose: () => closed() });
  const watchEnded = new Promise<void>((r) => void c.watch(1, '/w', true, { onEvent: () => {}, onEnd: () => r() }).catch(() => r()));
  const requests = [c.ping(), c.list(), c.readFile('/x', 100), c.listDir('/'), c.writeFile('/y', 'z'), watchEnded];
  const results = await Promise.allSettled(requests);
  await Promise.race([gone, new Promise((r) => setTimeout(r, 2000))]);
  await c.close(100);
  return { failures, settled: results.length };
}

describe('agent protocol fuzz', () => {
  it('thousands of random, oversized and truncated frames: every request settles, nothing escapes', async () => {
    const next = prng(20261122);
    let frames = 0;
    let protocolErrors = 0;
    respond = (s) => {
      const chunks: Buffer[] = [];
      const n = 1 + (next() % 40);
      for (let i = 0; i < n; i++) chunks.push(garbageFrame(next));
      frames += n;
      let all = Buffer.concat(chunks);
      if (next() % 5 === 0) all = all.subarray(0, next() % (all.length + 1));
      // in pieces of random size, as a socket would deliver them
      for (let off = 0; off < all.length; ) {
        const k = 1 + (next() % 97);
        s.write(all.subarray(off, off + k));
        off += k;
      }
      s.end();
    };
    for (let i = 0; i < 1500; i++) {
      const { failures, settled } = await drive();
      expect(settled).toBe(6);
      for (const f of failures) expect(f).toBeInstanceOf(AgentProtocolError);
      protocolErrors += failures.length;
    }
    expect(frames).toBeGreaterThan(20_000);
    expect(protocolErrors).toBeGreaterThan(100);
  }, 60_000);

  it('a watch event naming a path outside the watched directory (absolute, `..`, empty) or of an unknown kind closes the connection; good ones arrive; the watch ends with it', async () => {
    const event = (op: number, name: string) => encodeFrame(T.WATCH_EVENT, 5, Buffer.from(name), op);
    const ok = encodeFrame(T.OK, 5);
    for (const [bad, why] of [[event(2, '/etc/shadow'), 'absolute'], [event(2, 'a/../../x'), 'dot-dot'], [event(2, ''), 'empty'], [event(9, 'a'), 'unknown op'], [event(0, 'a'), 'no op'], [event(1, 'a\0b'), 'NUL']] as const) {
      respond = (s) => s.once('data', () => s.write(Buffer.concat([ok, event(1, 'fine.txt'), bad])));
      const failures: Error[] = [];
      const c = await AgentClient.connect(join(dir, 'agent.sock'), { onFailure: (e) => failures.push(e) });
      const seen: string[] = [];
      let ended: Error | undefined;
      await c.watch(5, '/w', false, { onEvent: (e) => void seen.push(`${e.op} ${e.name}`), onEnd: (err) => (ended = err) });
      await until(`the ${why} event refused`, () => !c.isOpen);
      expect(seen, why).toEqual(['create fine.txt']);
      expect(failures[0], why).toBeInstanceOf(AgentProtocolError);
      expect(ended, why).toBeDefined();
    }
  });

  it('file metadata an agent makes up (a key no header could carry, a tab in a value, a key twice, more than 64) is a protocol error; `__proto__` is a plain key', async () => {
    const stat = (extra: string) => encodeFrame(T.FILE, 0, Buffer.from(`f\t1\t644\t0\t\n${extra}`));
    const bad = ['x\tbad key\tv\n', 'x\tk\ta\tb\n', 'x\tk\tv\nx\tk\tw\n', 'y\tk\tv\n', 'x\tk\t\u0001\n', Array.from({ length: 65 }, (_, i) => `x\tk${i}\tv\n`).join('')];
    for (const extra of bad) {
      respond = (s) => s.once('data', (d: Buffer) => s.write(Buffer.concat([stat(extra).subarray(0, 8), d.subarray(8, 12), stat(extra).subarray(12)])));
      const c = await AgentClient.connect(join(dir, 'agent.sock'), { onFailure: () => {} });
      await expect(c.stat('/f'), JSON.stringify(extra)).rejects.toBeInstanceOf(AgentProtocolError);
      await c.close(100);
    }
    respond = (s) => s.once('data', (d: Buffer) => s.write(Buffer.concat([stat('x\t__proto__\tv\n').subarray(0, 8), d.subarray(8, 12), stat('x\t__proto__\tv\n').subarray(12)])));
    const c = await AgentClient.connect(join(dir, 'agent.sock'));
    const st = await c.stat('/f');
    expect(Object.getPrototypeOf(st!.metadata)).toBe(Object.prototype);
    expect(Object.keys(st!.metadata!)).toEqual(['__proto__']);
    await c.close(100);
  });

  it('"length 0, type ERROR" is a protocol error, not a crash', async () => {
    respond = (s) => s.write(Buffer.from([0, 0, 0, 0, T.ERROR, 0, 0, 0, 1, 0, 0, 0]));
    const failures: Error[] = [];
    const c = await AgentClient.connect(join(dir, 'agent.sock'), { onFailure: (e) => failures.push(e) });
    await expect(c.ping()).rejects.toThrow();
    expect(failures[0]).toBeInstanceOf(AgentProtocolError);
    expect(c.isOpen).toBe(false);
  });

  it('an agent that never answers: the request ends at its deadline and the connection is given up', async () => {
    respond = () => {}; // accepts, says nothing
    const c = await AgentClient.connect(join(dir, 'agent.sock'));
    const started = Date.now();
    await expect((c as unknown as { request(t: number, id: number, p?: Buffer, f?: number, ms?: number): Promise<unknown> }).request(T.PING, 7, undefined, 0, 300)).rejects.toThrow(/did not answer/);
    expect(Date.now() - started).toBeLessThan(2000);
    await new Promise((r) => setTimeout(r, 20));
    expect(c.isOpen).toBe(false);
  });

  it('the decoder gives the same frames however the bytes are split', () => {
    const next = prng(7);
    const frames = Array.from({ length: 200 }, (_, i) => encodeFrame(T.OUTPUT, i, Buffer.alloc(8 + (next() % 300), i & 0xff), 1));
    const all = Buffer.concat(frames);
    const d = new FrameDecoder();
    const got = [];
    for (let off = 0; off < all.length; ) {
      const k = 1 + (next() % 500);
      got.push(...d.push(all.subarray(off, off + k)));
      off += k;
    }
    expect(got.map((f) => f.id)).toEqual(frames.map((_, i) => i));
    expect(got.every((f, i) => f.payload.length === frames[i]!.length - HEADER_LEN)).toBe(true);
  });
});
