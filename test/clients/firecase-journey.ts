/**
 * A user's journey through the Firecase-style face, on a client generated from the committed
 * document by openapi-typescript (./schema.ts) and openapi-fetch, nothing else: create, exec,
 * a shell session, checkpoint, files, rollback, two isolated forks, lineage, paging, binary
 * files up and down, delete. Every answer is checked against the document. Run by
 * test/clients.test.ts with FP_URL, FP_TOKEN and FP_DOC.
 */
import { createHash, randomBytes } from 'node:crypto';
import createClient, { type Middleware } from 'openapi-fetch';
import type { paths } from './schema.js';
import { DocumentValidator } from './validate.js';

const { FP_URL, FP_TOKEN, FP_DOC } = process.env;
if (!FP_URL || !FP_TOKEN || !FP_DOC) throw new Error('FP_URL, FP_TOKEN and FP_DOC are needed');

const doc = new DocumentValidator(FP_DOC);
const checking: Middleware = {
  async onResponse({ request, response, schemaPath }) {
    const type = response.headers.get('content-type') ?? '';
    const body = type.includes('json') ? await response.clone().json() : await response.clone().text();
    doc.check(request.method, schemaPath, response.status, type, response.status === 204 ? undefined : body);
  },
};
const client = createClient<paths>({ baseUrl: FP_URL, headers: { authorization: `Bearer ${FP_TOKEN}` } });
client.use(checking);

function must<T>(r: { data?: T; error?: unknown; response: Response }, status: number): T {
  if (r.response.status !== status) throw new Error(`expected ${status}, got ${r.response.status}: ${JSON.stringify(r.error)}`);
  return r.data as T;
}
function same(a: unknown, b: unknown, what: string): void {
  if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(`${what}: ${JSON.stringify(a)} is not ${JSON.stringify(b)}`);
}
const inst = (id: string) => ({ params: { path: { id } } });

const created = must(await client.POST('/instances', { body: { name: 'journey', env: { GREETING: 'hello' } } }), 201);
same(created.status, 'running', 'a new instance runs');
const id = created.id;

const hi = must(await client.POST('/instances/{id}/exec', { ...inst(id), body: { command: 'echo $GREETING; echo oops >&2; exit 3' } }), 200);
same([hi.exit_code, hi.stdout, hi.stderr], [3, 'hello\n', 'oops\n'], 'exec');

must(await client.POST('/instances/{id}/exec', { ...inst(id), body: { command: 'cd /tmp && export MOOD=calm', session: 'main' } }), 200);
const sess = must(await client.POST('/instances/{id}/exec', { ...inst(id), body: { command: 'pwd; echo $MOOD', session: 'main' } }), 200);
same(sess.stdout, '/tmp\ncalm\n', 'a session keeps cwd and variables');

const ck = must(await client.POST('/instances/{id}/checkpoints', { ...inst(id), params: { path: { id }, query: { wait: true } }, body: { label: 'base' } }), 200);
same(ck.status, 'ready', 'checkpoint with wait');

const text = new TextEncoder().encode('written after the checkpoint\n');
must(await client.PUT('/instances/{id}/files', {
  params: { path: { id }, query: { path: '/root/after.txt' } },
  body: new Blob([text]),
  bodySerializer: (b) => b as Blob,
  headers: { 'content-type': 'application/octet-stream' },
}), 200);
must(await client.POST('/instances/{id}/exec', { ...inst(id), body: { command: 'cd / && export MOOD=angry', session: 'main' } }), 200);

const back = must(await client.POST('/instances/{id}/rollback', { ...inst(id), body: { checkpoint_id: ck.id } }), 200);
same(back.head_checkpoint_id, ck.id, 'rolled back onto the checkpoint');
must(await client.GET('/instances/{id}/files', { params: { path: { id }, query: { path: '/root/after.txt' } }, parseAs: 'arrayBuffer' }), 404);
same(must(await client.POST('/instances/{id}/exec', { ...inst(id), body: { command: 'pwd; echo $MOOD', session: 'main' } }), 200).stdout, '/tmp\ncalm\n', 'the session as it was');

const forks = must(await client.POST('/instances/{id}/fork', { ...inst(id), body: { checkpoint_id: ck.id, count: 2, name: 'twin' } }), 201);
if (!('instances' in forks)) throw new Error('with count the answer lists the instances');
const [a, b] = forks.instances;
same([a!.name, b!.name], ['twin-1', 'twin-2'], 'names with count are a prefix');
must(await client.POST('/instances/{id}/exec', { ...inst(a!.id), body: { command: 'echo only-a > /root/mine' } }), 200);
const inB = must(await client.POST('/instances/{id}/exec', { ...inst(b!.id), body: { command: 'cat /root/mine 2>/dev/null || echo absent; echo $MOOD', session: 'main' } }), 200);
same(inB.stdout, 'absent\ncalm\n', 'forks are isolated and carry the session');

const tree = must(await client.GET('/instances/{id}/lineage', inst(id)), 200);
const forkIds = tree.children.flatMap((c) => c.children.filter((x) => x.kind === 'instance').map((x) => x.id));
same(forkIds.sort(), [a!.id, b!.id].sort(), 'lineage shows the forks under the checkpoint');

const seen: string[] = [];
for (let cursor: string | undefined, pages = 0; pages < 50; pages++) {
  const page = must(await client.GET('/instances', { params: { query: { limit: 1, ...(cursor ? { cursor } : {}) } } }), 200);
  seen.push(...page.items.map((i) => i.id));
  if (!page.next_cursor) break;
  cursor = page.next_cursor;
}
for (const x of [id, a!.id, b!.id]) if (!seen.includes(x)) throw new Error(`paging missed ${x}`);

const blob = randomBytes(3 * 1024 * 1024 + 17);
const up = must(await client.PUT('/instances/{id}/files', {
  params: { path: { id: a!.id }, query: { path: '/srv/data/blob.bin' } },
  body: new Blob([blob]),
  bodySerializer: (x) => x as Blob,
  headers: { 'content-type': 'application/octet-stream' },
}), 200);
same(up.bytes, blob.length, 'bytes written');
const st = must(await client.GET('/instances/{id}/files/stat', { params: { path: { id: a!.id }, query: { path: '/srv/data/blob.bin' } } }), 200);
same([st.type, st.size], ['file', blob.length], 'stat');
const down = must(await client.GET('/instances/{id}/files', { params: { path: { id: a!.id }, query: { path: '/srv/data/blob.bin' } }, parseAs: 'arrayBuffer' }), 200) as unknown as ArrayBuffer;
const sha = (x: Uint8Array) => createHash('sha256').update(x).digest('hex');
same(sha(new Uint8Array(down)), sha(blob), 'the file comes back byte for byte');
const listing = must(await client.GET('/instances/{id}/files/list', { params: { path: { id: a!.id }, query: { path: '/srv/data' } } }), 200);
same(listing.items.map((e) => e.name), ['blob.bin'], 'list');

const gone = await client.GET('/instances/{id}', inst('inst_doesnotexist0000'));
same(gone.response.status, 404, 'an unknown instance');
same(gone.error?.error.code, 'NOT_FOUND', 'the error envelope');

for (const x of [a!.id, b!.id, id]) must(await client.DELETE('/instances/{id}', inst(x)), 204);
must(await client.GET('/instances/{id}', inst(id)), 404);
console.log(`firecase journey: ok, ${doc.checked} answers checked against the document`);
