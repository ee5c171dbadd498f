import type { Logger } from 'pino';
import { AgentError, type AgentClient } from '../engine/agent/client.js';
import type { DirEntry } from '../engine/agent/frames.js';
import { ENOENT } from '../engine/agent/protocol.js';
import { engineFailure } from './engine-failure.js';
import { ForkpointError, InvalidRequestError, NotFoundError, PayloadTooLargeError } from './errors.js';
import type { InstanceService } from './instances.js';

export const MAX_FILE_BYTES = 8 * 1024 * 1024 - 4096;

/** Files inside an instance. Every operation is done by the agent, inside the sandbox's own
 * root: the host never opens a path a sandbox could have redirected with a symlink. */
export class FileService {
  constructor(
    private readonly instances: InstanceService,
    private readonly log: Logger,
  ) {}

  private path(p: string): string {
    if (!p.startsWith('/') || p.includes('\0')) throw new InvalidRequestError('path must be absolute', { path: p });
    return p;
  }

  /** Runs one file operation on the instance's agent, with agent errors as API errors. */
  private async op<T>(owner: string, id: string, path: string, fn: (agent: AgentClient, path: string) => Promise<T>): Promise<T> {
    const sb = this.instances.sandbox(owner, id);
    const p = this.path(path);
    try {
      return await sb.call((agent) => fn(agent, p));
    } catch (err) {
      throw this.failed(err, path);
    }
  }

  private failed(err: unknown, path: string): Error {
    if (err instanceof AgentError) {
      if (err.errno === ENOENT) return new NotFoundError('file', path);
      return new InvalidRequestError(`${path}: ${err.message}`, { path, errno: err.errno });
    }
    const mapped = engineFailure(err);
    if (!(mapped instanceof ForkpointError)) this.log.error({ err, path }, 'file operation failed');
    return mapped;
  }

  async read(owner: string, id: string, path: string): Promise<Buffer> {
    const file = await this.op(owner, id, path, (a, p) => a.readFile(p, MAX_FILE_BYTES));
    if (!file) throw new NotFoundError('file', path);
    if (file.truncated) throw new PayloadTooLargeError(`${path} is larger than ${MAX_FILE_BYTES} bytes`);
    return file.data;
  }

  /** Writes a whole file, making its parent directories. */
  async write(owner: string, id: string, path: string, data: Buffer): Promise<void> {
    if (data.length > MAX_FILE_BYTES) throw new PayloadTooLargeError(`files are written up to ${MAX_FILE_BYTES} bytes at a time`);
    await this.op(owner, id, path, async (a, p) => {
      const parent = p.slice(0, p.lastIndexOf('/'));
      if (parent) await a.mkdir(parent);
      await a.writeFile(p, data, 0o644);
    });
  }

  async remove(owner: string, id: string, path: string): Promise<void> {
    await this.op(owner, id, path, (a, p) => a.removeFile(p));
  }

  async list(owner: string, id: string, path: string): Promise<DirEntry[]> {
    return this.op(owner, id, path, (a, p) => a.listDir(p));
  }

  async mkdir(owner: string, id: string, path: string): Promise<void> {
    await this.op(owner, id, path, (a, p) => a.mkdir(p));
  }
}
