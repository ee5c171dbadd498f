import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually, sleep, startServer, type TestServer } from './helpers/server.js';

let s: TestServer;
let id: string;
beforeAll(async () => {
  s = await startServer();
  id = (await s.instance({ name: 'exec-box', env: { GREETING: 'hello' } })).id;
});
afterAll(async () => s?.close());

describe('exec', () => {
  it('returns exit code and stdout and stderr apart', async () => {
    const r = await s.exec(id, { command: 'echo out; echo err >&2; exit 7' });
    expect(r).toMatchObject({ exit_code: 7, stdout: 'out\n', stderr: 'err\n', timed_out: false, truncated: false });
    expect(r.duration_ms).toBeGreaterThan(0);
  });

  it('runs an argv array without a shell', async () => {
    const r = await s.exec(id, { command: ['/bin/echo', '$HOME', 'a b'] });
    expect(r.stdout).toBe('$HOME a b\n');
  });

  it('uses cwd, the instance env and the request env', async () => {
    const r = await s.exec(id, { command: 'pwd; echo $GREETING $EXTRA', cwd: '/etc', env: { EXTRA: 'world' } });
    expect(r.stdout).toBe('/etc\nhello world\n');
  });

  it('feeds stdin', async () => {
    const r = await s.exec(id, { command: 'tr a-z A-Z', stdin: 'shout\n' });
    expect(r.stdout).toBe('SHOUT\n');
  });

  it('attack: a command that does not read its stdin holds up nothing else; another exec answers meanwhile, and the input arrives whole, in order, once read', async () => {
    // 6 MiB: many times what a pipe holds, so the agent keeps the rest until the command reads.
    const input = Array.from({ length: 6 * 1024 }, (_, i) => `${String(i).padStart(1023, '.')}\n`).join('');
    const expected = createHash('sha256').update(input).digest('hex');
    let slowDone = false;
    const slow = s.exec(id, { command: 'touch /tmp/started; while [ ! -e /tmp/read-now ]; do sleep 0.05; done; sha256sum | cut -d" " -f1', stdin: input, timeout_ms: 60_000 }).finally(() => (slowDone = true));
    // Started, its input sent after its start: an agent that waited on it would answer no more.
    await eventually(async () => (await s.exec(id, { command: 'test -e /tmp/started && echo yes', timeout_ms: 10_000 })).stdout === 'yes\n');
    const other = await s.exec(id, { command: 'echo other', timeout_ms: 10_000 });
    expect([other.exit_code, other.stdout, other.timed_out]).toEqual([0, 'other\n', false]);
    expect(slowDone, 'the other exec waited for the command that does not read').toBe(false);
    await s.exec(id, { command: 'touch /tmp/read-now' });
    const r = await slow;
    expect([r.exit_code, r.stdout]).toEqual([0, `${expected}\n`]);
  });

  it('attack: a FIFO (with or without a reader) or a device where the engine writes a whole file is refused at once, not waited on: the agent answers on', async () => {
    await s.exec(id, { command: 'mkfifo /root/no-reader /root/read-held; (exec 3</root/read-held; sleep 30) >/dev/null 2>&1 & sleep 0.2' });
    const sb = s.engine.sandbox(id)!;
    for (const path of ['/root/no-reader', '/root/read-held', '/dev/null']) {
      await expect(sb.call((a) => a.writeFile(path, Buffer.from('x'))), path).rejects.toThrow();
      await expect(sb.call((a) => a.writeAt(path, 0, Buffer.from('x'), { truncate: true, mode: 0o644 })), path).rejects.toThrow();
    }
    expect((await s.exec(id, { command: 'echo still; pkill -f "sleep 30"; rm /root/no-reader /root/read-held', timeout_ms: 10_000 })).stdout).toBe('still\n');
  });

  it('runs as a user of the sandbox, by name or uid (Docker\'s exec --user); an unknown one is a 400 and runs nothing', async () => {
    const r = await s.exec(id, { command: 'id -u; id -g; echo $HOME $USER; touch /tmp/by-nobody; stat -c %u /tmp/by-nobody; touch /root/x', user: 'nobody' });
    expect(r.stdout).toBe('65534\n65534\n/nonexistent nobody\n65534\n');
    expect(r.stderr).toMatch(/Permission denied/);
    expect((await s.exec(id, { command: 'id -u', user: '4242' })).stdout).toBe('4242\n');
    const bg = (await s.api('POST', `/instances/${id}/processes`, { command: 'id -u > /tmp/bg-uid', user: 'nobody' })).body;
    expect(bg.pid).toBeGreaterThan(0);
    await eventually(async () => (await s.exec(id, { command: 'cat /tmp/bg-uid' })).stdout === '65534\n');
    const unknown = await s.api('POST', `/instances/${id}/exec`, { command: 'touch /tmp/ran', user: 'ghost' });
    expect(unknown.status).toBe(400);
    expect(unknown.body.error).toMatchObject({ code: 'INVALID_REQUEST', details: { reason: 'UNKNOWN_USER', user: 'ghost' } });
    expect((await s.exec(id, { command: 'test -e /tmp/ran || echo absent' })).stdout).toBe('absent\n');
    expect((await s.api('POST', `/instances/${id}/exec`, { command: 'true', user: 'a:b' })).status).toBe(400);
  });

  it('a missing program is exit code 127 with a message', async () => {
    const r = await s.exec(id, { command: ['/no/such/program'] });
    expect(r.exit_code).toBe(127);
    expect(r.stderr).toMatch(/No such file/);
  });

  it('on timeout kills the whole process group, children included', async () => {
    const r = await s.exec(id, { command: 'sleep 101 & sleep 102; echo never', timeout_ms: 300 });
    expect(r.timed_out).toBe(true);
    expect(r.stdout).toBe('');
    expect(r.duration_ms).toBeLessThan(5000);
    const ps = await s.exec(id, { command: 'ps -o args' });
    expect(ps.stdout).not.toMatch(/sleep 10[12]/);
  });

  it('a client that goes away stops the command it alone waited for: plain and in a session', async () => {
    for (const [tag, extra] of [['103', {}], ['104', { session: 'gone' }]] as const) {
      const controller = new AbortController();
      const call = request(`${s.url}/instances/${id}/exec`, {
        method: 'POST',
        headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ command: `sleep ${tag}`, timeout_ms: 120_000, ...extra }),
        signal: controller.signal,
      });
      call.catch(() => {});
      await eventually(async () => /sleep 10[34]/.test((await s.exec(id, { command: 'ps -o args' })).stdout));
      controller.abort();
      // Gone with its client, not at its two-minute timeout.
      await eventually(async () => !new RegExp(`sleep ${tag}`).test((await s.exec(id, { command: 'ps -o args' })).stdout), 10_000);
    }
    // A session whose command was stopped runs the next one.
    expect((await s.exec(id, { command: 'echo still', session: 'gone' })).stdout).toBe('still\n');
    expect((await s.api('DELETE', `/instances/${id}/sessions/gone`)).status).toBe(204);
  });

  it('truncates output over the limit and says so', async () => {
    const r = await s.exec(id, { command: 'head -c 100000 /dev/zero | tr "\\0" x', max_output_bytes: 1000 });
    expect(r.truncated).toBe(true);
    expect(r.stdout.length).toBe(1000);
    const small = await s.exec(id, { command: 'echo ok', max_output_bytes: 1000 });
    expect(small.truncated).toBe(false);
  });

  it('passes large output whole under the limit', async () => {
    const r = await s.exec(id, { command: 'head -c 3000000 /dev/zero | tr "\\0" y', max_output_bytes: 4_000_000 });
    expect(r.stdout.length).toBe(3_000_000);
    expect(r.truncated).toBe(false);
  });
});

