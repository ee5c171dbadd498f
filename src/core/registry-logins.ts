import { parseRegistry } from '../lib/image-reference.js';
import type { Store } from '../store/index.js';
import { NotFoundError } from './errors.js';
import { parsedOrInvalid } from './pulls.js';
import type { SecretsKey } from './secrets-key.js';

export interface RegistryLoginView {
  registry: string;
  username: string;
  createdAt: string;
}

const registryOf = (text: string): string => parsedOrInvalid(() => parseRegistry(text), { registry: text, reason: 'BAD_REGISTRY' });

/** Each owner's credentials for private registries, kept sealed for that owner's pulls (and the
 * pulls a create or a build makes); a password is never shown back. */
export class RegistryLogins {
  constructor(
    private readonly store: Store,
    private readonly key: SecretsKey,
  ) {}

  async set(owner: string, registry: string, username: string, password: string): Promise<RegistryLoginView> {
    const rec = { owner, registry: registryOf(registry), username, sealedPassword: await this.key.seal(password), createdAt: new Date().toISOString() };
    await this.store.registryCredentials.put(rec);
    return { registry: rec.registry, username, createdAt: rec.createdAt };
  }

  async list(owner: string): Promise<RegistryLoginView[]> {
    return (await this.store.registryCredentials.list(owner)).map((r) => ({ registry: r.registry, username: r.username, createdAt: r.createdAt }));
  }

  async delete(owner: string, registry: string): Promise<void> {
    if (!(await this.store.registryCredentials.delete(owner, registryOf(registry)))) throw new NotFoundError('registry login', registry);
  }

  /** What the owner's pulls from `registry` use, if the owner keeps any. */
  async forPull(owner: string, registry: string): Promise<{ username: string; password: string } | undefined> {
    const r = await this.store.registryCredentials.get(owner, registry);
    return r && { username: r.username, password: await this.key.open(r.sealedPassword) };
  }
}
