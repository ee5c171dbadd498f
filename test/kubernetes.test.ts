import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';

const run = promisify(execFile);
const DIR = new URL('../deploy/kubernetes/', import.meta.url).pathname;

interface Manifest {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string };
  [key: string]: unknown;
}

/** What `kubectl kustomize` makes of a directory: the objects `kubectl apply -k` would send. */
async function render(dir: string): Promise<Manifest[]> {
  const { stdout } = await run('kubectl', ['kustomize', dir], { timeout: 60_000 });
  return parseAllDocuments(stdout).map((d) => d.toJS() as Manifest);
}

/** kustomize folds long base64 values over lines, which the API server's decoder (Go's)
 * ignores and the schema's `byte` format does not: compared unfolded. */
function unfolded(m: Manifest): Manifest {
  if (m.kind !== 'Secret' || !m.data) return m;
  const data = Object.fromEntries(Object.entries(m.data as Record<string, string>).map(([k, v]) => [k, v.replace(/\s+/g, '')]));
  return { ...m, data };
}

/** Checks an object against the Kubernetes API's schema of its kind (kubernetes-models carries
 * the API's OpenAPI schemas): throws on a field that is wrong or missing. */
async function validate(m: Manifest): Promise<void> {
  const mod = (await import(`kubernetes-models/${m.apiVersion}/${m.kind}`)) as Record<string, new (d: unknown) => { validate(): void }>;
  const Model = mod[m.kind] ?? mod.default;
  if (!Model) throw new Error(`no schema for ${m.apiVersion} ${m.kind}`);
  new Model(unfolded(m)).validate();
}

describe('Kubernetes manifests', () => {
  it('render with kubectl kustomize and validate against the API schemas', async () => {
    for (const dir of [DIR, `${DIR}example`]) {
      const objects = await render(dir);
      expect(objects.length).toBeGreaterThan(3);
      for (const m of objects) await expect(validate(m), `${dir}: ${m.kind} ${m.metadata.name}`).resolves.toBeUndefined();
    }
  });

  it('the validation has teeth: a wrong field fails it', async () => {
    const [ds] = (await render(DIR)).filter((m) => m.kind === 'DaemonSet');
    const broken = structuredClone(ds!) as Manifest & { spec: { template: { spec: { containers: { ports: { containerPort: unknown }[] }[] } } } };
    broken.spec.template.spec.containers[0]!.ports[0]!.containerPort = 'seven';
    await expect(validate(broken)).rejects.toThrow();
  });

  it('the example is whole: every secret and config the nodes read is in it, in one namespace', async () => {
    const objects = await render(`${DIR}example`);
    const names = new Set(objects.map((m) => `${m.kind}/${m.metadata.name}`));
    const text = JSON.stringify(objects.find((m) => m.kind === 'DaemonSet'));
    const refs = [...text.matchAll(/"secretKeyRef":\{"key":"[^"]+","name":"([^"]+)"\}|"secretKeyRef":\{"name":"([^"]+)"/g)].map((r) => r[1] ?? r[2]);
    expect(refs.length).toBe(3);
    for (const r of refs) expect(names.has(`Secret/${r}`), r).toBe(true);
    const configs = [...text.matchAll(/"configMapRef":\{"name":"([^"]+)"\}/g)].map((r) => r[1]);
    for (const c of configs) expect(names.has(`ConfigMap/${c}`), c).toBe(true);
    expect(new Set(objects.filter((m) => m.kind !== 'Namespace').map((m) => m.metadata.namespace))).toEqual(new Set(['forkpoint']));
  });
});
