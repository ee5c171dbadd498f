/**
 * Finding 10 (issue 8): big outputs. 64 MiB of NUL bytes (six bytes of JSON each) come back
 * whole, as text and as base64, while the server's resident memory grows by a small fraction of
 * that. Issue 9: a 1 GiB file goes up and down the same way. The server is a child process so
 * that its memory is its own.
 */
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ChildServer } from './helpers/child-server.js';

let dataDir: string;
let server: ChildServer;
let id: string;
beforeAll(async () => {
  dataDir = await mkdtemp(join(tmpdir(), 'forkpoint-output-'));
  server = await ChildServer.start(dataDir);
  id = (await server.api('POST', '/instances', { name: 'loud' })).body.id;
});
afterAll(async () => {
  if (id) await server.api('DELETE', `/instances/${id}`);
  await server?.stop();
  await rm(dataDir, { recursive: true, force: true });
});

const MiB = 1 << 20;
const status = async (pid: number, field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(await readFile(`/proc/${pid}/status`, 'utf8'))![1]) * 1024;

function post(body: unknown) {
  return request(`${server.url}/instances/${id}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${server.token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
    bodyTimeout: 120_000,
    headersTimeout: 120_000,
  });
}

describe('finding 10: big, NUL-heavy outputs', () => {
  it('64 MiB of NULs on stdout and 16 MiB on stderr come back whole as text, and byte for byte as base64, in bounded server memory', async () => {
    const pid = server.proc.pid!;
    await writeFile(`/proc/${pid}/clear_refs`, '5'); // resets the peak
    const base = await status(pid, 'VmHWM');

    const res = await post({ command: 'head -c 67108864 /dev/zero; head -c 16777216 /dev/zero >&2', max_output_bytes: 64 * MiB, timeout_ms: 120_000 });
    expect(res.statusCode).toBe(200);
    // Checked as it streams: the text is 6 x 80 MiB of JSON, too much to hold in one string.
    const NUL = '\\u0000';
    let text = '';
    let field = 'head';
    const counts: Record<string, number> = { stdout: 0, stderr: 0 };
    let tail = '';
    for await (const chunk of res.body) {
      text += (chunk as Buffer).toString('latin1');
      for (;;) {
        if (field === 'head') {
          if (!text.startsWith('{"exit_code":0,"stdout":"') && text.length >= 25) throw new Error(`unexpected start: ${text.slice(0, 40)}`);
          if (text.length < 25) break;
          text = text.slice(25);
          field = 'stdout';
        } else if (field === 'stdout' || field === 'stderr') {
          let i = 0;
          while (text.startsWith(NUL, i)) i += 6;
          counts[field]! += i / 6;
          text = text.slice(i);
          if (text.length < 6 && !text.startsWith('"')) break;
          if (field === 'stdout') {
            if (text.length < 12) break;
            expect(text.slice(0, 12)).toBe('","stderr":"');
            text = text.slice(12);
            field = 'stderr';
          } else {
            tail = text;
            text = '';
            field = 'tail';
            break;
          }
        } else {
          tail += text;
          text = '';
          break;
        }
      }
    }
    expect(counts.stdout).toBe(64 * MiB);
    expect(counts.stderr).toBe(16 * MiB);
    const rest = JSON.parse(`{"stderr":"${tail}`);
    expect(rest).toMatchObject({ stderr: '', output_encoding: 'utf8', timed_out: false, truncated: false });

    const b64 = await post({ command: 'head -c 67108864 /dev/zero', max_output_bytes: 64 * MiB, output_encoding: 'base64', timeout_ms: 120_000 });
    expect(b64.statusCode).toBe(200);
    const body = (await b64.body.json()) as { stdout: string; exit_code: number; output_encoding: string };
    expect(body.exit_code).toBe(0);
    expect(body.output_encoding).toBe('base64');
    const bytes = Buffer.from(body.stdout, 'base64');
    expect(bytes.length).toBe(64 * MiB);
    expect(bytes.equals(Buffer.alloc(64 * MiB))).toBe(true);

    const grew = (await status(pid, 'VmHWM')) - base;
    expect(grew, `peak RSS grew by ${Math.round(grew / MiB)} MiB`).toBeLessThan(128 * MiB);
    // and the spill files are gone
    await new Promise((r) => setTimeout(r, 200));
    const { readdir } = await import('node:fs/promises');
    expect(await readdir(join(dataDir, 'spill'))).toEqual([]);
  }, 120_000);

  it('binary output that is not UTF-8 comes back exactly as base64', async () => {
    const res = await server.api('POST', `/instances/${id}/exec`, { command: 'printf "\\377\\376\\000a\\200"', output_encoding: 'base64' });
    expect(res.status).toBe(200);
    expect(Buffer.from(res.body.stdout, 'base64')).toEqual(Buffer.from([0xff, 0xfe, 0x00, 0x61, 0x80]));
  });
});

describe('issue 9: files of any size, streamed both ways', () => {
  it('a 1 GiB file is written and read back whole while the server holds a small part of it', async () => {
    const pid = server.proc.pid!;
    await writeFile(`/proc/${pid}/clear_refs`, '5');
    const base = await status(pid, 'VmHWM');
    const GiB = 1 << 30;
    const up = createHash('sha256');
    async function* content(): AsyncGenerator<Buffer> {
      const piece = Buffer.alloc(1 << 20);
      for (let i = 0; i < GiB / piece.length; i++) {
        piece.writeUInt32LE(i, 0); // every MiB different, so a lost or repeated piece shows
        piece.writeUInt32LE(i * 2654435761 >>> 0, 4096);
        up.update(piece);
        yield Buffer.from(piece);
      }
    }
    const put = await request(`${server.url}/instances/${id}/files?path=/big/one-gib.bin`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${server.token}`, 'content-type': 'application/octet-stream' },
      body: Readable.from(content()),
      bodyTimeout: 300_000,
      headersTimeout: 300_000,
    });
    expect(put.statusCode).toBe(200);
    expect(await put.body.json()).toEqual({ path: '/big/one-gib.bin', bytes: GiB });
    const get = await request(`${server.url}/instances/${id}/files?path=/big/one-gib.bin`, {
      headers: { authorization: `Bearer ${server.token}` },
      bodyTimeout: 300_000,
    });
    expect(get.statusCode).toBe(200);
    expect(get.headers['content-length']).toBe(String(GiB));
    const down = createHash('sha256');
    let n = 0;
    for await (const chunk of get.body) {
      down.update(chunk as Buffer);
      n += (chunk as Buffer).length;
    }
    expect(n).toBe(GiB);
    expect(down.digest('hex')).toBe(up.digest('hex'));
    const grew = (await status(pid, 'VmHWM')) - base;
    expect(grew, `peak RSS grew by ${Math.round(grew / MiB)} MiB`).toBeLessThan(128 * MiB);
    await server.api('DELETE', `/instances/${id}/files?path=/big/one-gib.bin`);
  }, 300_000);
});
