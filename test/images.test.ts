import { existsSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { gzipSync } from 'node:zlib';
import { join } from 'node:path';
import { Image, Sandbox, Snapshots } from '@opencomputer/sdk/node';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { overlaysUnder, startServer, type TestServer } from './helpers/server.js';
import { openSse } from './helpers/sse.js';
import { until } from './helpers/wait.js';

const CLI = new URL('../dist/cli.js', import.meta.url).pathname;

let s: TestServer;
let work: string;
beforeAll(async () => {
  s = await startServer({ buildContextMaxMb: 128, buildContextMaxEntries: 5000 });
  work = await mkdtemp(join(tmpdir(), 'forkpoint-images-'));
  // The Debian image is set-up's (`npm test` builds it once): these tests need it, and fail
  // without it rather than skip.
  expect((await s.api('GET', '/images/debian')).status).toBe(200);
});
afterAll(async () => {
  await s?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

const sh = async (id: string, command: string) => (await s.exec(id, { command })) as { exit_code: number; stdout: string; stderr: string };

/** `forkpoint image build` against the test server: its exit code and what it printed. */
async function cliBuild(name: string, context: string) {
  const r = await execa(process.execPath, [CLI, 'image', 'build', name, context, '--url', s.url, '--token', s.token], { reject: false, env: { ...process.env, FORKPOINT_DATA_DIR: s.dataDir } });
  return { code: r.exitCode, out: r.stdout, err: r.stderr };
}

/** Sandboxes a build ran its steps in (they belong to an owner no token has). */
const buildSandboxes = async () => (await s.fp.store.instances.all()).filter((r) => r.owner.startsWith('~build:'));

describe('Dockerfile builds on the engine', () => {
  it('FROM debian + apt-get install bc + COPY + ENV + WORKDIR builds; an instance has all of it; a second build reuses every step', async () => {
    const ctx = join(work, 'app');
    await mkdir(join(ctx, 'conf'), { recursive: true });
    await writeFile(join(ctx, 'Dockerfile'), [
      'FROM debian',
      'ARG GREETING=hello',
      'RUN apt-get update && apt-get install -y --no-install-recommends bc && rm -rf /var/lib/apt/lists/*',
      'COPY conf/ /etc/app/',
      'COPY notes.txt /opt/notes.txt',
      'ENV APP_MODE=test GREETING2="${GREETING} world"',
      'WORKDIR /work/dir',
      'RUN echo "$APP_MODE" > mode.txt',
      'CMD ["sleep", "infinity"]',
      '',
    ].join('\n'));
    await writeFile(join(ctx, 'conf', 'app.json'), '{"name": "forkpoint", "answer": 42}\n');
    await writeFile(join(ctx, 'conf', 'secret.key'), 'never copied\n');
    await writeFile(join(ctx, 'notes.txt'), 'copied notes\n');
    await writeFile(join(ctx, '.dockerignore'), '**/*.key\n');

    const first = await cliBuild('tools', ctx);
    expect(first.err).toBe('');
    expect(first.code).toBe(0);
    expect(first.out).toMatch(/Step 1\/7 : RUN apt-get update/);
    expect(first.out).toContain('Setting up bc');

    const inst = await s.instance({ image: 'tools' });
    expect(inst.image).toBe('tools');
    expect((await sh(inst.id, 'jq -r .answer /etc/app/app.json; echo 6*7 | bc')).stdout).toBe('42\n42\n');
    expect((await sh(inst.id, 'cat /opt/notes.txt')).stdout).toBe('copied notes\n');
    expect((await sh(inst.id, 'test -e /etc/app/secret.key; echo $?')).stdout).toBe('1\n');
    expect((await sh(inst.id, 'echo "$APP_MODE|$GREETING2"')).stdout).toBe('test|hello world\n');
    expect((await sh(inst.id, 'pwd; cat mode.txt')).stdout).toBe('/work/dir\ntest\n');

    // Unchanged: every step is the cache's, and the image stands on the same layers.
    const before = (await s.fp.store.images.get('default', 'tools'))!;
    const t = performance.now();
    const second = await cliBuild('tools', ctx);
    const secondMs = performance.now() - t;
    expect(second.code).toBe(0);
    const steps = second.out.split('\n').filter((l) => l.startsWith('Step '));
    const cached = second.out.split('\n').filter((l) => l.includes('---> cached'));
    expect(cached).toHaveLength(5); // the RUNs, COPYs and WORKDIR; ENV, ARG and CMD make no layer
    expect(steps.length).toBeGreaterThan(cached.length);
    expect((await s.fp.store.images.get('default', 'tools'))!.layers).toEqual(before.layers);
    process.stderr.write(`[images] unchanged rebuild through the CLI: ${Math.round(secondMs)} ms\n`);

    // A change to a copied file rebuilds from that step on, and no earlier.
    await writeFile(join(ctx, 'notes.txt'), 'changed notes\n');
    const third = await cliBuild('tools', ctx);
    expect(third.code).toBe(0);
    expect(third.out.match(/---> cached/g)).toHaveLength(2); // the apt-get RUN and the first COPY
    const again = await s.instance({ image: 'tools' });
    expect((await sh(again.id, 'cat /opt/notes.txt; jq -n 1')).stdout).toBe('changed notes\n1\n');

    // An image instances stand on is not deleted; once they are gone, it is.
    expect((await s.api('DELETE', '/images/tools')).status).toBe(409);
    await s.api('DELETE', `/instances/${inst.id}`);
    await s.api('DELETE', `/instances/${again.id}`);
    expect((await s.api('DELETE', '/images/tools')).status).toBe(204);
    expect((await s.api('GET', '/images/tools')).status).toBe(404);
    expect(await buildSandboxes()).toEqual([]);

    // The cache still holds the steps' layers; emptying it frees them, and a build runs again.
    const held = (await s.fp.store.layers.all()).length;
    const pruned = await s.api('POST', '/images/prune');
    expect(pruned.body.removed).toBeGreaterThanOrEqual(5);
    expect((await s.fp.store.layers.all()).length).toBeLessThan(held);
    const rebuilt = await cliBuild('tools', ctx);
    expect(rebuilt.code).toBe(0);
    expect(rebuilt.out).not.toContain('---> cached');
    expect((await s.api('DELETE', '/images/tools')).status).toBe(204);
  });

  it('a failing RUN reports its line and its output, over SSE and JSON, and leaves nothing behind', async () => {
    const dockerfile = 'FROM default\nRUN echo step one > /one\nRUN echo about to fail; echo on stderr >&2; exit 3\nRUN echo never\n';
    const r = await s.api('POST', '/images', { name: 'broken', dockerfile });
    expect(r.status).toBe(422);
    expect(r.body.error.code).toBe('BUILD_STEP_FAILED');
    expect(r.body.error.details).toMatchObject({ line: 3, exit_code: 3 });
    expect(r.body.error.details.output).toContain('about to fail');
    expect(r.body.error.details.output).toContain('on stderr');
    expect(r.body.error.message).toContain('line 3');

    // The same as events, the log first.
    const res = await fetch(`${s.url}/images`, {
      method: 'POST',
      headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ name: 'broken', dockerfile }),
    });
    const text = await res.text();
    expect(text).toContain('event: build_log');
    expect(text).toMatch(/"message":"Step 2\/3 : RUN echo about to fail/);
    expect(text).toMatch(/event: error\ndata: \{"error":"line 3: [^"]*exited with code 3"/);

    expect((await s.api('GET', '/images/broken')).status).toBe(404);
    expect(await buildSandboxes()).toEqual([]);
    const known = new Set((await s.fp.store.instances.all()).map((r) => r.id));
    expect((await overlaysUnder(s.dataDir)).filter((m) => !known.has(m.split('/').at(-2) ?? ''))).toEqual([]);
  });

  it('USER, as Docker has it: RUN after it, commands, streamed commands, templates and forks run as it unless told; a build FROM its image starts as it; `user:group` sets the group', async () => {
    const made = await s.api('POST', '/images', { name: 'as-app', dockerfile: 'FROM debian\nRUN groupadd -g 1600 crew && useradd -m -u 1500 app\nUSER app\nRUN id -un > /home/app/built-as\nCMD ["sleep", "infinity"]\n' });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    expect(made.body.config.user).toBe('app');
    const inst = await s.instance({ image: 'as-app' });
    expect((await sh(inst.id, 'id -un; echo $HOME; cat /home/app/built-as')).stdout).toBe('app\n/home/app\napp\n');
    expect((await s.exec(inst.id, { command: 'id -un', user: 'root' })).stdout).toBe('root\n');
    const streamed = await fetch(`${s.url}/instances/${inst.id}/exec/stream`, { method: 'POST', headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/json' }, body: JSON.stringify({ command: 'id -un' }) });
    expect(await streamed.text()).toMatch(/event: stdout\ndata: \{"data":"app\\n"/);
    // A fork of it, and an instance of a template made from it, are the same machine.
    const ck = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {});
    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.body.id });
    expect((await sh(fork.body.id, 'id -un')).stdout).toBe('app\n');
    expect((await s.api('POST', '/templates', { name: 'as-app-t', from_image: 'as-app' })).status).toBe(201);
    await until('the template', async () => (await s.api('GET', '/templates/as-app-t')).body.status === 'ready', 60_000);
    const fromTemplate = await s.api('POST', '/instances', { template: 'as-app-t' });
    expect(fromTemplate.status, JSON.stringify(fromTemplate.body)).toBe(201);
    expect((await sh(fromTemplate.body.id, 'id -un')).stdout).toBe('app\n');
    // A build FROM the image runs its steps as its USER, and as its own USER after one.
    const next = await s.api('POST', '/images', { name: 'as-crew', dockerfile: 'FROM as-app\nRUN id -un > /home/app/inherited\nUSER root\nRUN id -un > /built-by\nUSER 1500:crew\n' });
    expect(next.status, JSON.stringify(next.body)).toBe(201);
    const crew = await s.instance({ image: 'as-crew' });
    expect((await sh(crew.id, 'id -u; id -gn; cat /home/app/inherited /built-by')).stdout).toBe('1500\ncrew\napp\nroot\n');
    for (const id of [inst.id, fork.body.id, fromTemplate.body.id, crew.id]) await s.api('DELETE', `/instances/${id}`);
    expect((await s.api('DELETE', '/templates/as-app-t')).status).toBe(204);
    for (const name of ['as-crew', 'as-app']) expect((await s.api('DELETE', `/images/${name}`)).status).toBe(204);
  });

  it('VOLUME: each path a mount point of its own, on the instance\'s disk, through a memory checkpoint, a rollback, forks (memory and files only), a hibernation and a stop; a persistent volume takes its path; bad paths refused', async () => {
    const made = await s.api('POST', '/images', { name: 'with-volume', dockerfile: 'FROM debian\nVOLUME ["/workspace", "/srv/data/"]\nRUN echo built > /workspace/at-build\n' });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    expect(made.body.config.volumes).toEqual(['/workspace', '/srv/data']);
    const mounted = async (id: string) => (await sh(id, 'for p in /workspace /srv/data; do mountpoint -q $p && echo $p; done; df /workspace | tail -1 | awk \'{print $NF}\'; cat /workspace/*')).stdout;
    const inst = await s.instance({ image: 'with-volume' });
    await sh(inst.id, 'echo mine > /workspace/file');
    expect(await mounted(inst.id)).toBe('/workspace\n/srv/data\n/workspace\nbuilt\nmine\n');
    // Its files are the instance's disk: a checkpoint keeps them, a rollback brings them back.
    const ck = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, {});
    await sh(inst.id, 'echo later > /workspace/file');
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: ck.body.id })).status).toBe(200);
    expect(await mounted(inst.id)).toBe('/workspace\n/srv/data\n/workspace\nbuilt\nmine\n');
    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: ck.body.id });
    expect(await mounted(fork.body.id)).toBe('/workspace\n/srv/data\n/workspace\nbuilt\nmine\n');
    const filesOnly = await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: false });
    const booted = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: filesOnly.body.id });
    expect(await mounted(booted.body.id)).toBe('/workspace\n/srv/data\n/workspace\nbuilt\nmine\n');
    expect((await s.api('POST', `/instances/${inst.id}/hibernate`)).status).toBe(200);
    expect(await mounted(inst.id)).toBe('/workspace\n/srv/data\n/workspace\nbuilt\nmine\n');
    expect((await s.api('POST', `/instances/${inst.id}/stop`)).status).toBe(200);
    expect((await s.api('POST', `/instances/${inst.id}/start`)).status).toBe(200);
    expect(await mounted(inst.id)).toBe('/workspace\n/srv/data\n/workspace\nbuilt\nmine\n');
    // A persistent volume named at one of them is mounted there instead.
    expect((await s.api('POST', '/volumes', { name: 'ws', size_mb: 64 })).status).toBe(201);
    const withVolume = await s.instance({ image: 'with-volume', volumes: [{ name: 'ws', path: '/workspace' }] });
    expect((await sh(withVolume.id, 'mountpoint -q /srv/data && echo own; ls /workspace')).stdout).toBe('own\n');
    for (const id of [inst.id, fork.body.id, booted.body.id, withVolume.id]) await s.api('DELETE', `/instances/${id}`);
    expect((await s.api('DELETE', '/volumes/ws')).status).toBe(204);
    expect((await s.api('DELETE', '/images/with-volume')).status).toBe(204);
    for (const bad of ['VOLUME /proc/x', 'VOLUME relative', 'VOLUME /a/../b']) {
      const r = await s.api('POST', '/images', { name: 'bad-volume', dockerfile: `FROM debian\n${bad}\n` });
      expect([r.status, r.body.error.code, r.body.error.details.line], bad).toEqual([400, 'DOCKERFILE_INVALID', 2]);
    }
  });

  it('a build whose client goes away stops: its running step killed, its sandbox gone, no image', async () => {
    const sse = await openSse(`${s.url}/images`, { method: 'POST', headers: { authorization: `Bearer ${s.token}` }, body: { name: 'abandoned', dockerfile: 'FROM default\nRUN echo started; sleep 6017\nRUN echo never\n' } });
    expect(sse.status).toBe(200);
    // Until the step's own output: its command runs.
    for (let e = await sse.next(30_000); e && !(e.data?.type === 'output' && e.data.message === 'started'); e = await sse.next(30_000));
    expect((await buildSandboxes()).length).toBe(1);
    sse.close();
    await until('the build sandbox gone', async () => (await buildSandboxes()).length === 0, 20_000);
    expect((await s.api('GET', '/images/abandoned')).status).toBe(404);
    // Its step's process went with it: no sleep 6017 (this test's own) is left on the host.
    expect((await execa('pgrep', ['-f', 'sleep 6017'], { reject: false })).stdout).toBe('');
  });

  it('image build as Docker takes it: -f relative to the current directory (or absolute), a missing context or Dockerfile named as such', async () => {
    const ctx = join(work, 'dash-f');
    await mkdir(join(ctx, 'docker'), { recursive: true });
    await writeFile(join(ctx, 'docker', 'Dockerfile.dev'), 'FROM default\nRUN echo from-dev > /built\n');
    const run = (args: string[], cwd: string) => execa(process.execPath, [CLI, 'image', 'build', ...args, '--url', s.url, '--token', s.token], { reject: false, cwd, env: { ...process.env, FORKPOINT_DATA_DIR: s.dataDir } });
    const relative = await run(['dev-image', 'dash-f', '-f', 'dash-f/docker/Dockerfile.dev'], work);
    expect(relative.exitCode, relative.stderr).toBe(0);
    const absolute = await run(['dev-image-2', '.', '-f', join(ctx, 'docker', 'Dockerfile.dev')], ctx);
    expect(absolute.exitCode, absolute.stderr).toBe(0);
    const inst = await s.instance({ image: 'dev-image' });
    expect((await sh(inst.id, 'cat /built')).stdout).toBe('from-dev\n');
    await s.api('DELETE', `/instances/${inst.id}`); // the later tests list every instance
    const missing = await run(['x', 'no-such-dir'], work);
    expect([missing.exitCode, missing.stderr.trim()]).toEqual([1, `forkpoint: the build context no-such-dir is not a directory (looked for ${join(work, 'no-such-dir')})`]);
    const noFile = await run(['x', 'dash-f'], work);
    expect([noFile.exitCode, noFile.stderr.trim()]).toEqual([1, `forkpoint: no Dockerfile at ${join(ctx, 'Dockerfile')}`]);
  });

  it('a bad Dockerfile is a 400 with its line, before anything runs', async () => {
    const cases: [string, number | null, RegExp][] = [
      ['RUN true\n', 1, /must be FROM/],
      ['FROM default\nRUN true\nFROBNICATE x\n', 3, /unknown instruction FROBNICATE/],
      ['FROM default\nFROM default\n', 2, /multi-stage/],
      ['FROM nowhere-such\nRUN true\n', 1, /no such image/],
      ['FROM default\nCOPY a.txt /a.txt\n', 2, /needs a build context/],
      ['FROM default\nEXPOSE 99999\n', 2, /not a port/],
    ];
    for (const [dockerfile, line, message] of cases) {
      const r = await s.api('POST', '/images', { name: 'bad', dockerfile });
      expect(r.status, dockerfile).toBe(400);
      expect(r.body.error.code).toBe('DOCKERFILE_INVALID');
      expect(r.body.error.details.line).toBe(line);
      expect(r.body.error.message).toMatch(message);
    }
    expect(await buildSandboxes()).toEqual([]);
  });
});

