/**
 * The client swagger-codegen 3.0.34 (typescript-fetch, with the wire's snake_case property names;
 * it reads only OpenAPI 3.0) generated from openapi/openapi-3.0.json: create, exec, checkpoint,
 * fork, delete. Compiled and run by test/clients.test.ts with FP_URL and FP_TOKEN.
 */
import { CheckpointsApi, ExecApi, InstancesApi } from './codegen/api';
import { Configuration } from './codegen/configuration';

const { FP_URL, FP_TOKEN } = process.env;
if (!FP_URL || !FP_TOKEN) throw new Error('FP_URL and FP_TOKEN are needed');
const config = new Configuration({ apiKey: FP_TOKEN });
const instances = new InstancesApi(config, FP_URL);
const exec = new ExecApi(config, FP_URL);
const checkpoints = new CheckpointsApi(config, FP_URL);

async function main(): Promise<void> {
  const inst = await instances.createInstance({ name: 'codegen' });
  if (String(inst.status) !== 'running') throw new Error(`not running: ${inst.status}`);
  const r = await exec.execCommand({ command: 'echo from-3.0 > /root/f; cat /root/f' }, inst.id);
  if (r.stdout !== 'from-3.0\n' || r.exit_code !== 0) throw new Error(`exec: ${JSON.stringify(r)}`);
  const ck = await checkpoints.createCheckpoint(inst.id, { label: 'codegen' }, true);
  if (String(ck.status) !== 'ready') throw new Error(`checkpoint: ${JSON.stringify(ck)}`);
  const fork = (await checkpoints.forkInstance(inst.id, { checkpoint_id: ck.id })) as unknown as { id: string };
  const f = await exec.execCommand({ command: 'cat /root/f' }, fork.id);
  if (f.stdout !== 'from-3.0\n') throw new Error(`fork: ${JSON.stringify(f)}`);
  await instances.deleteInstance(fork.id);
  await instances.deleteInstance(inst.id);
  console.log('codegen 3.0 client: ok (create, exec, checkpoint, fork, delete)');
}
main().catch((err: unknown) => {
  console.error(err instanceof Response ? `HTTP ${err.status}` : err);
  process.exit(1);
});
