import type { Forkpoint } from '../core/forkpoint.js';
import { AS_ROOT } from '../core/users.js';
import { NotFoundError, ConflictError } from '../core/errors.js';
import type { AsUser } from '../core/files.js';

/**
 * Removes a path as `os.RemoveAll` does, which both E2B's envd and OpenComputer's agent call: a
 * directory with everything under it, a link itself (never what it points to), and nothing at
 * all when nothing is there. Runs inside the sandbox, resolved in its own root, as root unless
 * told (as the files API acts, whoever the image's USER is).
 */
export async function removeTree(fp: Forkpoint, owner: string, id: string, path: string, as: AsUser = {}): Promise<void> {
  const st = await fp.files.stat(owner, id, path, as).catch((err: unknown) => {
    if (err instanceof NotFoundError) return undefined;
    throw err;
  });
  if (!st) return;
  if (st.type !== 'dir') return fp.files.remove(owner, id, path, as);
  const r = await fp.commands.exec(owner, id, { command: ['rm', '-rf', '--', path], user: as.user ?? AS_ROOT });
  if (r.exitCode !== 0) throw new ConflictError(`could not remove all of ${path} (rm exited ${r.exitCode})`, { path, exit_code: r.exitCode });
}