describe('templates', () => {
  it('an instance from a template answers on the server its start command started, on its first exec', async () => {
    const t = await s.api('POST', '/templates', {
      name: 'web',
      from_image: 'default',
      start_command: 'mkdir -p /srv && echo "served by the template" > /srv/index.html && exec httpd -f -p 8080 -h /srv',
      ready_command: 'wget -q -O /dev/null http://127.0.0.1:8080/',
    });
    expect(t.status).toBe(201);
    expect(t.body).toMatchObject({ name: 'web', status: 'ready', source: 'image:default' });
    expect((await s.api('POST', '/templates', { name: 'web', from_image: 'default' })).status).toBe(409);

    const a = await s.api('POST', '/instances', { template: 'web', env: { WHO: 'a' } });
    expect(a.status).toBe(201);
    expect(a.body.image).toBe('web');
    // No wait, no retry: the very first command finds the server up.
    expect((await sh(a.body.id, 'wget -q -O- http://127.0.0.1:8080/')).stdout).toBe('served by the template\n');
    expect((await sh(a.body.id, 'echo $WHO')).stdout).toBe('a\n');
    const b = await s.api('POST', '/instances', { template: 'web' });
    expect((await sh(b.body.id, 'wget -q -O- http://127.0.0.1:8080/')).stdout).toBe('served by the template\n');
    expect(a.body.network.address).not.toBe(b.body.network.address);

    // The template's own sandbox is nobody's to list, and runs nothing.
    const listed = (await s.api('GET', '/instances?limit=100')).body.items.map((i: { id: string }) => i.id);
    expect(listed.sort()).toEqual([a.body.id, b.body.id].sort());
    const hidden = (await s.fp.store.instances.all()).filter((r) => r.owner === '~template:default');
    expect(hidden.map((r) => r.status)).toEqual(['stopped']);

    // Deleting the template leaves its instances running.
    expect((await s.api('DELETE', '/templates/web')).status).toBe(204);
    expect((await sh(a.body.id, 'wget -q -O- http://127.0.0.1:8080/')).stdout).toBe('served by the template\n');
    expect((await s.api('POST', '/instances', { template: 'web' })).status).toBe(404);
    expect((await s.fp.store.instances.all()).filter((r) => r.owner === '~template:default')).toEqual([]);
    await s.api('DELETE', `/instances/${a.body.id}`);
    await s.api('DELETE', `/instances/${b.body.id}`);
  });

  it('a template from a checkpoint, and a failing ready command that leaves nothing', async () => {
    const src = await s.instance();
    await s.exec(src.id, { command: 'echo from-the-checkpoint > /root/mark' });
    const cp = await s.api('POST', `/instances/${src.id}/checkpoints?wait=true`, {});
    const t = await s.api('POST', '/templates', { name: 'marked', from_checkpoint: cp.body.id, start_command: 'sleep 1000' });
    expect(t.status).toBe(201);
    const inst = await s.api('POST', '/instances', { template: 'marked' });
    expect((await sh(inst.body.id, 'cat /root/mark; ps -o args')).stdout).toMatch(/^from-the-checkpoint\n[^]*sleep 1000/);

    const bad = await s.api('POST', '/templates', { name: 'never', from_image: 'default', ready_command: 'false', ready_timeout_s: 1 });
    expect(bad.status).toBe(409);
    expect((await s.api('GET', '/templates/never')).status).toBe(404);
    expect((await s.api('GET', '/templates')).body.templates.map((x: { name: string }) => x.name)).toEqual(['marked']);
    await s.api('DELETE', '/templates/marked');
    await s.api('DELETE', `/instances/${inst.body.id}`);
    await s.api('DELETE', `/instances/${src.id}`);
    await until('the hidden instances gone', async () => (await s.fp.store.instances.all()).every((r) => !r.owner.startsWith('~')));
  });
});

