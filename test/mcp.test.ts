import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';

/** forkpoint's MCP server, driven by the MCP SDK's own client over stdio (`forkpoint mcp`) and
 * over streamable HTTP (`/mcp`). */
const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
let s: TestServer;
beforeAll(async () => {
  s = await startServer();
});
afterAll(async () => s?.close());

const transports: Record<string, () => Transport> = {
  stdio: () => new StdioClientTransport({ command: process.execPath, args: [CLI, 'mcp'], env: { ...(process.env as Record<string, string>), FORKPOINT_URL: s.url, FORKPOINT_TOKEN: s.token }, stderr: 'inherit' }),
  http: () => new StreamableHTTPClientTransport(new URL(`${s.url}/mcp`), { requestInit: { headers: { authorization: `Bearer ${s.token}` } } }),
};

async function connected(kind: string): Promise<Client> {
  const client = new Client({ name: 'forkpoint-test', version: '1.0.0' });
  await client.connect(transports[kind]!());
  return client;
}

/** A tool's answer: its JSON text parsed (or the text), and whether it is an error. */
async function call(client: Client, name: string, args: Record<string, unknown>): Promise<{ value: any; isError: boolean }> {
  const r = (await client.callTool({ name, arguments: args })) as { content: { type: string; text: string }[]; isError?: boolean };
  const textOf = r.content[0]?.text ?? '';
  let value: unknown = textOf;
  try {
    value = JSON.parse(textOf);
  } catch {
    // plain text
  }
  return { value, isError: r.isError === true };
}

