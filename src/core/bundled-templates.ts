import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import type { Logger } from 'pino';
import type { BuildService } from './build/builder.js';
import { NotFoundError } from './errors.js';
import type { ImageCatalog } from './images.js';
import type { TemplateService } from './templates.js';
import { packagePath } from '../lib/package-root.js';

interface Bundled {
  /** The build context in this repository (a Dockerfile and its files). */
  dir: string;
  /** A template's: its image booted, this command passing, checkpointed (instances are forks of
   * it). Without one it is an image (instances boot on it). */
  readyCommand?: string;
}

const imagesDir = (name: string) => packagePath('images', name);

/** Templates and images forkpoint ships as Dockerfiles and makes for an owner the first time it
 * is asked for one (a build, cached, then a template): E2B's code interpreter's, OpenComputer's
 * default sandbox. */
const BUNDLED: Record<string, Bundled> = {
  'code-interpreter': { dir: imagesDir('code-interpreter'), readyCommand: 'curl -sf http://127.0.0.1:49999/health' },
  'opencomputer-base': { dir: imagesDir('opencomputer-base') },
};

export class BundledTemplates {
  private readonly making = new Map<string, Promise<void>>();

  constructor(
    private readonly builds: BuildService,
    private readonly templates: TemplateService,
    private readonly catalog: ImageCatalog,
    private readonly log: Logger,
  ) {}

  /** Whether `name` is a bundled template. */
  has(name: string): boolean {
    return BUNDLED[name]?.readyCommand !== undefined;
  }

  /**
   * Makes the owner's copy of a bundled template unless it is there, of this version of its
   * files: one made from older files (a server upgraded) is made again. A template of that name
   * the owner made from something else is theirs and left alone. Concurrent callers wait for
   * the same making.
   */
  async ensure(owner: string, name: string): Promise<void> {
    const b = BUNDLED[name];
    if (!b?.readyCommand) return;
    const image = versioned(name, b);
    const current = (await this.templates.list(owner)).find((t) => t.name === name);
    const ours = current?.source.startsWith(`image:${name}`) ?? false;
    if (current && (!ours || (current.source === `image:${image}` && current.status === 'ready'))) return;
    await this.once(owner, name, async () => {
      this.log.info({ owner, template: name, image, replacing: current?.source ?? null }, 'making a bundled template');
      await this.builds.buildDockerfile(owner, { name: image, contextDir: b.dir });
      if (current) await this.templates.delete(owner, name);
      await this.templates.create(owner, { name, fromImage: image, readyCommand: b.readyCommand! });
    });
  }

  /** The owner's copy of a bundled image, built unless it is there (of this version of its
   * files); its name. */
  async image(owner: string, name: string): Promise<string> {
    const b = BUNDLED[name];
    if (!b || b.readyCommand !== undefined) throw new Error(`${name} is not a bundled image`);
    const image = versioned(name, b);
    if (await this.built(owner, image)) return image;
    await this.once(owner, name, async () => {
      if (await this.built(owner, image)) return;
      this.log.info({ owner, image }, 'making a bundled image');
      await this.builds.buildDockerfile(owner, { name: image, contextDir: b.dir });
    });
    return image;
  }

  private async built(owner: string, image: string): Promise<boolean> {
    try {
      await this.catalog.get(owner, image);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  private async once(owner: string, name: string, make: () => Promise<void>): Promise<void> {
    const key = `${owner}\n${name}`;
    let p = this.making.get(key);
    if (!p) {
      p = make().finally(() => this.making.delete(key));
      this.making.set(key, p);
    }
    await p;
  }
}

const digests = new Map<string, string>();
/** Its name with its version: the server's files do not change under it while it runs. */
function versioned(name: string, b: Bundled): string {
  let d = digests.get(b.dir);
  if (!d) digests.set(b.dir, (d = digestOf(b.dir)));
  return `${name}-${d}`;
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
