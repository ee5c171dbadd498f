import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { VERSION } from '../version.js';

/**
 * forkpoint's tools for agents (MCP), over its REST API: `forkpoint mcp` speaks it over HTTP to
 * a server, `/mcp` in process (app.inject) with the caller's own token. Either way every call is
 * checked by the API as any client's is.
 */
export interface RestPort {
  /** A call answered in JSON; an error answer is thrown with its code and message. */
  json<T = unknown>(method: 'GET' | 'POST' | 'PUT' | 'DELETE', path: string, body?: unknown): Promise<T>;
  /** A file's bytes as they come; the reader stops (and the stream is let go) when it has read enough. */
  readBytes(path: string): Promise<AsyncIterable<Uint8Array>>;
  writeText(path: string, text: string): Promise<void>;
}

interface ExecResult {
  exit_code: number;
  stdout: string;
  stderr: string;
  timed_out: boolean;
  truncated: boolean;
}
interface Checkpoint {
  id: string;
  status: string;
  error: string | null;
}

const Id = z.string().regex(/^inst_[a-z0-9]+$/).describe('the sandbox (instance) id, inst_...');
const CheckpointId = z.string().regex(/^ckpt_[a-z0-9]+$/).describe('a checkpoint id, ckpt_...');
const Command = z.string().min(1).max(1 << 16).describe('a shell command, run by /bin/sh -c');
const ExecId = z.string().regex(/^exec_[0-9a-f]{8}$/).describe('a background process (execution) id, exec_...');
const enc = encodeURIComponent;
const text = (v: unknown) => ({ content: [{ type: 'text' as const, text: typeof v === 'string' ? v : JSON.stringify(v, null, 2) }] });

/** The most of a file read_file hands an agent: a file in a sandbox may be of any size. */
export const MAX_READ = 1 << 20;

/** The text of at most `max` bytes of a stream; reading stops there, and says it was cut. */
export async function readBounded(bytes: AsyncIterable<Uint8Array>, max: number): Promise<string> {
  const parts: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of bytes) {
    parts.push(chunk);
    size += chunk.length;
    // Leaving the loop ends the stream (its iterator's return): the rest is never read.
    if (size > max) break;
  }
  const all = Buffer.concat(parts);
  return all.length > max ? `${all.subarray(0, max).toString('utf8')}\n[cut at ${max} bytes]` : all.toString('utf8');
}

