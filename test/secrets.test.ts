import { randomBytes } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm, writeFile, lstat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { gunzipSync } from 'node:zlib';
import { join } from 'node:path';
import { Sandbox as OcSandbox, SecretStore } from '@opencomputer/sdk';
import { execa } from 'execa';
import S3rver from 's3rver';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { issueServerCertificate, newEgressCa } from '../src/lib/egress-ca.js';
import { startServer, type TestServer } from './helpers/server.js';
import { startTestHost, type TestHost } from './helpers/testhost.js';
import { until } from './helpers/wait.js';

/**
 * Secrets through the egress proxy, against a test host in a network namespace made here (HTTP
 * and HTTPS, its certificate from a CA the server is told to trust): the sandbox sees a
 * placeholder; the host of the rule receives the secret; another host receives the placeholder;
 * and the secret's bytes are nowhere the sandbox's state goes: the memory image of a checkpoint
 * taken while a process holds the placeholder, the layers, the durable blobs, the store, the
 * logs under the data directory, the instance view.
 */
const CLI = new URL('../dist/cli.js', import.meta.url).pathname;
const SECRET = `sk-test-${randomBytes(12).toString('hex')}`;
let work: string;
let net: TestHost;
let s3: S3rver;
let s3dir: string;
let s: TestServer;
let config: Parameters<typeof startServer>[0];
/** The server's whole log (debug), searched for the secret too. */
const LOG = () => join(work, 'server.log');

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'forkpoint-secrets-test-'));
  // The test host's own CA (not the instance's): the proxy verifies the real host against it.
  const hostCa = await newEgressCa('test host CA');
  const hostCert = await issueServerCertificate(hostCa, 'testhost.internal');
  await writeFile(join(work, 'cert.pem'), hostCert.certPem + hostCa.certPem);
  await writeFile(join(work, 'key.pem'), hostCert.keyPem);
  await writeFile(join(work, 'host-ca.pem'), hostCa.certPem);
  net = await startTestHost({ tlsDir: work });
  s3dir = join(work, 's3');
  s3 = new S3rver({ address: '127.0.0.1', port: 0, directory: s3dir, silent: true, configureBuckets: [{ name: 'checkpoints', configs: [] }] });
  const { port } = (await s3.run()) as { port: number };
  config = {
    dnsServers: net.address,
    egressCaFile: join(work, 'host-ca.pem'),
    s3Endpoint: `http://127.0.0.1:${port}`,
    s3Bucket: 'checkpoints',
    s3AccessKeyId: 'S3RVER',
    s3SecretAccessKey: 'S3RVER',
  };
  s = await startServer(config, undefined, { logFile: LOG() });
}, 120_000);