describe.each(['stdio', 'http'])('the MCP server over %s', (kind) => {
  it('lists its tools; creates, runs, writes and reads, checkpoints, rolls back and forks', async () => {
    const client = await connected(kind);
    try {
      const tools = (await client.listTools()).tools.map((t) => t.name).sort();
      expect(tools).toEqual(['checkpoint', 'create_sandbox', 'delete_sandbox', 'fork', 'list_checkpoints', 'list_sandboxes', 'process_output', 'read_file', 'rollback', 'run_command', 'start_process', 'stop_process', 'try_command', 'write_file']);
      const inst = (await call(client, 'create_sandbox', { name: `mcp-${kind}` })).value as { id: string };
      expect(inst.id).toMatch(/^inst_/);
      expect((await call(client, 'run_command', { id: inst.id, command: 'echo hi; exit 3' })).value).toMatchObject({ exit_code: 3, stdout: 'hi\n' });
      await call(client, 'write_file', { id: inst.id, path: '/root/note', content: 'first' });
      expect((await call(client, 'read_file', { id: inst.id, path: '/root/note' })).value).toBe('first');
      const ck = (await call(client, 'checkpoint', { id: inst.id, label: 'one' })).value as { id: string; status: string };
      expect(ck.status).toBe('ready');
      await call(client, 'write_file', { id: inst.id, path: '/root/note', content: 'second' });
      await call(client, 'rollback', { id: inst.id, checkpoint_id: ck.id });
      expect((await call(client, 'read_file', { id: inst.id, path: '/root/note' })).value).toBe('first');
      const fork = (await call(client, 'fork', { id: inst.id, checkpoint_id: ck.id })).value as { id: string };
      expect((await call(client, 'run_command', { id: fork.id, command: 'cat /root/note' })).value).toMatchObject({ stdout: 'first' });
      expect(((await call(client, 'list_sandboxes', {})).value as { id: string }[]).map((i) => i.id)).toEqual(expect.arrayContaining([inst.id, fork.id]));
      // A background process: started, read while it runs, stopped.
      const bg = (await call(client, 'start_process', { id: inst.id, command: 'echo up; exec sleep 600' })).value as { exec_id: string };
      expect(bg.exec_id).toMatch(/^exec_[0-9a-f]{8}$/);
      let out: { status: string; stdout: string; exit_code: number | null } = { status: '', stdout: '', exit_code: null };
      const pause = () => new Promise((r) => setTimeout(r, 100));
      for (let i = 0; i < 100 && out.stdout !== 'up\n'; i++, await pause()) out = (await call(client, 'process_output', { id: inst.id, exec_id: bg.exec_id })).value;
      expect(out).toMatchObject({ status: 'running', stdout: 'up\n', exit_code: null });
      await call(client, 'stop_process', { id: inst.id, exec_id: bg.exec_id });
      for (let i = 0; i < 100 && out.status === 'running'; i++, await pause()) out = (await call(client, 'process_output', { id: inst.id, exec_id: bg.exec_id })).value;
      expect(out).toMatchObject({ status: 'exited', exit_code: 143 });
      // An error is the tool's, with the server's code: the agent reads why.
      const missing = await call(client, 'run_command', { id: 'inst_nosuchsandbox', command: 'true' });
      expect(missing.isError).toBe(true);
      expect(String(missing.value)).toMatch(/NOT_FOUND/);
      await call(client, 'delete_sandbox', { id: fork.id });
      await call(client, 'delete_sandbox', { id: inst.id });
    } finally {
      await client.close();
    }
  });

  it('read_file of a file of any size hands its first MiB and lets the rest go', async () => {
    const client = await connected(kind);
    try {
      const { id } = (await call(client, 'create_sandbox', {})).value as { id: string };
      // 64 GiB that take no disk: read whole, it would not fit in any buffer of the server or
      // the CLI (the tool answered with an error, or not at all, before it was bounded).
      await call(client, 'run_command', { id, command: 'truncate -s 64G /root/huge' });
      const r = await call(client, 'read_file', { id, path: '/root/huge' });
      expect(r.isError, String(r.value)).toBe(false);
      expect(String(r.value)).toMatch(/\n\[cut at 1048576 bytes\]$/);
      expect(String(r.value).length).toBe((1 << 20) + '\n[cut at 1048576 bytes]'.length);
      // Nothing in the sandbox still has the file open for a reader that went away (bounded wait).
      const open = async () => (await call(client, 'run_command', { id, command: "ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c /root/huge || true" })).value.stdout.trim();
      await expect.poll(open, { timeout: 10_000, interval: 250 }).toBe('0');
      await call(client, 'delete_sandbox', { id });
    } finally {
      await client.close();
    }
  });

  it('try_command rolls back by itself after a failing command or check, and keeps what a succeeding one did', async () => {
    const client = await connected(kind);
    try {
      const { id } = (await call(client, 'create_sandbox', {})).value as { id: string };
      await call(client, 'write_file', { id, path: '/root/app.conf', content: 'good' });
      await call(client, 'write_file', { id, path: '/root/keep', content: 'kept' });
      const failed = (await call(client, 'try_command', { id, command: 'echo broken > /root/app.conf; rm -f /root/keep; exit 1' })).value;
      expect(failed).toMatchObject({ kept: false, command: { exit_code: 1 } });
      expect(failed.rolled_back_to).toMatch(/^ckpt_/);
      expect((await call(client, 'read_file', { id, path: '/root/app.conf' })).value).toBe('good');
      expect((await call(client, 'run_command', { id, command: 'cat /root/keep' })).value).toMatchObject({ stdout: 'kept' });
      // The command succeeds, its check does not: rolled back too.
      const unchecked = (await call(client, 'try_command', { id, command: 'echo half > /root/app.conf', check: 'grep -q whole /root/app.conf' })).value;
      expect(unchecked).toMatchObject({ kept: false, command: { exit_code: 0 }, check: { exit_code: 1 } });
      expect((await call(client, 'read_file', { id, path: '/root/app.conf' })).value).toBe('good');
      const kept = (await call(client, 'try_command', { id, command: 'echo better > /root/app.conf', check: 'grep -q better /root/app.conf' })).value;
      expect(kept).toMatchObject({ kept: true, rolled_back_to: null, check: { exit_code: 0 } });
      expect((await call(client, 'read_file', { id, path: '/root/app.conf' })).value).toBe('better\n');
      await call(client, 'delete_sandbox', { id });
    } finally {
      await client.close();
    }
  });
});

describe('the MCP endpoint', () => {
  it('needs an API token, and a tool acts only on its owner\'s sandboxes', async () => {
    const anonymous = new Client({ name: 'anonymous', version: '1.0.0' });
    await expect(anonymous.connect(new StreamableHTTPClientTransport(new URL(`${s.url}/mcp`)))).rejects.toThrow();
    const other = await s.fp.store.tokens.create('someone-else', 'mcp');
    const theirs = new Client({ name: 'other', version: '1.0.0' });
    await theirs.connect(new StreamableHTTPClientTransport(new URL(`${s.url}/mcp`), { requestInit: { headers: { authorization: `Bearer ${other.token}` } } }));
    try {
      const mine = (await s.api('POST', '/instances', {})).body as { id: string };
      const r = await call(theirs, 'run_command', { id: mine.id, command: 'touch /root/theirs' });
      expect([r.isError, String(r.value)]).toEqual([true, expect.stringMatching(/NOT_FOUND/)]);
      expect((await s.exec(mine.id, { command: 'test -e /root/theirs || echo absent' })).stdout).toBe('absent\n');
    } finally {
      await theirs.close();
    }
  });
});
