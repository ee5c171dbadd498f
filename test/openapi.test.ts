import { readFile } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';
import { openApiText } from '../src/cli.js';

describe('OpenAPI', () => {
  it.each([
    ['openapi.json', '3.1.0'],
    ['openapi-3.0.json', '3.0.3'],
  ] as const)('the committed openapi/%s matches the routes (regenerate: npm run openapi)', async (file, version) => {
    const committed = await readFile(new URL(`../openapi/${file}`, import.meta.url), 'utf8');
    expect(JSON.parse(committed)).toEqual(JSON.parse(await openApiText(version)));
  });
});
