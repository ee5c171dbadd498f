import type { Db } from './db.js';

/** An owner's credentials for one registry; the password sealed (core/secrets-key.ts). */
export interface RegistryCredentialRecord {
  owner: string;
  registry: string;
  username: string;
  sealedPassword: string;
  createdAt: string;
}

export class RegistryCredentialStore {
  constructor(private readonly db: Db) {}

  async put(r: RegistryCredentialRecord): Promise<void> {
    const row = { username: r.username, sealed_password: r.sealedPassword, created_at: r.createdAt };
    await this.db
      .insertInto('registry_credentials')
      .values({ owner: r.owner, registry: r.registry, ...row })
      .onConflict((oc) => oc.columns(['owner', 'registry']).doUpdateSet(row))
      .execute();
  }

  async get(owner: string, registry: string): Promise<RegistryCredentialRecord | undefined> {
    const r = await this.db.selectFrom('registry_credentials').selectAll().where('owner', '=', owner).where('registry', '=', registry).executeTakeFirst();
    return r && { owner: r.owner, registry: r.registry, username: r.username, sealedPassword: r.sealed_password, createdAt: r.created_at };
  }

  async list(owner: string): Promise<RegistryCredentialRecord[]> {
    const rows = await this.db.selectFrom('registry_credentials').selectAll().where('owner', '=', owner).orderBy('registry').execute();
    return rows.map((r) => ({ owner: r.owner, registry: r.registry, username: r.username, sealedPassword: r.sealed_password, createdAt: r.created_at }));
  }

  /** Whether there was one to delete. */
  async delete(owner: string, registry: string): Promise<boolean> {
    const r = await this.db.deleteFrom('registry_credentials').where('owner', '=', owner).where('registry', '=', registry).executeTakeFirst();
    return Number(r.numDeletedRows) > 0;
  }
}
