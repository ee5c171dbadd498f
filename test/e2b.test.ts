import { CommandExitError, Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';
import { until } from './helpers/wait.js';

let s: TestServer;
beforeAll(async () => {
  s = await startServer();
  // The SDK is pointed at forkpoint by its three environment variables and nothing else.
  process.env.E2B_API_URL = s.url;
  process.env.E2B_SANDBOX_URL = s.url;
  process.env.E2B_API_KEY = s.token;
});
afterAll(async () => {
  delete process.env.E2B_API_URL;
  delete process.env.E2B_SANDBOX_URL;
  delete process.env.E2B_API_KEY;
  await s?.close();
});

describe('the published e2b SDK, unchanged', () => {
  it('creates a sandbox, runs commands (output, exit errors, streaming) and kills it', async () => {
    const sbx = await Sandbox.create();
    expect(sbx.sandboxId).toMatch(/^inst_/);
    const r = await sbx.commands.run('echo hi');
    expect(r.stdout).toBe('hi\n');
    expect(r.exitCode).toBe(0);
    const failed = await sbx.commands.run('echo oops >&2; exit 3').catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(CommandExitError);
    expect((failed as CommandExitError).exitCode).toBe(3);
    expect((failed as CommandExitError).stderr).toBe('oops\n');
    const lines: string[] = [];
    await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => void lines.push(d) });
    expect(lines.join('')).toBe('line1\nline2\nline3\n');
    expect(await sbx.isRunning()).toBe(true);
    await sbx.kill();
    expect((await s.api('GET', `/instances/${sbx.sandboxId}`)).status).toBe(404);
  });

  it('files: write, read, list, exists, makeDir, remove', async () => {
    const sbx = await Sandbox.create();
    await sbx.files.write('/tmp/a.txt', 'hello file');
    expect(await sbx.files.read('/tmp/a.txt')).toBe('hello file');
    await sbx.files.write('notes.txt', 'in the home');
    expect((await sbx.commands.run('cat /home/user/notes.txt')).stdout).toBe('in the home');
    expect(await sbx.files.exists('/tmp/a.txt')).toBe(true);
    expect(await sbx.files.exists('/tmp/nope')).toBe(false);
    expect(await sbx.files.makeDir('/tmp/d/e')).toBe(true);
    expect(await sbx.files.makeDir('/tmp/d/e')).toBe(false);
    const names = (await sbx.files.list('/tmp')).map((e) => e.name).sort();
    expect(names).toEqual(expect.arrayContaining(['a.txt', 'd']));
    await sbx.files.remove('/tmp/d');
    expect(await sbx.files.exists('/tmp/d')).toBe(false);
    await sbx.kill();
  });

  it('a background command: commands.list, sendStdin, kill', async () => {
    const sbx = await Sandbox.create();
    const out: string[] = [];
    const h = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => void out.push(d) });
    expect((await sbx.commands.list()).map((p) => p.pid)).toContain(h.pid);
    await sbx.commands.sendStdin(h.pid, 'typed\n');
    await until('the echo', () => out.join('').includes('typed'));
    expect(await sbx.commands.kill(h.pid)).toBe(true);
    await until('gone from the list', async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid));
    await sbx.kill();
  });
});
