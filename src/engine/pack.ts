import { spawn } from 'node:child_process';
import { mkdir, rename, rm } from 'node:fs/promises';
import { PassThrough, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';

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
  const out = new PassThrough();
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
 * beside it (so nothing already there can redirect a member), renamed into place once whole. */
export async function unpackTree(tar: Readable, dest: string): Promise<void> {
  const tmp = `${dest}.incoming`;
  await rm(tmp, { recursive: true, force: true });
  await mkdir(tmp, { recursive: true });
  try {
    const child = spawn('tar', ['-x', '-f', '-', '--numeric-owner', '-p', '--xattrs', '--xattrs-include=*', '--acls', '-C', tmp], { stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-2000)));
    const exited = new Promise<number | null>((resolve, reject) => {
      child.on('close', resolve);
      child.on('error', reject);
    });
    await pipeline(tar, child.stdin);
    const code = await exited;
    if (code !== 0) throw new Error(`unpacking into ${dest} failed (${code}): ${err.trim()}`);
    await rename(tmp, dest);
  } catch (e) {
    await rm(tmp, { recursive: true, force: true });
    throw e;
  }
}