describe('shell sessions', () => {
  it('keeps cd and export between calls, with stdout and stderr apart', async () => {
    await s.exec(id, { command: 'cd /tmp && export COLOR=blue && X=local', session: 'main' });
    const r = await s.exec(id, { command: 'pwd; echo $COLOR $X; echo e >&2; false', session: 'main' });
    expect(r).toMatchObject({ stdout: '/tmp\nblue local\n', stderr: 'e\n', exit_code: 1 });
  });

  it('sessions are separate from each other', async () => {
    const r = await s.exec(id, { command: 'pwd; echo "[$COLOR]"', session: 'other' });
    expect(r.stdout).toBe('/root\n[]\n');
    const list = await s.api('GET', `/instances/${id}/sessions`);
    expect(list.body.items.map((x: { name: string }) => x.name).sort()).toEqual(['main', 'other']);
  });

  it('a session command that runs too long is interrupted and the shell lives on', async () => {
    const r = await s.exec(id, { command: 'sleep 30', session: 'main', timeout_ms: 300 });
    expect(r.timed_out).toBe(true);
    const after = await s.exec(id, { command: 'echo $COLOR', session: 'main' });
    expect(after.stdout).toBe('blue\n');
  });

  it('feeds stdin to a session command', async () => {
    const r = await s.exec(id, { command: 'read line; echo "got $line"', session: 'main', stdin: 'abc\n' });
    expect(r.stdout).toBe('got abc\n');
  });

  it('closing a session ends its shell', async () => {
    expect((await s.api('DELETE', `/instances/${id}/sessions/other`)).status).toBe(204);
    const r = await s.exec(id, { command: 'echo "[$COLOR]"', session: 'other' });
    expect(r.stdout).toBe('[]\n');
  });
});

