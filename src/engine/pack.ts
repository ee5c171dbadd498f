import { spawn } from 'node:child_process';
import { PassThrough, type Readable } from 'node:stream';

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
