/**
 * A short journey through the OpenComputer-compatible face, on the SDK @hey-api/openapi-ts
 * generated from the committed document (./hey), nothing else: create, run, files, checkpoint,
 * restore, a sandbox from the checkpoint, errors in OpenComputer's envelope, kill. Every answer
 * is checked against the document. Run by test/clients.test.ts with FP_URL, FP_TOKEN, FP_DOC.
 */
import { client } from './hey/client.gen.js';
import {
  ocCreateCheckpoint, ocCreateFromCheckpoint, ocCreateSandbox, ocGetSandbox, ocKillSandbox, ocListCheckpoints, ocReadFile,
  ocRestoreCheckpoint, ocRunCommand, ocWriteFile,
} from './hey/sdk.gen.js';
import { DocumentValidator } from './validate.js';

const { FP_URL, FP_TOKEN, FP_DOC } = process.env;
if (!FP_URL || !FP_TOKEN || !FP_DOC) throw new Error('FP_URL, FP_TOKEN and FP_DOC are needed');

const doc = new DocumentValidator(FP_DOC);
client.setConfig({ baseUrl: FP_URL, auth: () => FP_TOKEN });
client.interceptors.response.use(async (response, request) => {
  const url = new URL(request.url);
  const template = Object.keys(doc.doc.paths as Record<string, unknown>).find((t) =>
    new RegExp(`^${t.replace(/\{[^}]+\}/g, '[^/]+')}$`).test(url.pathname),
  );
  if (!template) throw new Error(`${url.pathname} is not in the document`);
  const type = response.headers.get('content-type') ?? '';
  const body = type.includes('json') ? await response.clone().json() : await response.clone().text();
  doc.check(request.method, template, response.status, type, response.status === 204 ? undefined : body);
  return response;
});

function same(a: unknown, b: unknown, what: string): void {
  if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(`${what}: ${JSON.stringify(a)} is not ${JSON.stringify(b)}`);
}
function ok<T>(r: { data?: T; error?: unknown; response?: Response }, status: number): T {
  if (r.response?.status !== status) throw new Error(`expected ${status}, got ${r.response?.status}: ${JSON.stringify(r.error)}`);
  return r.data as T;
}

const sb = ok(await ocCreateSandbox({ body: { templateID: 'base', envs: { A: '1' } } }), 201);
same(sb.status, 'running', 'a new sandbox runs');
const id = sb.sandboxID;
same(ok(await ocRunCommand({ path: { id }, body: { cmd: 'sh', args: ['-c', 'echo $A'] } }), 200), { exitCode: 0, stdout: '1\n', stderr: '' }, 'run');
ok(await ocWriteFile({ path: { id }, query: { path: '/work/a.txt' }, body: new Blob(['hello']) }), 204);
const cp = ok(await ocCreateCheckpoint({ path: { id }, body: { name: 'before' } }), 201);
for (let i = 0; i < 100; i++) {
  const all = ok(await ocListCheckpoints({ path: { id } }), 200);
  if (all.find((c) => c.id === cp.id)?.status === 'ready') break;
  await new Promise((r) => setTimeout(r, 100));
}
ok(await ocWriteFile({ path: { id }, query: { path: '/work/a.txt' }, body: new Blob(['changed']) }), 204);
ok(await ocRestoreCheckpoint({ path: { id, checkpointId: cp.id } }), 200);
const read = ok(await ocReadFile({ path: { id }, query: { path: '/work/a.txt' }, parseAs: 'text' }), 200);
same(read, 'hello', 'restored in place');
const fork = ok(await ocCreateFromCheckpoint({ path: { checkpointId: cp.id }, body: { envs: { B: '2' } } }), 201);
same(ok(await ocRunCommand({ path: { id: fork.sandboxID }, body: { cmd: 'sh', args: ['-c', 'echo $A$B; cat /work/a.txt'] } }), 200).stdout, '12\nhello', 'a sandbox from the checkpoint, with envs');
const missing = await ocGetSandbox({ path: { id: 'inst_doesnotexist0000' } });
same(missing.response?.status, 404, 'an unknown sandbox');
same(typeof (missing.error as { error?: unknown })?.error, 'string', 'OpenComputer\'s error envelope');
ok(await ocKillSandbox({ path: { id: fork.sandboxID } }), 204);
ok(await ocKillSandbox({ path: { id } }), 204);
console.log(`opencomputer journey: ok, ${doc.checked} answers checked against the document`);