describe('background processes', () => {
  it('keep running and writing while no client is attached; output is read later by offset', async () => {
    const start = await s.api('POST', `/instances/${id}/processes`, {
      // The count is renamed into place: a reader never finds it truncated and not yet written.
      command: 'i=0; while true; do i=$((i+1)); echo "tick $i"; echo $i > /tmp/bg-count.new; mv /tmp/bg-count.new /tmp/bg-count; sleep 0.05; done',
    });
    expect(start.status).toBe(201);
    const pid = start.body.process_id;
    await sleep(600);
    const first = await s.api('GET', `/instances/${id}/processes/${pid}/output`);
    expect(first.body.stdout).toMatch(/^tick 1\ntick 2\n/);
    const n1 = Number((await s.exec(id, { command: 'cat /tmp/bg-count' })).stdout);
    expect(n1).toBeGreaterThan(3);
    await sleep(400);
    const next = await s.api('GET', `/instances/${id}/processes/${pid}/output?stdout_offset=${first.body.stdout_offset}`);
    expect(next.body.stdout).toMatch(/^tick \d+\n/);
    expect(next.body.stdout).not.toContain('tick 1\n');
    const list = await s.api('GET', `/instances/${id}/processes`);
    expect(list.body.items.find((p: { process_id: number }) => p.process_id === pid).status).toBe('running');
    expect((await s.api('POST', `/instances/${id}/processes/${pid}/signal`, { signal: 9 })).status).toBe(204);
    await eventually(async () => (await s.api('GET', `/instances/${id}/processes/${pid}`)).body.status === 'exited');
    expect((await s.api('DELETE', `/instances/${id}/processes/${pid}`)).status).toBe(204);
    expect((await s.api('GET', `/instances/${id}/processes/${pid}`)).status).toBe(404);
  });

  it('the agent inside the sandbox stays small', async () => {
    const sb = s.engine.sandbox(id)!;
    const status = await readFile(`/proc/${sb.pid}/status`, 'utf8');
    const rssKb = Number(/VmRSS:\s+(\d+)/.exec(status)![1]);
    expect(rssKb).toBeLessThan(8 * 1024);
  });
});
