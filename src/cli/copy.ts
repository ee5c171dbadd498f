import { createReadStream, createWriteStream } from 'node:fs';
import { chmod, lstat, mkdir, readdir } from 'node:fs/promises';
import { posix, join, basename } from 'node:path';
import { Readable, Transform } from 'node:stream';
import type { ReadableStream as WebReadable } from 'node:stream/web';
import { pipeline } from 'node:stream/promises';
import { Api, answer, CliError, resolveTarget } from './api.js';
import type { Common } from './client.js';
import { bytes, printJson } from './format.js';

/** `ID:/path` names a path in an instance; anything else is local. */
function remoteOf(spec: string): { id: string; path: string } | undefined {
  const m = /^(inst_[a-z0-9]+):(.*)$/.exec(spec);
  if (!m) return undefined;
  const path = m[2] || '/';
  if (!path.startsWith('/')) throw new CliError(`${spec}: a path in an instance is absolute (ID:/path)`, 'USAGE', 2);
  return { id: m[1]!, path: posix.normalize(path) };
}

interface Entry {
  /** Relative to what is copied ('' for a single file). */
  rel: string;
  type: 'dir' | 'file';
  size: number;
  /** Permission bits (a local file's; a remote one's are asked for as it is copied). */
  mode?: number;
}

/** A progress line on a terminal: bytes so far of the whole. */
class Progress {
  private done = 0;
  private last = 0;
  private readonly on = process.stderr.isTTY === true;
  constructor(private readonly total: number) {}
  counter(): Transform {
    return new Transform({
      transform: (chunk: Buffer, _enc, cb) => {
        this.add(chunk.length);
        cb(null, chunk);
      },
    });
  }
  add(n: number): void {
    this.done += n;
    if (!this.on || Date.now() - this.last < 100) return;
    this.last = Date.now();
    const width = 30;
    const frac = this.total ? Math.min(1, this.done / this.total) : 1;
    const bar = '█'.repeat(Math.round(frac * width)).padEnd(width, '░');
    process.stderr.write(`\r${bar} ${bytes(this.done)} / ${bytes(this.total)}`);
  }
  end(): void {
    if (this.on) process.stderr.write('\r\x1b[K');
  }
}

async function localEntries(root: string): Promise<Entry[]> {
  const st = await lstat(root).catch(() => {
    throw new CliError(`${root}: no such file or directory`, 'NOT_FOUND');
  });
  if (st.isFile()) return [{ rel: '', type: 'file', size: st.size, mode: st.mode & 0o7777 }];
  if (!st.isDirectory()) throw new CliError(`${root}: only files and directories are copied`, 'USAGE', 2);
  const out: Entry[] = [{ rel: '', type: 'dir', size: 0 }];
  const walk = async (rel: string) => {
    for (const d of await readdir(join(root, rel), { withFileTypes: true })) {
      const r = rel ? `${rel}/${d.name}` : d.name;
      if (d.isDirectory()) {
        out.push({ rel: r, type: 'dir', size: 0 });
        await walk(r);
      } else if (d.isFile()) {
        const f = await lstat(join(root, r));
        out.push({ rel: r, type: 'file', size: f.size, mode: f.mode & 0o7777 });
      } else {
        process.stderr.write(`forkpoint: ${join(root, r)}: not a file or directory, left out\n`);
      }
    }
  };
  await walk('');
  return out;
}

async function remoteEntries(a: Api, id: string, root: string): Promise<Entry[]> {
  const files = `/instances/${encodeURIComponent(id)}/files`;
  const st = await a.call<{ type: string; size: number }>('GET', `${files}/stat?path=${encodeURIComponent(root)}`);
  if (st.type === 'file') return [{ rel: '', type: 'file', size: st.size }];
  if (st.type !== 'dir') throw new CliError(`${id}:${root}: only files and directories are copied`, 'USAGE', 2);
  const out: Entry[] = [{ rel: '', type: 'dir', size: 0 }];
  const walk = async (rel: string) => {
    const list = await a.call<{ items: { name: string; type: string; size: number }[] }>('GET', `${files}/list?path=${encodeURIComponent(posix.join(root, rel))}`);
    for (const e of list.items) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.type === 'dir') {
        out.push({ rel: r, type: 'dir', size: 0 });
        await walk(r);
      } else if (e.type === 'file') {
        out.push({ rel: r, type: 'file', size: e.size });
      } else {
        process.stderr.write(`forkpoint: ${id}:${posix.join(root, r)}: not a file or directory, left out\n`);
      }
    }
  };
  await walk('');
  return out;
}

/**
 * Copies files and directory trees into an instance or out of one, as `docker cp` does: the
 * source's last name is kept under a destination directory that exists, else the destination is
 * the copy's own name. Files are streamed (any size), with a progress bar on a terminal, and keep
 * their permission bits.
 */
export async function cp(src: string, dst: string, o: Common): Promise<void> {
  const from = remoteOf(src);
  const to = remoteOf(dst);
  if (!!from === !!to) throw new CliError('cp: one side is an instance path (ID:/path), the other a local one', 'USAGE', 2);
  const a = new Api(resolveTarget(o));
  const files = (id: string) => `/instances/${encodeURIComponent(id)}/files`;
  let copied = 0;
  let total = 0;
  if (to) {
    const entries = await localEntries(src);
    // Into a directory that is there: under the source's own name.
    const there = await a.call<{ type: string }>('GET', `${files(to.id)}/stat?path=${encodeURIComponent(to.path)}`).catch(() => undefined);
    const base = there?.type === 'dir' ? posix.join(to.path, basename(src)) : to.path;
    total = entries.reduce((n, e) => n + e.size, 0);
    const progress = new Progress(total);
    for (const e of entries) {
      const path = e.rel ? posix.join(base, e.rel) : base;
      if (e.type === 'dir') {
        await a.call('POST', `${files(to.id)}/mkdir`, { path });
        continue;
      }
      const body = createReadStream(e.rel ? join(src, e.rel) : src).pipe(progress.counter());
      const mode = e.mode !== undefined ? `&mode=${e.mode.toString(8).padStart(3, '0')}` : '';
      await answer(await a.raw('PUT', `${files(to.id)}?path=${encodeURIComponent(path)}${mode}`, { body, headers: { 'content-type': 'application/octet-stream' } }));
      copied++;
    }
    progress.end();
  } else {
    const f = from!;
    const entries = await remoteEntries(a, f.id, f.path);
    const there = await lstat(dst).catch(() => undefined);
    const base = there?.isDirectory() ? join(dst, posix.basename(f.path)) : dst;
    total = entries.reduce((n, e) => n + e.size, 0);
    const progress = new Progress(total);
    for (const e of entries) {
      const path = e.rel ? join(base, e.rel) : base;
      if (e.type === 'dir') {
        await mkdir(path, { recursive: true });
        continue;
      }
      const remote = encodeURIComponent(e.rel ? posix.join(f.path, e.rel) : f.path);
      const res = await a.raw('GET', `${files(f.id)}?path=${remote}`);
      if (res.status >= 400 || !res.body) await answer(res);
      await pipeline(Readable.fromWeb(res.body as WebReadable<Uint8Array>), progress.counter(), createWriteStream(path));
      const { mode } = await a.call<{ mode: number }>('GET', `${files(f.id)}/stat?path=${remote}`);
      await chmod(path, mode & 0o777);
      copied++;
    }
    progress.end();
  }
  if (o.json) printJson({ files: copied, bytes: total });
  else process.stderr.write(`${copied} file${copied === 1 ? '' : 's'}, ${bytes(total)}\n`);
}