afterAll(async () => {
  await s?.close();
  await s3?.close();
  await net?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

const sh = async (id: string, command: string) => s.exec(id, { command });
/** What the test host was sent, asked from the host (the sandbox never sees this). */
const seenByHost = async () => (await (await request(`http://${net.address}/seen`)).body.json()) as { tls: boolean; host: string; headers: Record<string, string>; url: string; body: string; size: number; tail: string }[];

/** A file's bytes, gunzipped when they are gzip (durable blobs are). */
const contentOf = async (p: string) => {
  const raw = await readFile(p).catch(() => Buffer.alloc(0));
  if (raw[0] !== 0x1f || raw[1] !== 0x8b) return raw;
  try {
    return gunzipSync(raw);
  } catch {
    return raw;
  }
};

/** Every regular file under `dir` that holds `needle` (in gzip's case, once gunzipped), but under
 * `skip` (the system images: copies of set-up's, which no sandbox writes). */
async function filesHolding(dir: string, needle: Buffer, skip: string[] = []): Promise<string[]> {
  const found: string[] = [];
  const walk = async (d: string) => {
    for (const name of await readdir(d).catch(() => [] as string[])) {
      const p = join(d, name);
      if (skip.includes(p)) continue;
      const st = await lstat(p).catch(() => undefined);
      if (!st) continue;
      if (st.isDirectory()) await walk(p);
      else if (st.isFile() && (await contentOf(p)).includes(needle)) found.push(p);
    }
  };
  await walk(dir);
  return found;
}

describe('secrets', () => {
  it('reach the rule\'s host over HTTP and HTTPS in place of the placeholder; another host gets the placeholder; the value is in no checkpoint, layer, blob, store or view', async () => {
    const put = await s.api('PUT', '/secrets/API_KEY', { value: SECRET });
    expect(put.status).toBe(200);
    expect(JSON.stringify(put.body)).not.toContain(SECRET);
    const inst = await s.instance({
      image: 'debian',
      network: { egress: 'allow', allow: ['172.16.0.0/12'] },
      secrets: [{ name: 'API_KEY', hosts: ['testhost.internal'] }],
    });
    expect(inst.secrets).toEqual([{ name: 'API_KEY', env: 'API_KEY', hosts: ['testhost.internal'] }]);
    const placeholder = (await sh(inst.id, 'printf %s "$API_KEY"')).stdout;
    expect(placeholder).toMatch(/^fpsecret_[0-9a-f]{32}$/);

    const curl = (url: string) => sh(inst.id, `curl -sS --max-time 20 -H "Authorization: Bearer $API_KEY" ${url}`);
    for (const url of ['http://testhost.internal/record', 'https://testhost.internal/record', 'http://other.testhost.internal/record']) {
      const r = await curl(url);
      expect(r.stdout + r.stderr, url).toBe('recorded\n');
    }
    const seen = await seenByHost();
    expect(seen.map((x) => [x.tls, x.host, x.headers.authorization])).toEqual([
      [false, 'testhost.internal', `Bearer ${SECRET}`],
      [true, 'testhost.internal', `Bearer ${SECRET}`],
      [false, 'other.testhost.internal', `Bearer ${placeholder}`],
    ]);
    // In the URL (as a query component) and in bodies: one of a stated length (told anew), a
    // chunked upload (replaced as it streams; curl sends it with "Expect: 100-continue", which
    // the proxy passed on and undici refused: a 502); another host gets the placeholders as they are.
    const json = (key: string) => `{"key":"${key}"}`;
    await sh(inst.id, 'curl -sS --max-time 20 "https://testhost.internal/record?key=$API_KEY"');
    await sh(inst.id, `curl -sS --max-time 20 -H 'content-type: application/json' --data '{"key":"'"$API_KEY"'"}' https://testhost.internal/record`);
    await sh(inst.id, `printf '%s' '{"key":"'"$API_KEY"'"}' | curl -sS --max-time 20 -X POST -T - http://testhost.internal/record`);
    await sh(inst.id, `curl -sS --max-time 20 --data '{"key":"'"$API_KEY"'"}' "http://other.testhost.internal/record?key=$API_KEY"`);
    const carried = (await seenByHost()).slice(-4);
    expect(carried.map((x) => [x.url, x.body])).toEqual([
      [`/record?key=${encodeURIComponent(SECRET)}`, ''],
      ['/record', json(SECRET)],
      ['/record', json(SECRET)],
      [`/record?key=${placeholder}`, json(placeholder)],
    ]);
    expect(carried[1]!.headers['content-length']).toBe(String(json(SECRET).length));
    // A body longer than the proxy holds in memory (1 MiB) has its placeholder replaced too, and
    // keeps a stated length (spooled to the server's disk first): object stores refuse chunked
    // uploads. (Before, it went on chunked; before that, as it was, the placeholder in it.)
    const big = 1536 * 1024;
    await sh(inst.id, `head -c ${big} /dev/zero | tr '\\0' y > /tmp/big && printf %s "$API_KEY" >> /tmp/big && curl -sS --max-time 30 --data-binary @/tmp/big https://testhost.internal/record`);
    const [large] = (await seenByHost()).slice(-1);
    expect([large!.size, large!.tail.slice(-SECRET.length - 1), large!.headers['content-length'], large!.headers['transfer-encoding']]).toEqual([big + SECRET.length, `y${SECRET}`, String(big + SECRET.length), undefined]);
    expect((await readdir(join(s.dataDir, 'spill'))).filter((f) => f.startsWith('egress-body-'))).toEqual([]);

    // A process holding the placeholder (and nothing else of the secret) while a checkpoint with
    // memory is taken and made durable.
    await s.api('POST', `/instances/${inst.id}/processes`, { command: 'HELD="$API_KEY"; while true; do sleep 1; done' });
    const cp = (await s.api('POST', `/instances/${inst.id}/checkpoints?wait=true`, { memory: true })).body;
    expect(cp.status).toBe('ready');
    await until('the checkpoint durable', async () => (await s.api('GET', `/instances/${inst.id}/checkpoints/${cp.id}`)).body.durable === true, 60_000);
    // The placeholder is in the memory image (the search finds what is there)...
    expect((await filesHolding(join(s.dataDir, 'checkpoints', cp.id), Buffer.from(placeholder))).length).toBeGreaterThan(0);
    // ...and the secret nowhere: memory images, layers, uppers, the store, logs, blobs.
    expect(await filesHolding(s.dataDir, Buffer.from(SECRET), [join(s.dataDir, 'images')])).toEqual([]);
    expect(await filesHolding(s3dir, Buffer.from(SECRET))).toEqual([]);
    expect(await filesHolding(s3dir, Buffer.from(placeholder))).not.toEqual([]);
    const view = await s.api('GET', `/instances/${inst.id}`);
    expect(JSON.stringify(view.body)).not.toContain(SECRET);
    const log = await readFile(LOG(), 'utf8');
    expect(log).toContain(inst.id);
    expect(log).not.toContain(SECRET);
    expect(JSON.stringify((await s.api('GET', '/secrets')).body)).not.toContain(SECRET);

    // After a rollback, and in a fork (which keeps the rules and the CA), requests carry it still.
    expect((await s.api('POST', `/instances/${inst.id}/rollback`, { checkpoint_id: cp.id })).status).toBe(200);
    const fork = await s.api('POST', `/instances/${inst.id}/fork`, { checkpoint_id: cp.id });
    expect(fork.status).toBe(201);
    expect(fork.body.secrets).toEqual(inst.secrets);
    for (const id of [inst.id, fork.body.id]) {
      const r = await sh(id, 'curl -sS --max-time 20 -H "X-Key: $API_KEY" https://testhost.internal/record');
      expect(r.stdout + r.stderr).toBe('recorded\n');
    }
    expect((await seenByHost()).slice(-2).map((x) => x.headers['x-key'])).toEqual([SECRET, SECRET]);

    // A server restart: the rules come back from the store (sealed there) with the sandboxes.
    const dataDir = s.dataDir;
    await s.close({ keepSandboxes: true });
    s = await startServer(config, dataDir, { logFile: LOG() });
    await sh(inst.id, 'curl -sS --max-time 20 -H "X-Key: $API_KEY" https://testhost.internal/record');
    expect((await seenByHost()).at(-1)!.headers['x-key']).toBe(SECRET);

    // A new value is in force at once.
    const next = `${SECRET}-2`;
    await s.api('PUT', '/secrets/API_KEY', { value: next });
    await sh(inst.id, 'curl -sS --max-time 20 -H "X-Key: $API_KEY" http://testhost.internal/record');
    expect((await seenByHost()).at(-1)!.headers['x-key']).toBe(next);
    await s.api('DELETE', `/instances/${fork.body.id}`);
    await s.api('DELETE', `/instances/${inst.id}`);
    await s.api('DELETE', '/secrets/API_KEY');
    const logAfter = await readFile(LOG(), 'utf8');
    for (const value of [SECRET, next]) expect(logAfter).not.toContain(value);
  }, 240_000);

  it('attack: the proxy takes nothing else: another Host, another TLS name, a host its policy closes, a sandbox with no rules', async () => {
    await s.api('PUT', '/secrets/TOKEN', { value: SECRET });
    const inst = await s.instance({ image: 'debian', network: { egress: 'allow', allow: ['172.16.0.0/12'] }, secrets: [{ name: 'TOKEN', hosts: ['testhost.internal'] }] });
    const gateway = (await sh(inst.id, "awk '/nameserver/ {print $2}' /etc/resolv.conf")).stdout.trim();
    // A Host the rule does not name, sent to the proxy's address: refused, nothing forwarded.
    const before = (await seenByHost()).length;
    const otherHost = await sh(inst.id, `curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -H "Host: 172.16.0.1" -H "X-Key: $TOKEN" http://testhost.internal/record`);
    expect(otherHost.stdout).toBe('403');
    // A proxy-style absolute URL (another host in the request line, the rule's in Host): refused.
    const absolute = await sh(inst.id, `curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -x http://testhost.internal:80 -H "Host: testhost.internal" -H "X-Key: $TOKEN" http://172.16.0.1/record`);
    expect(absolute.stdout).toBe('400');
    // A TLS handshake started and never ended: the proxy closes the connection (HANDSHAKE_TIMEOUT_MS).
    const stalled = await s.exec(inst.id, { command: ['bash', '-c', 'exec 3<>/dev/tcp/testhost.internal/443 && timeout 30 cat <&3; echo "exit=$?"'], timeout_ms: 40_000 });
    expect(stalled.stdout).toContain('exit=0');
    // A TLS name with no rule: the handshake fails (no certificate is made for it).
    const otherName = await sh(inst.id, `curl -sS --max-time 20 --resolve evil.example:443:${gateway} https://evil.example/record 2>&1; echo "exit=$?"`);
    expect(otherName.stdout).not.toContain('exit=0');
    // The right TLS name with another Host inside: refused.
    const smuggled = await sh(inst.id, `curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -H "Host: other.testhost.internal" https://testhost.internal/record`);
    expect(smuggled.stdout).toBe('421');
    expect((await seenByHost()).length).toBe(before);

    // The same rule on an instance whose policy closes the host: the proxy does not open it.
    const closed = await s.instance({ image: 'debian', network: { egress: 'deny', allow: [] }, secrets: [{ name: 'TOKEN', hosts: ['testhost.internal'] }] });
    const refused = await sh(closed.id, `curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -H "X-Key: $TOKEN" http://testhost.internal/record`);
    expect(refused.stdout).toBe('403');
    // A sandbox with no rules cannot use the proxy's ports at all.
    const plain = await s.instance({ image: 'debian', network: { egress: 'allow', allow: ['172.16.0.0/12'] } });
    const direct = await sh(plain.id, `curl -sS --max-time 5 --resolve testhost.internal:80:${gateway} http://testhost.internal/record 2>&1; echo "exit=$?"`);
    expect(direct.stdout).not.toContain('exit=0');
    expect((await seenByHost()).length).toBe(before);
    for (const i of [inst, closed, plain]) await s.api('DELETE', `/instances/${i.id}`);
    await s.api('DELETE', '/secrets/TOKEN');
  });

  it('OpenComputer\'s secret stores, through its published SDK: osb_sealed_ placeholders replaced for the secret\'s hosts, user variables plain, the store\'s allowlist applied, refused with a snapshot, values never shown back', async () => {
    const opts = { apiUrl: s.url, apiKey: s.token };
    const store = await SecretStore.create({ ...opts, name: 'prod', egressAllowlist: ['testhost.internal', '*.testhost.internal'] });
    expect(store).toMatchObject({ name: 'prod', egressAllowlist: ['testhost.internal', '*.testhost.internal'] });
    await expect(SecretStore.create({ ...opts, name: 'prod' })).rejects.toThrow(/409/);
    await SecretStore.setSecret(store.id, 'STORE_KEY', SECRET, { ...opts, allowedHosts: ['testhost.internal'] });
    await SecretStore.setSecret(store.id, 'ANY_KEY', `${SECRET}-any`, opts); // no hosts of its own: the allowlist's
    const listed = await SecretStore.listSecrets(store.id, opts);
    expect(listed.map((e) => [e.name, e.allowedHosts])).toEqual([['ANY_KEY', []], ['STORE_KEY', ['testhost.internal']]]);
    expect(JSON.stringify([listed, await SecretStore.list(opts), await SecretStore.get(store.id, opts)])).not.toContain(SECRET);

    const sb = await OcSandbox.create({ ...opts, secretStore: 'prod', envs: { USER_VAR: 'plain' } });
    const vars = (await sb.exec.run('printf "%s %s %s" "$USER_VAR" "$STORE_KEY" "$ANY_KEY"')).stdout.split(' ');
    expect(vars[0]).toBe('plain');
    expect(vars[1]).toMatch(/^osb_sealed_[0-9a-f]{32}$/);
    expect(vars[2]).toMatch(/^osb_sealed_[0-9a-f]{32}$/);
    const hosts = (await request(`${s.url}/api/sandboxes/${sb.sandboxId}/allowed-hosts`, { headers: { 'x-api-key': s.token } })).body;
    expect(await hosts.json()).toMatchObject({ egressAllowlist: ['testhost.internal', '*.testhost.internal'], perSecretAllowedHosts: { STORE_KEY: ['testhost.internal'], ANY_KEY: ['testhost.internal', '*.testhost.internal'] } });
    const before = (await seenByHost()).length;
    const r = await sb.exec.run('curl -sS --max-time 20 -H "x-key: $STORE_KEY" -H "x-any: $ANY_KEY" https://testhost.internal/record && curl -sS --max-time 20 -H "x-key: $STORE_KEY" http://other.testhost.internal/record');
    expect(r.stdout + r.stderr).toBe('recorded\nrecorded\n');
    const seen = (await seenByHost()).slice(before);
    expect(seen.map((x) => [x.host, x.headers['x-key'], x.headers['x-any']])).toEqual([
      ['testhost.internal', SECRET, `${SECRET}-any`],
      ['other.testhost.internal', vars[1], undefined],
    ]);
    // A new value is in force at once for the sandboxes made with the store.
    const renewed = await request(`${s.url}/api/secret-stores/${store.id}/secrets/STORE_KEY`, { method: 'PUT', headers: { 'x-api-key': s.token, 'content-type': 'application/json' }, body: JSON.stringify({ value: `${SECRET}-2`, allowedHosts: ['testhost.internal'] }) });
    expect(await renewed.body.json()).toEqual({ name: 'STORE_KEY', status: 'set', refreshed: 1 });
    await sb.exec.run('curl -sS --max-time 20 -H "x-key: $STORE_KEY" https://testhost.internal/record');
    expect((await seenByHost()).at(-1)!.headers['x-key']).toBe(`${SECRET}-2`);
    // The store's allowlist is the sandbox's egress: nothing else is reachable.
    expect((await sb.exec.run(`curl -sS --max-time 5 http://${net.address}/record`)).exitCode).not.toBe(0);
    // A snapshot's sandboxes keep the secrets it was made with: the store cannot be named beside it.
    await sb.createCheckpoint('with-store');
    const snap = await s.api('POST', '/templates', { name: 'oc-snap', from_checkpoint: (await sb.listCheckpoints())[0]!.id });
    expect(snap.status, JSON.stringify(snap.body)).toBe(201);
    const both = await s.api('POST', '/api/sandboxes', { snapshot: 'oc-snap', secretStore: 'prod' });
    expect([both.status, both.body.error]).toEqual([400, expect.stringMatching(/secretStore cannot be given with a snapshot/)]);
    expect((await s.api('POST', '/api/sandboxes', { secretStore: 'nowhere' })).status).toBe(404);
    await sb.kill();
    await s.api('DELETE', '/templates/oc-snap');
    await SecretStore.deleteSecret(store.id, 'ANY_KEY', opts);
    await SecretStore.delete(store.id, opts);
    expect(await SecretStore.list(opts)).toEqual([]);
  });

  it('refuse what is not theirs or not well formed: 404 for another owner\'s secret, 400 for bad names, values and hosts', async () => {
    await s.api('PUT', '/secrets/MINE', { value: 'v' });
    const { token } = await s.fp.store.tokens.create('someone-else', 'secrets test');
    const other = { authorization: `Bearer ${token}` };
    expect((await s.api('POST', '/instances', { secrets: [{ name: 'MINE', hosts: ['example.com'] }] }, other)).status).toBe(404);
    expect((await s.api('GET', '/secrets', undefined, other)).body.items).toEqual([]);
    expect((await s.api('DELETE', '/secrets/MINE', undefined, other)).status).toBe(404);
    expect((await s.api('PUT', '/secrets/1bad', { value: 'v' })).status).toBe(400);
    expect((await s.api('PUT', '/secrets/LINE', { value: 'a\r\nX-Injected: 1' })).status).toBe(400);
    for (const hosts of [[], ['10.0.0.1'], ['not a host']]) {
      expect((await s.api('POST', '/instances', { secrets: [{ name: 'MINE', hosts }] })).status, JSON.stringify(hosts)).toBe(400);
    }
    expect((await s.api('GET', '/instances')).body.items).toEqual([]);
    await s.api('DELETE', '/secrets/MINE');
  });

  it('from the command line: secret set from stdin, secret ls, create --secret, secret rm', async () => {
    const env = { ...(process.env as Record<string, string>), FORKPOINT_URL: s.url, FORKPOINT_TOKEN: s.token, XDG_CONFIG_HOME: join(work, 'config'), NO_COLOR: '1' };
    const fp = (args: string[], input?: string) => execa(process.execPath, [CLI, ...args], { env, reject: false, ...(input !== undefined ? { input } : {}) });
    const set = await fp(['secret', 'set', 'CLI_KEY'], `${SECRET}\n`);
    expect(set.exitCode, set.stderr).toBe(0);
    const ls = await fp(['secret', 'ls']);
    expect(ls.stdout).toMatch(/^NAME\s+CREATED\s+UPDATED\n.*CLI_KEY/s);
    expect(ls.stdout).not.toContain(SECRET);
    const made = await fp(['create', '--secret', 'CLI_KEY=testhost.internal,*.example.com']);
    expect(made.exitCode, made.stderr).toBe(0);
    const id = made.stdout.trim();
    expect((await s.api('GET', `/instances/${id}`)).body.secrets).toEqual([{ name: 'CLI_KEY', env: 'CLI_KEY', hosts: ['testhost.internal', '*.example.com'] }]);
    expect((await sh(id, 'printf %s "$CLI_KEY"')).stdout).toMatch(/^fpsecret_/);
    expect((await fp(['rm', id])).exitCode).toBe(0);
    expect((await fp(['secret', 'rm', 'CLI_KEY'])).stdout).toBe('CLI_KEY');
    expect((await fp(['create', '--secret', 'no-hosts'])).exitCode).toBe(2);
  });
});
