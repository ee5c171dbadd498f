import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { configEnvNames } from '../../src/config.js';

// The README's configuration table is the operators' reference: every setting is in it, under
// its file key and its environment variable, spelled out.
const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
const section = readme.slice(readme.indexOf('## Configuration'), readme.indexOf('\n## ', readme.indexOf('## Configuration') + 1));
const rows = section.split('\n').filter((l) => l.startsWith('| `'));
const cells = (i: number) => new Set(rows.flatMap((r) => [...(r.split('|')[i + 1] ?? '').matchAll(/`([^`]+)`/g)].map((m) => m[1]!)));

describe('the configuration table', () => {
  it('names every setting, with its environment variable', () => {
    const keys = cells(0);
    const envs = cells(1);
    expect(rows.length).toBeGreaterThan(20);
    for (const [key, env] of Object.entries(configEnvNames)) {
      expect(keys.has(key), `${key} in the table`).toBe(true);
      expect(envs.has(env), `${env} in the table`).toBe(true);
    }
  });
});
