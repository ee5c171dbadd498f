/**
 * Directory watches (envd's watchDir, issue 23), on the real engine: the agent watches inside
 * the sandbox's own root with inotify and ends its watches before every dump. The attacks come
 * from inside the sandbox, speaking to its own agent.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildAttackKit, installKit, KIT, type AttackKit } from './helpers/attack-kit.js';
import { eventually, startServer, type TestServer } from './helpers/server.js';
import { openSse, type SseClient } from './helpers/sse.js';
import { until } from './helpers/wait.js';
import { WATCHER } from './helpers/watcher.js';

let s: TestServer;
let kit: Promise<AttackKit>;
beforeAll(async () => {
  kit = buildAttackKit();
  s = await startServer();
});
afterAll(async () => {
  await s?.close();
  await (await kit).cleanup();
});

const watch = (id: string, path: string, recursive = true) =>
  openSse(`${s.url}/instances/${id}/files/watch?path=${encodeURIComponent(path)}&recursive=${recursive}`, { headers: { authorization: `Bearer ${s.token}` } });

/** Reads events into `seen` ("op name") until the stream ends. */
function collect(sse: SseClient): { seen: string[]; done: Promise<void> } {
  const seen: string[] = [];
  const done = (async () => {
    for (;;) {
      const e = await sse.next(120_000);
      if (!e) return;
      seen.push(e.event === 'error' ? `error ${e.data.code}` : `${e.event} ${e.data.name ?? e.data.path}`);
    }
  })();
  return { seen, done };
}

const checkpoint = async (id: string) => {
  const r = await s.api('POST', `/instances/${id}/checkpoints?wait=true`, {});
  if (r.status !== 200 || r.body.status !== 'ready') throw new Error(`checkpoint: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
};

describe('directory watches', () => {
  it('tells each change as it happens, below a recursive watch too; goes on through a checkpoint and a rollback; ends when the instance stops', async () => {
    const inst = await s.instance();
    await s.exec(inst.id, { command: 'mkdir -p /w/sub' });
    const sse = await watch(inst.id, '/w');
    expect(sse.status).toBe(200);
    const { seen, done } = collect(sse);
    await until('the watch in place', () => seen.includes('watching /w'));
    const step = async (command: string, ...expected: string[]) => {
      await s.exec(inst.id, { command });
      await until(`${expected.join(', ')} after \`${command}\` (seen: ${seen.join('; ')})`, () => expected.every((e) => seen.includes(e)), 10_000);
    };
    await step('mkdir /w/sub/new', 'create sub/new');
    await step('echo x > /w/sub/new/f', 'create sub/new/f', 'write sub/new/f');
    await step('chmod 600 /w/sub/new/f', 'chmod sub/new/f');
    await step('mv /w/sub/new/f /w/g', 'rename sub/new/f', 'create g');
    await step('rm /w/g', 'remove g');
    const ck = await checkpoint(inst.id);
    await step('touch /w/after-checkpoint', 'create after-checkpoint');
    const rolled = await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id });
    expect(rolled.status).toBe(200);
    await step('touch /w/after-rollback', 'create after-rollback');
    // A file written through the API is streamed into a temporary name and renamed over its
    // own: the watch tells it as envd tells its write in place (open with O_CREAT, chown,
    // write), and nothing of the temporary name.
    const put = (body: string) => s.api('PUT', `/instances/${inst.id}/files?path=/w/sub/api.txt`, body, { authorization: `Bearer ${s.token}`, 'content-type': 'application/octet-stream' });
    expect((await put('bytes')).status).toBeLessThan(300);
    await until('the API write', () => seen.includes('write sub/api.txt'));
    expect((await put('again')).status).toBeLessThan(300);
    await until('the second API write', () => seen.filter((e) => e === 'write sub/api.txt').length === 2);
    expect(seen.filter((e) => e.endsWith(' sub/api.txt'))).toEqual(['create sub/api.txt', 'chmod sub/api.txt', 'write sub/api.txt', 'chmod sub/api.txt', 'write sub/api.txt']);
    expect(seen.filter((e) => e.includes('.upload-'))).toEqual([]);
    expect((await s.api('POST', `/instances/${inst.id}/stop`)).status).toBe(200);
    await done;
    expect(seen.at(-1)).toBe('error CONFLICT');
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('refuses a missing directory (404) and a file (400), and says what', async () => {
    const inst = await s.instance();
    await s.exec(inst.id, { command: 'echo > /tmp/file' });
    for (const [path, status] of [['/nowhere', 404], ['/tmp/file', 400]] as const) {
      const sse = await watch(inst.id, path);
      expect(sse.status, path).toBe(status);
      expect(JSON.parse(await sse.text()).error.code, path).toBe(status === 404 ? 'NOT_FOUND' : 'INVALID_REQUEST');
    }
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('attack: the sandbox cannot take its agent\'s watches (its own connection to the agent is refused); the API\'s are bounded (a 17th is 429 with a code); a checkpoint still works, and the API watches after it; a tree past the sandbox\'s inotify bound is a 429 too', async () => {
    const inst = await s.instance();
    await installKit(s, inst.id, await kit);
    await s.exec(inst.id, { command: 'mkdir -p /w && cd /w && seq 1 1500 | xargs mkdir' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: `${KIT} hogwatches /w > /tmp/hog.out` });
    await until('the hog done', async () => /granted \d+/.test((await s.exec(inst.id, { command: 'cat /tmp/hog.out' })).stdout), 20_000);
    expect((await s.exec(inst.id, { command: 'cat /tmp/hog.out' })).stdout).toBe('granted 0\n');
    // The API's own watches: 16 at once, each over 1501 directories; the 17th is refused.
    const held = await Promise.all(Array.from({ length: 16 }, () => watch(inst.id, '/w')));
    try {
      expect(held.map((w) => w.status)).toEqual(Array(16).fill(200));
      const refused = await watch(inst.id, '/w');
      expect(refused.status).toBe(429);
      expect(JSON.parse(await refused.text()).error).toMatchObject({ code: 'QUOTA_EXCEEDED', details: { reason: 'WATCH_LIMIT' } });
    } finally {
      for (const w of held) w.close();
    }
    await checkpoint(inst.id);
    const sse = await eventually(async () => {
      const w = await watch(inst.id, '/w');
      if (w.status === 200) return w;
      w.close(); // the closed watches' slots are given back as their streams end
      return undefined;
    });
    const { seen } = collect(sse);
    await s.exec(inst.id, { command: 'touch /w/1/deep' });
    await until('an event below a bounded recursive watch', () => seen.includes('create 1/deep'));
    sse.close();
    // 16 × 1501 directories fit the sandbox's own inotify bound (65536 watches); one tree of
    // more does not, and the watch says so instead of leaving some of it unwatched.
    await s.exec(inst.id, { command: 'mkdir -p /big && cd /big && seq 1 66000 | xargs mkdir' });
    const big = await watch(inst.id, '/big');
    expect(big.status).toBe(429);
    expect(JSON.parse(await big.text()).error).toMatchObject({ code: 'QUOTA_EXCEEDED', details: { reason: 'WATCH_TOO_MANY_DIRECTORIES' } });
    expect((await s.exec(inst.id, { command: 'echo still here' })).stdout).toBe('still here\n');
    await s.api('DELETE', `/instances/${inst.id}`);
  });
});

