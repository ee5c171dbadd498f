import { closeSync, constants, fstatSync, openSync } from 'node:fs';
import { EngineError } from '../../seam/errors.js';

/** open(2)'s O_PATH (Linux, every architecture Node runs on here); Node does not export it. */
const O_PATH = 0o10000000;
const { O_DIRECTORY, O_NOFOLLOW } = constants;

/**
 * Opens the agent's socket, `/.fp/agent.sock` inside the sandbox, as an O_PATH descriptor,
 * without following anything the sandbox controls: the walk starts at the root of the sandbox's
 * PID 1 (a magic link the kernel resolves, not a path) and takes one name at a time with
 * O_NOFOLLOW, so a symlink or a swapped directory anywhere on the way is refused rather than
 * followed to another sandbox's socket or a host's. Connecting through `/proc/self/fd/<fd>`
 * then reaches that very inode. `alive` is checked once the root is open, so that a pid reused
 * meanwhile is never taken for the sandbox.
 */
export function openAgentSocket(pid: number, alive: () => boolean): number {
  const root = openFlat(`/proc/${pid}/root`, O_PATH | O_DIRECTORY);
  try {
    if (!alive()) throw new EngineError('NOT_RUNNING', `process ${pid} is gone`);
    const dir = openFlat(`/proc/self/fd/${root}/.fp`, O_PATH | O_DIRECTORY | O_NOFOLLOW);
    try {
      const sock = openFlat(`/proc/self/fd/${dir}/agent.sock`, O_PATH | O_NOFOLLOW);
      if (!fstatSync(sock).isSocket()) {
        closeSync(sock);
        throw new EngineError('AGENT_UNREACHABLE', 'the agent socket was replaced inside the sandbox');
      }
      return sock;
    } finally {
      closeSync(dir);
    }
  } finally {
    closeSync(root);
  }
}

/** The path that connects to the socket an O_PATH descriptor holds. */
export const viaDescriptor = (fd: number): string => `/proc/self/fd/${fd}`;

function openFlat(path: string, flags: number): number {
  try {
    return openSync(path, flags);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    // ELOOP/ENOTDIR: a symlink or a file where a directory or the socket should be.
    const reason = code === 'ELOOP' || code === 'ENOTDIR' ? 'was replaced inside the sandbox' : `cannot be opened (${code})`;
    throw new EngineError('AGENT_UNREACHABLE', `the agent socket ${reason}`, undefined, { cause: err });
  }
}
