import { mkdir, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { answer, Api, CliError, loginFile, resolveTarget, sseEvents, type TargetFlags } from './api.js';
import { ago, bytes, printJson, status, table, tree, type TreeNode } from './format.js';

/** The client commands: each talks to a server through its API, prints a table (or `--json`),
 * and ends with a meaningful status. */

export interface Common extends TargetFlags {
  json?: boolean | undefined;
}

interface Instance {
  id: string;
  name: string;
  image: string;
  status: string;
  network: { address: string | null } | null;
  created_at: string;
}
interface Checkpoint {
  id: string;
  label: string | null;
  status: string;
  memory: boolean;
  pause_ms: number | null;
  delta_bytes: number | null;
  memory_bytes: number | null;
  error: string | null;
  created_at: string;
}

const api = (o: Common) => new Api(resolveTarget(o));
const enc = encodeURIComponent;

async function all<T>(a: Api, path: string): Promise<T[]> {
  const items: T[] = [];
  for (let cursor: string | null = null; ; ) {
    const sep = path.includes('?') ? '&' : '?';
    const page: { items: T[]; next_cursor: string | null } = await a.call('GET', `${path}${sep}limit=100${cursor ? `&cursor=${enc(cursor)}` : ''}`);
    items.push(...page.items);
    cursor = page.next_cursor;
    if (!cursor) return items;
  }
}

export async function ls(o: Common): Promise<void> {
  const items = await all<Instance>(api(o), '/instances');
  if (o.json) return printJson(items);
  process.stdout.write(table(['ID', 'NAME', 'IMAGE', 'STATUS', 'ADDRESS', 'CREATED'], items.map((i) => [i.id, i.name, i.image, status(i.status), i.network?.address ?? '-', ago(i.created_at)])));
}

export interface CreateOptions extends Common {
  name?: string;
  image?: string;
  memory?: string;
  cpu?: string;
  pids?: string;
  disk?: string;
  env?: string[];
  egress?: string;
  allow?: string[];
  deny?: string[];
  user?: boolean;
  volume?: string[];
  secret?: string[];
}

/** `NAME=HOST[,HOST...]`: a secret and the hosts its requests carry it to. */
export function secretUsesOf(specs: string[] | undefined): { name: string; hosts: string[] }[] | undefined {
  if (!specs?.length) return undefined;
  return specs.map((spec) => {
    const m = /^([^=]+)=(.+)$/.exec(spec);
    if (!m) throw new CliError(`--secret: ${spec}: expected NAME=HOST[,HOST...]`, 'USAGE', 2);
    return { name: m[1]!, hosts: m[2]!.split(',') };
  });
}

/** `NAME:/PATH[:ro]` (Docker's -v for a named volume). */
export function volumeMountsOf(specs: string[] | undefined): { name: string; path: string; read_only?: boolean }[] | undefined {
  if (!specs?.length) return undefined;
  return specs.map((spec) => {
    const m = /^([^:]+):(\/[^:]*)(?::(ro|rw))?$/.exec(spec);
    if (!m) throw new CliError(`--volume: ${spec}: expected NAME:/PATH or NAME:/PATH:ro`, 'USAGE', 2);
    return { name: m[1]!, path: m[2]!, ...(m[3] === 'ro' ? { read_only: true } : {}) };
  });
}

const int = (v: string | undefined, flag: string) => {
  if (v === undefined) return undefined;
  if (!/^\d+$/.test(v)) throw new CliError(`${flag}: not a whole number: ${v}`, 'USAGE', 2);
  return Number(v);
};

export function keyValues(list: string[] | undefined, flag: string): Record<string, string> | undefined {
  if (!list?.length) return undefined;
  return Object.fromEntries(
    list.map((kv) => {
      const at = kv.indexOf('=');
      if (at <= 0) throw new CliError(`${flag}: not NAME=VALUE: ${kv}`, 'USAGE', 2);
      return [kv.slice(0, at), kv.slice(at + 1)];
    }),
  );
}

export async function create(o: CreateOptions): Promise<void> {
  const limits = { memory_mb: int(o.memory, '--memory'), cpu_percent: int(o.cpu, '--cpu'), pids: int(o.pids, '--pids'), disk_mb: int(o.disk, '--disk') };
  const network = o.egress || o.allow || o.deny ? { egress: o.egress, allow: o.allow, deny: o.deny } : undefined;
  const inst = await api(o).call<Instance>('POST', '/instances', {
    name: o.name,
    image: o.image,
    env: keyValues(o.env, '--env'),
    limits: Object.values(limits).some((v) => v !== undefined) ? limits : undefined,
    network,
    volumes: volumeMountsOf(o.volume),
    secrets: secretUsesOf(o.secret),
  });
  if (o.json) return printJson(inst);
  process.stdout.write(`${inst.id}\n`);
}

export async function rm(ids: string[], o: Common): Promise<void> {
  await deleteEach(ids, (id) => `/instances/${enc(id)}`, o);
}

/** DELETEs each one, printing what went; one that fails is said and the rest go on. */
async function deleteEach(names: string[], pathOf: (name: string) => string, o: Common): Promise<void> {
  const a = api(o);
  let failed = 0;
  for (const name of names) {
    try {
      await a.call('DELETE', pathOf(name));
      if (!o.json) process.stdout.write(`${name}\n`);
    } catch (err) {
      failed++;
      process.stderr.write(`forkpoint: ${name}: ${lineOf(err)}\n`);
    }
  }
  if (o.json) printJson({ removed: names.length - failed, failed });
  if (failed) process.exitCode = 1;
}

export async function lifecycle(action: 'hibernate' | 'wake' | 'stop' | 'start', id: string, o: Common): Promise<void> {
  const inst = await api(o).call<Instance>('POST', `/instances/${enc(id)}/${action}`);
  if (o.json) return printJson(inst);
  process.stdout.write(`${inst.id} ${status(inst.status)}\n`);
}

export interface CheckpointOptions extends Common {
  label?: string;
  memory?: boolean;
}

/** Takes a checkpoint and follows it until it is ready or failed (exit 1), on one line. */
export async function checkpoint(id: string, o: CheckpointOptions): Promise<void> {
  const a = api(o);
  const started = Date.now();
  const c = await a.call<Checkpoint>('POST', `/instances/${enc(id)}/checkpoints`, { label: o.label, memory: o.memory });
  const tty = process.stderr.isTTY && !o.json;
  if (tty) process.stderr.write(`${c.id} processing…`);
  let done = c;
  while (done.status === 'processing') {
    done = await a.call<Checkpoint>('GET', `/instances/${enc(id)}/checkpoints/${enc(c.id)}?wait=true`);
    if (tty && done.status === 'processing') process.stderr.write(`\r${c.id} processing… ${((Date.now() - started) / 1000).toFixed(1)} s`);
  }
  if (tty) process.stderr.write('\r\x1b[K');
  if (o.json) printJson(done);
  else process.stdout.write(done.status === 'ready' ? `${done.id} ${status('ready')} (paused ${done.pause_ms ?? '-'} ms, ${bytes(done.delta_bytes)} of files${done.memory ? `, ${bytes(done.memory_bytes)} of memory` : ''})\n` : `${done.id} ${status(done.status)}: ${done.error ?? ''}\n`);
  if (done.status !== 'ready') process.exitCode = 1;
}

export async function checkpoints(id: string, o: Common): Promise<void> {
  const items = await all<Checkpoint>(api(o), `/instances/${enc(id)}/checkpoints`);
  if (o.json) return printJson(items);
  process.stdout.write(table(['ID', 'LABEL', 'STATUS', 'MEMORY', 'PAUSE', 'FILES', 'CREATED'], items.map((c) => [c.id, c.label ?? '-', status(c.status), c.memory ? bytes(c.memory_bytes) : 'no', c.pause_ms !== null ? `${c.pause_ms} ms` : '-', bytes(c.delta_bytes), ago(c.created_at)])));
}

export async function rollback(id: string, checkpointId: string, o: Common): Promise<void> {
  const inst = await api(o).call<Instance>('POST', `/instances/${enc(id)}/rollback`, { checkpoint_id: checkpointId });
  if (o.json) return printJson(inst);
  process.stdout.write(`${inst.id} ${status(inst.status)} at ${checkpointId}\n`);
}

export interface ForkOptions extends Common {
  count?: string;
  name?: string;
}

export async function fork(id: string, checkpointId: string | undefined, o: ForkOptions): Promise<void> {
  const count = int(o.count, '--count') ?? 1;
  const body = { checkpoint_id: checkpointId, name: o.name, ...(count > 1 ? { count } : {}) };
  const r = await api(o).call<Instance | { instances: Instance[] }>('POST', `/instances/${enc(id)}/fork`, body);
  const made = 'instances' in r ? r.instances : [r];
  if (o.json) return printJson(made);
  for (const i of made) process.stdout.write(`${i.id}\n`);
}

export async function lineage(id: string, o: Common): Promise<void> {
  const root = await api(o).call<TreeNode>('GET', `/instances/${enc(id)}/lineage`);
  if (o.json) return printJson(root);
  process.stdout.write(tree(root));
}

export interface EventsOptions extends Common {
  follow?: boolean;
}

/** An instance's events: the ones kept, then (`--follow`) as they happen. */
export async function events(id: string, o: EventsOptions): Promise<void> {
  const a = api(o);
  const stop = new AbortController();
  const res = await a.raw('GET', `/instances/${enc(id)}/events`, { headers: { accept: 'text/event-stream', 'last-event-id': '0' }, signal: stop.signal });
  if (res.status >= 400) await answer(res);
  // Without --follow: what the server kept, then done once nothing has come for a moment.
  let idle: NodeJS.Timeout | undefined;
  const quiet = () => {
    clearTimeout(idle);
    if (!o.follow) idle = setTimeout(() => stop.abort(), 500);
  };
  quiet();
  try {
    for await (const e of sseEvents(res)) {
      quiet();
      const v = JSON.parse(e.data) as { type: string; at: string; data: unknown };
      process.stdout.write(o.json ? `${e.data}\n` : `${v.at}  ${v.type}  ${JSON.stringify(v.data)}\n`);
    }
  } catch (err) {
    if (o.follow) throw err; // our own destroy ends a read without --follow
  } finally {
    clearTimeout(idle);
  }
}

export async function images(o: Common): Promise<void> {
  const r = await api(o).call<{ images: { name: string; kind: string; base: string | null; layers: number; created_at: string }[] }>('GET', '/images');
  if (o.json) return printJson(r.images);
  process.stdout.write(table(['NAME', 'KIND', 'BASE', 'LAYERS', 'CREATED'], r.images.map((i) => [i.name, i.kind, i.base ?? '-', String(i.layers), ago(i.created_at)])));
}

/** A password from standard input (never a flag: flags are in the process list and the shell's
 * history), with the user name it goes with. */
/** What is piped in, without its last line break (a password, a secret's value). */
async function stdinValue(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8').replace(/\r?\n$/, '');
}

async function passwordOf(o: { username?: string; passwordStdin?: boolean }): Promise<string | undefined> {
  const password = o.passwordStdin ? await stdinValue() : undefined;
  if ((o.username === undefined) !== (password === undefined)) throw new CliError('--username and --password-stdin go together', 'USAGE', 2);
  return password;
}

/** Pulls an image from a registry into the server, as `docker pull` does: its progress on
 * standard error as it goes, the image on standard output. */
export async function pull(reference: string, o: Common & { username?: string; passwordStdin?: boolean }): Promise<void> {
  const password = await passwordOf(o);
  const res = await api(o).raw('POST', '/images/pull', {
    headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify({ reference, username: o.username, password }),
  });
  if (res.status >= 400) await answer(res);
  let r: { image: { name: string }; digest: string; fetched_bytes: number } | undefined;
  for await (const e of sseEvents(res)) {
    if (e.event === 'pull_progress' && !o.json) {
      const p = JSON.parse(e.data) as { stage: string; message: string };
      process.stderr.write(`${p.stage}: ${p.message}\n`);
    } else if (e.event === 'result') {
      r = JSON.parse(e.data) as typeof r;
    } else if (e.event === 'error') {
      const err = JSON.parse(e.data) as { error: string; code: string };
      throw new CliError(err.error, err.code);
    }
  }
  if (!r) throw new CliError('the pull\'s stream ended without its result', 'STREAM_ENDED');
  if (o.json) return printJson(r);
  process.stdout.write(`${r.image.name}  ${r.digest}  (${r.fetched_bytes === 0 ? 'nothing fetched: all here already' : `fetched ${r.fetched_bytes} bytes`})\n`);
}

/** Keeps credentials for a registry on the server, for this owner's pulls (`docker login`). */
export async function registryLogin(registry: string, o: Common & { username?: string; passwordStdin?: boolean }): Promise<void> {
  if (!o.username || !o.passwordStdin) throw new CliError('registry login takes --username and --password-stdin', 'USAGE', 2);
  const r = await api(o).call<{ registry: string; username: string }>('PUT', `/registries/${enc(registry)}/login`, { username: o.username, password: await passwordOf(o) });
  if (o.json) return printJson(r);
  process.stdout.write(`kept credentials of ${r.username} for ${r.registry}\n`);
}

export async function registryLogout(registry: string, o: Common): Promise<void> {
  await api(o).call('DELETE', `/registries/${enc(registry)}/login`);
  if (!o.json) process.stdout.write(`forgot the credentials for ${registry}\n`);
}

export async function registries(o: Common): Promise<void> {
  const r = await api(o).call<{ items: { registry: string; username: string; created_at: string }[] }>('GET', '/registries');
  if (o.json) return printJson(r.items);
  process.stdout.write(table(['REGISTRY', 'USER', 'KEPT'], r.items.map((i) => [i.registry, i.username, ago(i.created_at)])));
}

interface VolumeInfo {
  name: string;
  size_mb: number;
  used_bytes: number | null;
  node: string;
  instances: string[];
  created_at: string;
}

export async function volumeCreate(name: string, o: Common & { size?: string }): Promise<void> {
  const sizeMb = int(o.size, '--size');
  if (sizeMb === undefined) throw new CliError('volume create takes --size MB', 'USAGE', 2);
  const v = await api(o).call<VolumeInfo>('POST', '/volumes', { name, size_mb: sizeMb });
  if (o.json) return printJson(v);
  process.stdout.write(`${v.name}\n`);
}

export async function volumes(o: Common): Promise<void> {
  const r = await api(o).call<{ items: VolumeInfo[] }>('GET', '/volumes');
  if (o.json) return printJson(r.items);
  process.stdout.write(table(['NAME', 'SIZE', 'USED', 'INSTANCES', 'CREATED'], r.items.map((v) => [v.name, bytes(v.size_mb * 1048576), v.used_bytes === null ? '-' : bytes(v.used_bytes), String(v.instances.length), ago(v.created_at)])));
}

export async function volumeInspect(name: string, o: Common): Promise<void> {
  printJson(await api(o).call<VolumeInfo>('GET', `/volumes/${enc(name)}`));
}

export async function secretSet(name: string, o: Common): Promise<void> {
  if (process.stdin.isTTY) throw new CliError('secret set reads the value from stdin: forkpoint secret set NAME < file', 'USAGE', 2);
  const r = await api(o).call<{ name: string }>('PUT', `/secrets/${enc(name)}`, { value: await stdinValue() });
  if (o.json) return printJson(r);
  process.stdout.write(`${r.name}\n`);
}

export async function secrets(o: Common): Promise<void> {
  const r = await api(o).call<{ items: { name: string; created_at: string; updated_at: string }[] }>('GET', '/secrets');
  if (o.json) return printJson(r.items);
  process.stdout.write(table(['NAME', 'CREATED', 'UPDATED'], r.items.map((x) => [x.name, ago(x.created_at), ago(x.updated_at)])));
}

export async function secretRm(names: string[], o: Common): Promise<void> {
  await deleteEach(names, (name) => `/secrets/${enc(name)}`, o);
}

export async function volumeRm(names: string[], o: Common): Promise<void> {
  await deleteEach(names, (name) => `/volumes/${enc(name)}`, o);
}

export async function templates(o: Common): Promise<void> {
  const r = await api(o).call<{ templates: { name: string; status: string; source: string | null; start_command: string | null; created_at: string }[] }>('GET', '/templates');
  if (o.json) return printJson(r.templates);
  process.stdout.write(table(['NAME', 'STATUS', 'SOURCE', 'START', 'CREATED'], r.templates.map((t) => [t.name, status(t.status), t.source ?? '-', t.start_command ?? '-', ago(t.created_at)])));
}

export async function ports(id: string, o: Common): Promise<void> {
  const r = await api(o).call<{ port_forwards: { id: string; guest_port: number; host_port: number; label: string | null }[] }>('GET', `/instances/${enc(id)}/port-forwards`);
  if (o.json) return printJson(r.port_forwards);
  process.stdout.write(table(['ID', 'GUEST', 'HOST', 'LABEL'], r.port_forwards.map((p) => [p.id, String(p.guest_port), String(p.host_port), p.label ?? '-'])));
}

export async function preview(id: string, port: string, o: Common & { ttl?: string }): Promise<void> {
  const r = await api(o).call<{ url: string; expires_at: string }>('POST', `/instances/${enc(id)}/ports/${enc(port)}/preview`, { ttl_s: int(o.ttl, '--ttl') });
  if (o.json) return printJson(r);
  process.stdout.write(`${r.url}\n`);
}

/** Checks the URL and token against the server, then keeps them for later commands (0600). */
export async function login(o: Common): Promise<void> {
  let token = o.token ?? process.env.FORKPOINT_TOKEN;
  if (!token && process.stdin.isTTY) {
    const { createInterface } = await import('node:readline/promises');
    const rl = createInterface({ input: process.stdin, output: process.stderr });
    token = (await rl.question('API token: ')).trim();
    rl.close();
  }
  const target = resolveTarget({ url: o.url, token });
  await new Api(target).call('GET', '/instances?limit=1');
  const file = loginFile();
  await mkdir(dirname(file), { recursive: true, mode: 0o700 });
  await writeFile(file, `${JSON.stringify(target, null, 2)}\n`, { mode: 0o600 });
  if (o.json) return printJson({ url: target.url, file });
  process.stdout.write(`logged in to ${target.url} (kept in ${file})\n`);
}

/** An error as the one line the user sees: the server's code and its message. */
export function lineOf(err: unknown): string {
  if (err instanceof CliError) return err.code === 'USAGE' ? err.message : `${err.code}: ${err.message}`;
  return (err as Error).message;
}
