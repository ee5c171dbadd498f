import type { Logger } from 'pino';
import { AgentError } from '../engine/agent/client.js';
import { ENOENT, type DirEntry } from '../engine/agent/protocol.js';
import { InvalidRequestError, NotFoundError, PayloadTooLargeError } from './errors.js';
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

  private sandbox(owner: string, id: string) {
    return this.instances.sandbox(owner, id);
  }

  private failed(err: unknown, path: string): Error {
    if (err instanceof AgentError) {
      if (err.errno === ENOENT) return new NotFoundError('file', path);
      return new InvalidRequestError(`${path}: ${err.message}`, { path, errno: err.errno });
    }
    this.log.error({ err, path }, 'file operation failed');
    return err as Error;
  }

  async read(owner: string, id: string, path: string): Promise<Buffer> {
    const sb = this.sandbox(owner, id);
    try {
      const file = await sb.call((a) => a.readFile(this.path(path), MAX_FILE_BYTES));
      if (!file) throw new NotFoundError('file', path);
      if (file.truncated) throw new PayloadTooLargeError(`${path} is larger than ${MAX_FILE_BYTES} bytes`);
      return file.data;
    } catch (err) {
      throw this.failed(err, path);
    }
  }

  async write(owner: string, id: string, path: string, data: Buffer): Promise<void> {
    if (data.length > MAX_FILE_BYTES) throw new PayloadTooLargeError(`files are written up to ${MAX_FILE_BYTES} bytes at a time`);
    const sb = this.sandbox(owner, id);
    try {
      const p = this.path(path);
      const parent = p.slice(0, p.lastIndexOf('/'));
      if (parent) await sb.call((a) => a.mkdir(parent));
      await sb.call((a) => a.writeFile(p, data, 0o644));
    } catch (err) {
      throw this.failed(err, path);
    }
  }

  async remove(owner: string, id: string, path: string): Promise<void> {
    const sb = this.sandbox(owner, id);
    try {
      await sb.call((a) => a.removeFile(this.path(path)));
    } catch (err) {
      throw this.failed(err, path);
    }
  }

  async list(owner: string, id: string, path: string): Promise<DirEntry[]> {
    const sb = this.sandbox(owner, id);
    try {
      return await sb.call((a) => a.listDir(this.path(path)));
    } catch (err) {
      throw this.failed(err, path);
    }
  }

  async mkdir(owner: string, id: string, path: string): Promise<void> {
    const sb = this.sandbox(owner, id);
    try {
      await sb.call((a) => a.mkdir(this.path(path)));
    } catch (err) {
      throw this.failed(err, path);
    }
  }
}