describe('the published @opencomputer/sdk\'s Image builder and Snapshots', () => {
  it('Sandbox.create({image}) builds the manifest and boots it; the same manifest again is served from the cache', async () => {
    const opts = { apiUrl: s.url, apiKey: s.token };
    const image = Image.base()
      .aptInstall(['jq'])
      .runCommands('mkdir -p /app', 'echo "{\\"built\\": true}" > /app/state.json')
      .env({ APP_ENV: 'sdk' })
      .workdir('/app')
      .addFile('/app/hello.txt', 'from addFile\n');
    const logs: string[] = [];
    const sb = await Sandbox.create({ ...opts, image, onBuildLog: (l) => logs.push(l) });
    expect(logs.some((l) => l.startsWith('Step 1/6 : apt_install jq'))).toBe(true);
    const r = await sb.exec.run('jq -r .built state.json && cat hello.txt && echo $APP_ENV && pwd');
    expect(r).toMatchObject({ exitCode: 0, stdout: 'true\nfrom addFile\nsdk\n/app\n' });

    const again: string[] = [];
    const sb2 = await Sandbox.create({ ...opts, image, onBuildLog: (l) => again.push(l) });
    expect(again.some((l) => l.includes('is cached'))).toBe(true);
    expect(again.some((l) => l.startsWith('Step'))).toBe(false);
    expect((await sb2.exec.run('jq -n 7')).stdout).toBe('7\n');

    // A snapshot of the same manifest: built nothing, booted, and checkpointed with memory.
    const snaps = new Snapshots(opts);
    const snap = await snaps.create({ name: 'tools-snap', image });
    expect(snap).toMatchObject({ name: 'tools-snap', status: 'ready' });
    const sb3 = await Sandbox.create({ ...opts, snapshot: 'tools-snap' });
    expect((await sb3.exec.run('cat /app/hello.txt')).stdout).toBe('from addFile\n');
    expect((await snaps.list()).map((x) => x.name)).toContain('tools-snap');
    for (const x of [sb, sb2, sb3]) await x.kill();
    await snaps.delete('tools-snap');
    expect(await buildSandboxes()).toEqual([]);
  });
});

