import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir, rename, rm } from 'node:fs/promises';
import { PassThrough, type Readable } from 'node:stream';
import { heldErrors } from '../lib/held-error.js';

/**
 * A directory as a tar stream: names sorted and access/change times left out, so that the same
 * tree packs to the same bytes (a layer is packed, hashed and uploaded once). Owners by number,
 * extended attributes and ACLs kept (overlayfs whiteouts and opaque marks ride on them). The
 * directory is entered through its own path: a layer that lives in a volume is a link to it.
 */
export function packTree(dir: string): Readable {
  const child = spawn(
    'tar',
    ['-c', '-f', '-', '--sort=name', '--numeric-owner', '--format=posix', '--pax-option=delete=atime,delete=ctime', '--xattrs', '--xattrs-include=*', '--acls', '-C', `${dir}/`, '.'],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  // Piped at once: Node drops the output of a child that exits while nobody reads it.
  const out = heldErrors(new PassThrough());
  let err = '';
  child.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-2000)));
  child.stdout.pipe(out, { end: false });
  child.on('close', (code) => {
    if (code === 0) out.end();
    else out.destroy(new Error(`tar of ${dir} failed (${code}): ${err.trim()}`));
  });
  child.on('error', (e) => out.destroy(e));
  return out;
}

/** Unpacks a tar made by `packTree` into `dest`, which must not exist: into a new directory
 * beside it (so nothing already there can redirect a member), renamed into place once whole.
 * The stream is read to its end even when tar stops early (it exits at the end-of-archive mark,
 * before the record's padding), so that a stream that checks what it carries (a hash, gzip's
 * CRC) has checked all of it before the tree counts as unpacked. */
export async function unpackTree(tar: Readable, dest: string): Promise<void> {
  // Listened to before the first await: a stream that fails meanwhile must not fail unheard.
  let sourceError: unknown = tar.errored ?? undefined;
  let child: ChildProcess | undefined;
  const readToEnd = new Promise<void>((resolve, reject) => {
    tar.once('end', resolve);
    tar.once('error', (e) => {
      sourceError = e;
      // Without the rest of its input, tar would wait for it for ever.
      child?.kill('SIGKILL');
      reject(e);
    });
  });
  readToEnd.catch(() => {}); // awaited below, after tar's exit
  const tmp = `${dest}.incoming`;
  try {
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp, { recursive: true });
    if (sourceError) throw sourceError;
    const proc = spawn('tar', ['-x', '-f', '-', '--numeric-owner', '-p', '--xattrs', '--xattrs-include=*', '--acls', '-C', tmp], { stdio: ['pipe', 'ignore', 'pipe'] });
    child = proc;
    let err = '';
    proc.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-2000)));
    const exited = new Promise<number | null>((resolve, reject) => {
      proc.on('close', resolve);
      proc.on('error', reject);
    });
    // tar closing its input early is judged by its exit status, not by the write it cut short.
    proc.stdin.on('error', () => {});
    tar.pipe(proc.stdin);
    const code = await exited;
    tar.unpipe(proc.stdin);
    if (code !== 0) throw sourceError ?? new Error(`unpacking into ${dest} failed (${code}): ${err.trim()}`);
    tar.resume();
    await readToEnd;
    await rename(tmp, dest);
  } catch (e) {
    tar.destroy();
    await rm(tmp, { recursive: true, force: true });
    throw e;
  }
}
