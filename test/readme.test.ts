/**
 * The README's curl walk-through shows real outputs: this runs its commands against a real
 * server and compares what they print with what the README says (ids, times and durations
 * aside). `UPDATE_README=1 npx vitest run test/readme.test.ts` writes a fresh run's outputs
 * into the README.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServer, type TestServer } from './helpers/server.js';

const README = new URL('../README.md', import.meta.url).pathname;
const START = '<!-- walkthrough: its outputs are kept true by test/readme.test.ts -->';
const FENCE = '```';

interface Step {
  command: string;
  output: string[];
}

/** The transcript between the marker and the end of its code block. */
function transcript(readme: string): { steps: Step[]; from: number; to: number } {
  const at = readme.indexOf(START);
  if (at < 0) throw new Error('README has no walkthrough marker');
  const from = readme.indexOf('\n', readme.indexOf(FENCE, at)) + 1;
  const to = readme.indexOf(`\n${FENCE}`, from);
  const steps: Step[] = [];
  for (const line of readme.slice(from, to).split('\n')) {
    if (line.startsWith('$ ')) steps.push({ command: line.slice(2), output: [] });
    else if (steps.length && line.trim()) steps[steps.length - 1]!.output.push(line);
  }
  return { steps, from, to };
}

const VOLATILE = new Set(['created_at', 'updated_at', 'ready_at', 'duration_ms', 'pause_ms', 'delta_bytes', 'memory_bytes', 'version', 'address', 'sent_bytes', 'received_bytes', 'node']);

/** Output with what differs from run to run replaced: ids, times, durations, sizes. */
function normalize(text: string): unknown {
  const ids = text.replace(/\b(inst|ckpt|lyr)_[0-9a-z]{16}\b/g, '$1_*');
  try {
    return JSON.parse(ids, (key, value: unknown) => (VOLATILE.has(key) ? '*' : value));
  } catch {
    return ids;
  }
}

let s: TestServer;
beforeAll(async () => {
  s = await startServer();
});
afterAll(async () => s?.close());

describe('README', () => {
  it('the walk-through\'s outputs are what its commands print', async () => {
    const readme = await readFile(README, 'utf8');
    const { steps, from, to } = transcript(readme);
    expect(steps.length).toBeGreaterThan(8);
    const here = new URL(s.url).host;
    // One shell for the whole walk-through, so that variables carry from step to step; each
    // step's output is cut out between markers.
    const script = [
      `TOKEN=${s.token}`,
      `api() { curl -s -H "Authorization: Bearer $TOKEN" -H 'content-type: application/json' "$@"; echo; }`,
      ...steps.flatMap((step, i) => {
        const command = step.command.replaceAll('localhost:7878', here);
        const bind = /^(\w+)=(inst|ckpt)_…$/.exec(command);
        // `ID=inst_…` takes the id of that kind the step before printed.
        const run = bind ? `${bind[1]}=$(grep -o '${bind[2]}_[0-9a-z]\\{16\\}' /tmp/.fp-prev | head -1)` : `${command} | tee /tmp/.fp-prev`;
        return [`echo '@@step ${i}'`, run];
      }),
    ].join('\n');
    const r = await execa('bash', ['-c', script.replaceAll('/tmp/.fp-prev', `${s.dataDir}/.walkthrough-prev`)], { reject: false });
    expect(r.exitCode, r.stderr).toBe(0);
    const outputs = r.stdout.split(/^@@step \d+\n?/m).slice(1).map((o) => o.trim());
    expect(outputs).toHaveLength(steps.length);
    if (process.env.UPDATE_README) {
      // Addresses as a server on the default subnet (10.88.0.0/16) would give them.
      const subnet = s.engine.network.gateway.replace(/\.1$/, '.');
      const body = steps.map((st, i) => [`$ ${st.command}`, ...(outputs[i] ? [outputs[i]!.replaceAll(subnet, '10.88.0.')] : [])].join('\n')).join('\n');
      await writeFile(README, readme.slice(0, from) + body + readme.slice(to));
      return;
    }
    for (const [i, step] of steps.entries()) {
      expect(normalize(outputs[i]!), `$ ${step.command}\nprinted:\n${outputs[i]}`).toEqual(normalize(step.output.join('\n')));
    }
  });
});