/** A `docker save` archive made by hand: two layers, the second deleting a file of the first
 * with a whiteout and making a directory opaque. */
async function dockerSave(dir: string, base: string): Promise<string> {
  const l1 = join(dir, 'l1');
  const l2 = join(dir, 'l2');
  const out = join(dir, 'archive');
  // The first layer is a whole userland (the default image's), so that the image boots.
  await execa('cp', ['-a', base, l1]);
  await mkdir(join(l1, 'etc/app'), { recursive: true });
  await mkdir(join(l1, 'old'), { recursive: true });
  await mkdir(join(l2, 'etc/app'), { recursive: true });
  await mkdir(join(l2, 'old'), { recursive: true });
  await mkdir(join(out, 'layer1'), { recursive: true });
  await mkdir(join(out, 'layer2'), { recursive: true });
  await writeFile(join(l1, 'etc/app/keep.txt'), 'kept\n');
  await writeFile(join(l1, 'etc/app/gone.txt'), 'deleted by the second layer\n');
  await writeFile(join(l1, 'old/a.txt'), 'hidden by an opaque directory\n');
  await writeFile(join(l2, 'etc/app/.wh.gone.txt'), '');
  await writeFile(join(l2, 'old/.wh..wh..opq'), '');
  await writeFile(join(l2, 'old/b.txt'), 'the opaque directory\'s own\n');
  await writeFile(join(l2, 'etc/app/new.txt'), 'added\n');
  await execa('tar', ['-cf', join(out, 'layer1/layer.tar'), '-C', l1, '.']);
  await execa('tar', ['-cf', join(out, 'layer2/layer.tar'), '-C', l2, '.']);
  await writeFile(join(out, 'config.json'), JSON.stringify({ config: { Env: ['PATH=/usr/local/bin:/usr/bin:/bin', 'FROM_IMAGE=yes'], WorkingDir: '/etc/app', Cmd: ['sleep', '60'] } }));
  await writeFile(join(out, 'manifest.json'), JSON.stringify([{ Config: 'config.json', RepoTags: ['test:latest'], Layers: ['layer1/layer.tar', 'layer2/layer.tar'] }]));
  const tarball = join(dir, 'saved.tar');
  await execa('tar', ['-cf', tarball, '-C', out, '.']);
  return tarball;
}

