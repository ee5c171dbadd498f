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

  /** Makes the owner's copy of a bundled template unless it is there; concurrent callers wait
   * for the same making. */
  async ensure(owner: string, name: string): Promise<void> {
    const b = BUNDLED[name];
    if (!b || (await this.templates.list(owner)).some((t) => t.name === name && t.status === 'ready')) return;
    const key = `${owner}\n${name}`;
    let p = this.making.get(key);
    if (!p) {
      p = (async () => {
        this.log.info({ owner, template: name }, 'making a bundled template');
        await this.builds.buildDockerfile(owner, { name, contextDir: b.dir });
        await this.templates.create(owner, { name, fromImage: name, readyCommand: b.readyCommand });
      })().finally(() => this.making.delete(key));
      this.making.set(key, p);
    }
    await p;
  }
}
