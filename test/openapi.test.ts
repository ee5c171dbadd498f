import { readFile } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';
import { openApiDocument } from '../src/cli.js';

describe('OpenAPI', () => {
  it('the committed openapi/openapi.json matches the routes (regenerate: ./forkpoint openapi -o openapi/openapi.json)', async () => {
    const committed = await readFile(new URL('../openapi/openapi.json', import.meta.url), 'utf8');
    expect(JSON.parse(committed)).toEqual(JSON.parse(await openApiDocument()));
  });
});