export function forkpointMcpServer(rest: RestPort): McpServer {
  const server = new McpServer({ name: 'forkpoint', version: VERSION });
  const run = (id: string, command: string, opts: { cwd?: string | undefined; timeout_ms?: number | undefined; user?: string | undefined }) =>
    rest.json<ExecResult>('POST', `/instances/${enc(id)}/exec`, { command, cwd: opts.cwd, timeout_ms: opts.timeout_ms, user: opts.user });
  const checkpoint = async (id: string, label: string | undefined, memory: boolean) => {
    const c = await rest.json<Checkpoint>('POST', `/instances/${enc(id)}/checkpoints?wait=true`, { label, memory });
    if (c.status !== 'ready') throw new Error(`checkpoint ${c.id} ${c.status}: ${c.error ?? ''}`);
    return c;
  };

  server.registerTool('list_sandboxes', { description: 'List your sandboxes (id, name, image, status)', inputSchema: {} }, async () => {
    const page = await rest.json<{ items: { id: string; name: string; image: string; status: string }[] }>('GET', '/instances?limit=100');
    return text(page.items.map(({ id, name, image, status }) => ({ id, name, image, status })));
  });
  server.registerTool(
    'create_sandbox',
    {
      description: 'Create an isolated Linux sandbox; answers its id',
      inputSchema: { name: z.string().optional(), image: z.string().optional().describe('default: the server\'s default; `debian` has apt, python3, node'), memory_mb: z.number().int().positive().optional(), env: z.record(z.string(), z.string()).optional() },
    },
    async (a) => text(await rest.json('POST', '/instances', { name: a.name, image: a.image, env: a.env, ...(a.memory_mb ? { limits: { memory_mb: a.memory_mb } } : {}) })),
  );
  server.registerTool('delete_sandbox', { description: 'Delete a sandbox and everything in it', inputSchema: { id: Id } }, async ({ id }) => {
    await rest.json('DELETE', `/instances/${enc(id)}`);
    return text(`deleted ${id}`);
  });
  server.registerTool(
    'run_command',
    {
      description: 'Run a shell command in a sandbox and wait for it: exit code, stdout, stderr',
      inputSchema: { id: Id, command: Command, cwd: z.string().optional(), timeout_ms: z.number().int().positive().max(3_600_000).optional(), user: z.string().optional() },
    },
    async (a) => text(await run(a.id, a.command, a)),
  );
  server.registerTool(
    'start_process',
    {
      description: 'Start a shell command in the background of a sandbox (a server, a watcher, a long build): it runs on with nobody waiting; answers its exec_id for process_output and stop_process',
      inputSchema: { id: Id, command: Command, cwd: z.string().optional(), user: z.string().optional() },
    },
    async (a) => text(await rest.json('POST', `/instances/${enc(a.id)}/processes`, { command: a.command, cwd: a.cwd, user: a.user })),
  );
  server.registerTool(
    'process_output',
    { description: 'A background process: whether it runs, its exit code, and what it printed (its last 256 KiB a stream)', inputSchema: { id: Id, exec_id: ExecId } },
    async ({ id, exec_id }) => {
      const e = await rest.json<{ status: string; exit_code: number | null; stdout: string; stderr: string; truncated: boolean }>('GET', `/instances/${enc(id)}/exec/${enc(exec_id)}`);
      return text({ status: e.status, exit_code: e.exit_code, stdout: e.stdout, stderr: e.stderr, truncated: e.truncated });
    },
  );
  server.registerTool('stop_process', { description: 'Stop a background process: SIGTERM to its whole process group, or SIGKILL with force', inputSchema: { id: Id, exec_id: ExecId, force: z.boolean().optional() } }, async ({ id, exec_id, force }) => {
    await rest.json('POST', `/instances/${enc(id)}/exec/${enc(exec_id)}/kill`, { signal: force ? 9 : 15 });
    return text(`signalled ${exec_id}`);
  });
  server.registerTool('read_file', { description: `Read a text file of a sandbox (its first ${MAX_READ / 1024} KiB; run_command with tail or sed reads further)`, inputSchema: { id: Id, path: z.string().startsWith('/') } }, async ({ id, path }) =>
    text(await readBounded(await rest.readBytes(`/instances/${enc(id)}/files?path=${enc(path)}`), MAX_READ)),
  );
  server.registerTool('write_file', { description: 'Write a text file in a sandbox (its directories made)', inputSchema: { id: Id, path: z.string().startsWith('/'), content: z.string() } }, async ({ id, path, content }) => {
    await rest.writeText(`/instances/${enc(id)}/files?path=${enc(path)}`, content);
    return text(`wrote ${Buffer.byteLength(content)} bytes to ${path}`);
  });
  server.registerTool(
    'checkpoint',
    { description: 'Checkpoint a sandbox: its files, and (memory: true, the default) its memory and running processes; answers once ready', inputSchema: { id: Id, label: z.string().optional(), memory: z.boolean().optional() } },
    async (a) => text(await checkpoint(a.id, a.label, a.memory ?? true)),
  );
  server.registerTool('list_checkpoints', { description: 'A sandbox\'s checkpoints', inputSchema: { id: Id } }, async ({ id }) => text((await rest.json<{ items: unknown[] }>('GET', `/instances/${enc(id)}/checkpoints`)).items));
  server.registerTool('rollback', { description: 'Roll a sandbox back to a checkpoint, in place: files, and processes for a memory checkpoint', inputSchema: { id: Id, checkpoint_id: CheckpointId } }, async ({ id, checkpoint_id }) =>
    text(await rest.json('POST', `/instances/${enc(id)}/rollback`, { checkpoint_id })),
  );
  server.registerTool(
    'fork',
    { description: 'Fork new sandboxes from a checkpoint (or from now): each a copy with its own id, processes running', inputSchema: { id: Id, checkpoint_id: CheckpointId.optional(), count: z.number().int().min(1).max(16).optional() } },
    async (a) => text(await rest.json('POST', `/instances/${enc(a.id)}/fork`, { checkpoint_id: a.checkpoint_id, ...(a.count && a.count > 1 ? { count: a.count } : {}) })),
  );
  server.registerTool(
    'try_command',
    {
      description:
        'Run a command under a checkpoint, and roll back by itself if it fails: its exit code is not 0, or the check command (run after it) exits non-zero. ' +
        'Answers what happened: whether the changes were kept, the outputs, and the checkpoint to roll back to later.',
      inputSchema: { id: Id, command: Command, check: Command.optional().describe('run after the command; a non-zero exit counts as a failure'), timeout_ms: z.number().int().positive().max(3_600_000).optional(), user: z.string().optional() },
    },
    async (a) => {
      const before = await checkpoint(a.id, 'before try_command', true);
      const result = await run(a.id, a.command, a);
      const check = result.exit_code === 0 && a.check ? await run(a.id, a.check, a) : undefined;
      const failed = result.exit_code !== 0 || (check !== undefined && check.exit_code !== 0);
      if (failed) await rest.json('POST', `/instances/${enc(a.id)}/rollback`, { checkpoint_id: before.id });
      return text({ kept: !failed, rolled_back_to: failed ? before.id : null, checkpoint_id: before.id, command: result, ...(check ? { check } : {}) });
    },
  );
  return server;
}
