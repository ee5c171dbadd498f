import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The directory forkpoint is installed in (a checkout: package.json, native/, images/, deploy/,
 * dist/ui/): the nearest one above this module that holds package.json. Found, not assumed at a
 * fixed depth, because this module runs from src/ (tsx), from tsc's output in dist/ and from the
 * one-file bundle dist/cli.js, each at its own depth.
 */
export const PACKAGE_ROOT = ((): string => {
  const start = dirname(fileURLToPath(import.meta.url));
  for (let dir = start; ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    if (dirname(dir) === dir) throw new Error(`no package.json above ${start}: forkpoint's files are not where it runs from`);
  }
})();

/** A file of forkpoint's own installation, by its path from the root. */
export const packagePath = (...parts: string[]): string => join(PACKAGE_ROOT, ...parts);