describe('a sandbox\'s own inotify watches (a dev server\'s way of watching its files)', () => {
  const events = async (id: string) => (await s.exec(id, { command: 'cat /tmp/events' })).stdout as string;
  const seen = (id: string, name: string) => until(`${name} seen by the watcher`, async () => (await events(id)).includes(` ${name}\n`), 10_000);

  it('are checkpointed (they failed it: CRIU found no path for a watched inode on the overlay), and watch on after a rollback and in a fork, in the upper and in the image', async () => {
    const inst = await s.instance({ image: 'debian' });
    expect((await s.api('PUT', `/instances/${inst.id}/files?path=/opt/watcher.py`, WATCHER, { authorization: `Bearer ${s.token}`, 'content-type': 'application/octet-stream' })).status).toBeLessThan(300);
    await s.exec(inst.id, { command: 'mkdir -p /root/proj/src' });
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'python3 /opt/watcher.py /root/proj /root/proj/src /etc' });
    await until('the watcher', async () => (await events(inst.id)).includes('watching'), 10_000);
    const ck = await checkpoint(inst.id);
    await s.exec(inst.id, { command: 'touch /root/proj/after-checkpoint /etc/after-checkpoint' });
    await seen(inst.id, 'after-checkpoint');
    // Seen by the watch of /root/proj (wd 1, the upper's) and by that of /etc (wd 3, the image's).
    await until('both watches', async () => {
      const all = await events(inst.id);
      return ['1', '3'].every((wd) => all.includes(`${wd} after-checkpoint\n`));
    }, 10_000);
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.id })).status).toBe(200);
    await s.exec(inst.id, { command: 'echo x > /root/proj/src/after-rollback' });
    await seen(inst.id, 'after-rollback');
    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.id });
    expect(fork.status, JSON.stringify(fork.body)).toBe(201);
    await s.exec(fork.body.id, { command: 'touch /root/proj/in-fork' });
    await seen(fork.body.id, 'in-fork');
    expect(await events(fork.body.id)).not.toContain('after-rollback');
    await s.api('DELETE', `/instances/${fork.body.id}`);
    await s.api('DELETE', `/instances/${inst.id}`);
  });
});
