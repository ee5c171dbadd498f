import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { request } from 'undici';
import type { TestServer } from './server.js';

const SOURCE = new URL('../fixtures/attack.c', import.meta.url).pathname;
export const KIT = '/usr/local/bin/attack';

export interface AttackKit {
  /** The kit built for the host, to compare with what the same call does in a sandbox. */
  hostPath: string;
  binary: Buffer;
  cleanup(): Promise<void>;
}

/** Builds test/fixtures/attack.c as a static binary (set-up installs the compiler). */
export async function buildAttackKit(): Promise<AttackKit> {
  const dir = await mkdtemp(join(tmpdir(), 'forkpoint-attack-'));
  const hostPath = join(dir, 'attack');
  await execa('cc', ['-static', '-O2', '-o', hostPath, SOURCE]);
  return { hostPath, binary: await readFile(hostPath), cleanup: () => rm(dir, { recursive: true, force: true }) };
}

/** Copies the kit into a sandbox (through the API's file upload) as /usr/local/bin/attack. */
export async function installKit(s: TestServer, instanceId: string, kit: AttackKit): Promise<void> {
  const res = await request(`${s.url}/api/sandboxes/${instanceId}/files?path=${encodeURIComponent(KIT)}`, {
    method: 'PUT',
    headers: { 'x-api-key': s.token, 'content-type': 'application/octet-stream' },
    body: kit.binary,
  });
  await res.body.text();
  if (res.statusCode >= 300) throw new Error(`upload of the attack kit: ${res.statusCode}`);
  const r = await s.exec(instanceId, { command: `chmod 755 ${KIT}` });
  if (r.exit_code !== 0) throw new Error(`chmod: ${r.stderr}`);
}