/** An OCI image layout (index.json, blobs by sha256, gzipped layers) as a tarball. */
async function ociLayout(dir: string, layers: string[], config: string): Promise<string> {
  await mkdir(join(dir, 'blobs/sha256'), { recursive: true });
  const put = async (data: Buffer) => {
    const hex = createHash('sha256').update(data).digest('hex');
    await writeFile(join(dir, 'blobs/sha256', hex), data);
    return { digest: `sha256:${hex}`, size: data.length };
  };
  const layerBlobs = [];
  for (const l of layers) layerBlobs.push({ mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', ...(await put(gzipSync(await readFile(l)))) });
  const manifest = { schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...(await put(await readFile(config))) }, layers: layerBlobs };
  const m = await put(Buffer.from(JSON.stringify(manifest)));
  await writeFile(join(dir, 'index.json'), JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', ...m }] }));
  await writeFile(join(dir, 'oci-layout'), '{"imageLayoutVersion": "1.0.0"}');
  const tarball = `${dir}.tar`;
  await execa('tar', ['-cf', tarball, '-C', dir, '.']);
  return tarball;
}

describe('image archives', () => {
  it('a docker save archive and an OCI layout (two layers, a whiteout, an opaque directory) import with their config', async () => {
    const dir = join(work, 'save');
    await mkdir(dir);
    const tarball = await dockerSave(dir, s.engine.images.path('default'));
    const r = await execa(process.execPath, [CLI, 'image', 'import', 'saved', tarball], { env: { ...process.env, FORKPOINT_DATA_DIR: s.dataDir }, reject: false });
    expect(r.stderr).toContain('imported saved (2 layers)');
    expect(r.exitCode).toBe(0);
    const img = await s.api('GET', '/images/saved');
    expect(img.body).toMatchObject({ kind: 'system', config: { workdir: '/etc/app', cmd: ['sleep', '60'], env: { FROM_IMAGE: 'yes' } } });
    const inst = await s.instance({ image: 'saved' });
    expect((await sh(inst.id, 'pwd; echo $FROM_IMAGE; ls /etc/app /old')).stdout).toBe('/etc/app\nyes\n/etc/app:\nkeep.txt\nnew.txt\n\n/old:\nb.txt\n');
    await s.api('DELETE', `/instances/${inst.id}`);

    // The same layers as an OCI image layout, gzipped, addressed by digest.
    const oci = await ociLayout(join(dir, 'oci'), [join(dir, 'archive/layer1/layer.tar'), join(dir, 'archive/layer2/layer.tar')], join(dir, 'archive/config.json'));
    const o = await execa(process.execPath, [CLI, 'image', 'import', 'saved-oci', oci], { env: { ...process.env, FORKPOINT_DATA_DIR: s.dataDir }, reject: false });
    expect(o.stderr).toContain('imported saved-oci (2 layers)');
    const inst2 = await s.instance({ image: 'saved-oci' });
    expect((await sh(inst2.id, 'pwd; echo $FROM_IMAGE; ls /etc/app /old')).stdout).toBe('/etc/app\nyes\n/etc/app:\nkeep.txt\nnew.txt\n\n/old:\nb.txt\n');
    await s.api('DELETE', `/instances/${inst2.id}`);
    // No whiteout and no import leftovers stay.
    expect((await execa('find', [s.engine.images.path(''), '-maxdepth', '1', '-name', '.import-*'])).stdout).toBe('');
    expect((await overlaysUnder(s.dataDir)).filter((m) => m.includes('/images/'))).toEqual([]);
  });
});

describe('attacks through builds, archives and templates', () => {
  it('a context\'s links are copied as links, never followed: the host\'s file never reaches the image', async () => {
    const secret = join(work, 'host-secret');
    await writeFile(secret, 'HOST-SECRET-MARKER\n');
    const ctx = join(work, 'linky');
    await mkdir(join(ctx, 'dir'), { recursive: true });
    await symlink(secret, join(ctx, 'leak'));
    await symlink(work, join(ctx, 'dir', 'up'));
    await writeFile(join(ctx, 'Dockerfile'), 'FROM default\nCOPY leak /leak\nCOPY dir/ /d/\nRUN cat /leak /d/up/host-secret || true\n');
    const built = await cliBuild('linky', ctx);
    expect(built.err).toBe('');
    expect(built.code).toBe(0);
    expect(built.out).not.toContain('HOST-SECRET-MARKER');
    const inst = await s.instance({ image: 'linky' });
    expect((await sh(inst.id, 'readlink /leak; readlink /d/up')).stdout).toBe(`${secret}\n${work}\n`);
    expect((await sh(inst.id, 'cat /leak /d/up/host-secret 2>&1')).stdout).not.toContain('HOST-SECRET-MARKER');
    await s.api('DELETE', `/instances/${inst.id}`);
    await s.api('DELETE', '/images/linky');

    // A Dockerfile that is a link to a host file is refused, its content never read.
    const ctx2 = join(work, 'linked-dockerfile');
    await mkdir(ctx2);
    await symlink(secret, join(ctx2, 'Dockerfile'));
    const refused = await cliBuild('never', ctx2);
    expect(refused.code).toBe(1);
    expect(refused.err).toContain('is a symbolic link');
    expect(refused.err + refused.out).not.toContain('HOST-SECRET-MARKER');
  });

  it('an archive that names files outside itself, or writes through a link of an earlier layer, is refused or contained', async () => {
    const dir = join(work, 'evil');
    await mkdir(join(dir, 'out'), { recursive: true });
    await writeFile(join(dir, 'out', 'manifest.json'), JSON.stringify([{ Config: 'c.json', Layers: ['../../../../etc/hostname'] }]));
    await writeFile(join(dir, 'out', 'c.json'), '{}');
    await execa('tar', ['-cf', join(dir, 'escape.tar'), '-C', join(dir, 'out'), '.']);
    const r = await execa(process.execPath, [CLI, 'image', 'import', 'escape', join(dir, 'escape.tar')], { env: { ...process.env, FORKPOINT_DATA_DIR: s.dataDir }, reject: false });
    expect(r.exitCode).toBe(1);
    expect(r.stderr).toContain('outside itself');

    // Layer 1 makes `evil` a link to a host directory; layer 2 writes evil/pwned.
    const target = join(work, 'link-target');
    await mkdir(target);
    const l1 = join(dir, 'l1');
    const l2 = join(dir, 'l2');
    const out = join(dir, 'out2');
    await execa('cp', ['-a', s.engine.images.path('default'), l1]);
    await symlink(target, join(l1, 'evil'));
    await mkdir(join(l2, 'evil'), { recursive: true });
    await writeFile(join(l2, 'evil', 'pwned'), 'written through a link?\n');
    await mkdir(join(out, 'a'), { recursive: true });
    await mkdir(join(out, 'b'), { recursive: true });
    await execa('tar', ['-cf', join(out, 'a/layer.tar'), '-C', l1, '.']);
    await execa('tar', ['-cf', join(out, 'b/layer.tar'), '-C', l2, '.']);
    await writeFile(join(out, 'c.json'), '{}');
    await writeFile(join(out, 'manifest.json'), JSON.stringify([{ Config: 'c.json', Layers: ['a/layer.tar', 'b/layer.tar'] }]));
    await execa('tar', ['-cf', join(dir, 'through.tar'), '-C', out, '.']);
    const t = await execa(process.execPath, [CLI, 'image', 'import', 'through', join(dir, 'through.tar')], { env: { ...process.env, FORKPOINT_DATA_DIR: s.dataDir }, reject: false });
    expect(t.exitCode).toBe(0);
    expect(existsSync(join(target, 'pwned'))).toBe(false);
    const inst = await s.instance({ image: 'through' });
    expect((await sh(inst.id, 'cat /evil/pwned')).stdout).toBe('written through a link?\n');
    await s.api('DELETE', `/instances/${inst.id}`);
  });

  it('a build context that unpacks to more than it weighs (a sparse tar, a gzip bomb, too many members) or holds a device is refused before anything is unpacked', async () => {
    const dir = join(work, 'bombs');
    await mkdir(join(dir, 'src'), { recursive: true });
    await writeFile(join(dir, 'src', 'Dockerfile'), 'FROM default\nCOPY . /ctx\n');
    const make = async (name: string, script: string) => {
      await execa('bash', ['-c', script], { cwd: dir });
      return readFile(join(dir, name));
    };
    const cases: [string, Buffer, number, string][] = [
      // 10 KiB that GNU tar unpacks to a 3 GiB file.
      ['sparse', await make('sparse.tar', 'cp src/Dockerfile . && truncate -s 3G big && tar --sparse -cf sparse.tar Dockerfile big && rm big'), 400, 'SPARSE_MEMBER'],
      ['sparse-pax', await make('sparse-pax.tar', 'truncate -s 3G big && tar --sparse --format=posix -cf sparse-pax.tar Dockerfile big && rm big'), 400, 'SPARSE_MEMBER'],
      // 1 MiB of gzip that unpacks to 256 MiB of zeros, twice the server's bound.
      ['bomb', await make('bomb.tgz', 'head -c 256M /dev/zero > zeros && tar -cf - Dockerfile zeros | gzip -1 > bomb.tgz && rm zeros'), 413, 'UNPACKED_TOO_LARGE'],
      ['many', await make('many.tgz', 'mkdir -p many && (cd many && seq 1 6000 | xargs touch) && tar -czf many.tgz Dockerfile many && rm -rf many'), 413, 'TOO_MANY_ENTRIES'],
      ['device', await make('device.tar', 'mknod null c 1 3 && tar -cf device.tar Dockerfile null && rm null'), 400, 'MEMBER_TYPE'],
    ];
    for (const [name, body, status, reason] of cases) {
      expect(body.length, name).toBeLessThan(2 << 20);
      const r = await fetch(`${s.url}/images/bomb-${name}/build`, { method: 'POST', headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/x-tar' }, body: new Uint8Array(body) });
      const answer = (await r.json()) as { error: { code: string; details?: { reason?: string } } };
      expect([r.status, answer.error.details?.reason], name).toEqual([status, reason]);
      expect((await s.api('GET', `/images/bomb-${name}`)).status).toBe(404);
    }
    // Nothing unpacked, nothing left: no context directory, no archive.
    expect(existsSync(join(s.dataDir, 'contexts')) ? (await execa('ls', ['-A', join(s.dataDir, 'contexts')])).stdout : '').toBe('');
    // The same context within the bounds builds.
    const ok = await make('ok.tar', 'tar -cf ok.tar -C src Dockerfile');
    const built = await fetch(`${s.url}/images/bomb-ok/build`, { method: 'POST', headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/x-tar' }, body: new Uint8Array(ok) });
    expect(built.status).toBe(201);
    await s.api('DELETE', '/images/bomb-ok');
  });

  it('a step that prints megabytes with no newline is logged in bounded pieces, and the build goes on', async () => {
    const res = await fetch(`${s.url}/images`, {
      method: 'POST',
      headers: { authorization: `Bearer ${s.token}`, 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ name: 'noisy', dockerfile: "FROM default\nRUN head -c 8000000 /dev/zero | tr '\\0' a\nRUN echo after\n" }),
    });
    const text = await res.text();
    const messages = [...text.matchAll(/^event: build_log\ndata: (.*)$/gm)].map((m) => (JSON.parse(m[1]!) as { message: string }).message);
    expect(Math.max(...messages.map((m) => m.length))).toBeLessThanOrEqual(16 << 10);
    expect(messages.filter((m) => /^a+$/.test(m)).reduce((n, m) => n + m.length, 0)).toBe(8_000_000);
    expect(messages).toContain('after');
    expect(text).toContain('event: result');
    expect((await s.api('DELETE', '/images/noisy')).status).toBe(204);
  });

  it('another owner\'s images and templates do not exist for a token of its own', async () => {
    await s.api('POST', '/images', { name: 'mine', dockerfile: 'FROM default\nRUN echo mine > /mine\n' });
    expect((await s.api('POST', '/templates', { name: 'mytpl', from_image: 'mine', start_command: 'sleep 1000' })).status).toBe(201);
    const { token } = await s.fp.store.tokens.create('intruder', 'test');
    const as = { authorization: `Bearer ${token}` };
    expect((await s.api('GET', '/images/mine', undefined, as)).status).toBe(404);
    expect((await s.api('GET', '/images', undefined, as)).body.images.map((i: { name: string }) => i.name)).not.toContain('mine');
    expect((await s.api('POST', '/instances', { image: 'mine' }, as)).status).toBe(400);
    expect((await s.api('POST', '/instances', { template: 'mytpl' }, as)).status).toBe(404);
    expect((await s.api('DELETE', '/templates/mytpl', undefined, as)).status).toBe(404);
    expect((await s.api('DELETE', '/images/mine', undefined, as)).status).toBe(404);
    expect((await s.api('POST', '/images', { name: 'theirs', dockerfile: 'FROM mytpl\n' }, as)).status).toBe(400);
    // The hidden instances behind them answer no one.
    for (const r of (await s.fp.store.instances.all()).filter((x) => x.owner.startsWith('~'))) {
      expect((await s.api('GET', `/instances/${r.id}`)).status).toBe(404);
      expect((await s.api('POST', `/instances/${r.id}/exec`, { command: 'true' })).status).toBe(404);
      expect((await s.api('DELETE', `/instances/${r.id}`)).status).toBe(404);
    }
    expect((await s.api('DELETE', '/templates/mytpl')).status).toBe(204);
    expect((await s.api('DELETE', '/images/mine')).status).toBe(204);
  });
});
