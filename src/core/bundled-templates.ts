import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import type { Logger } from 'pino';
import type { BuildService } from './build/builder.js';
import type { TemplateService } from './templates.js';

interface Bundled {
  /** The build context in this repository (a Dockerfile and its files). */
  dir: string;
  readyCommand: string;
}

/** Templates forkpoint ships as Dockerfiles and makes for an owner the first time it is asked
 * for one (a build, cached, then a template): E2B's code interpreter's. */
const BUNDLED: Record<string, Bundled> = {
  'code-interpreter': {
    dir: new URL('../../images/code-interpreter', import.meta.url).pathname,
    readyCommand: 'curl -sf http://127.0.0.1:49999/health',
  },
};

export class BundledTemplates {
  private readonly making = new Map<string, Promise<void>>();

  constructor(
    private readonly builds: BuildService,
    private readonly templates: TemplateService,
    private readonly log: Logger,
  ) {}

  has(name: string): boolean {
    return name in BUNDLED;
  }

  /**
   * Makes the owner's copy of a bundled template unless it is there, of this version of its
   * files: one made from older files (a server upgraded) is made again. A template of that name
   * the owner made from something else is theirs and left alone. Concurrent callers wait for
   * the same making.
   */
  async ensure(owner: string, name: string): Promise<void> {
    const b = BUNDLED[name];
    if (!b) return;
    const image = `${name}-${digestOf(b.dir)}`;
    const current = (await this.templates.list(owner)).find((t) => t.name === name);
    const ours = current?.source.startsWith(`image:${name}`) ?? false;
    if (current && (!ours || (current.source === `image:${image}` && current.status === 'ready'))) return;
    const key = `${owner}\n${name}`;
    let p = this.making.get(key);
    if (!p) {
      p = (async () => {
        this.log.info({ owner, template: name, image, replacing: current?.source ?? null }, 'making a bundled template');
        await this.builds.buildDockerfile(owner, { name: image, contextDir: b.dir });
        if (current) await this.templates.delete(owner, name);
        await this.templates.create(owner, { name, fromImage: image, readyCommand: b.readyCommand });
      })().finally(() => this.making.delete(key));
      this.making.set(key, p);
    }
    await p;
  }
}

/** A bundled template's version: the digest of its files (those in its directories too), paths
 * and contents; Python's byte-code caches aside. */
function digestOf(dir: string): string {
  const h = createHash('sha256');
  const files = readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && !relative(dir, e.parentPath).split(sep).includes('__pycache__'))
    .map((e) => relative(dir, join(e.parentPath, e.name)))
    .sort();
  for (const f of files) h.update(`${f}\0`).update(readFileSync(join(dir, f))).update('\0');
  return h.digest('hex').slice(0, 12);
}
