import type { Logger } from 'pino';
import { parseEntry } from '../lib/egress-policy.js';
import type { Store } from '../store/index.js';
import type { SecretStoreEntryRecord, SecretStoreRecord } from '../store/secret-stores.js';
import { SECRET_NAME, SECRET_VALUE, SECRETS_PER_INSTANCE } from './egress-secrets.js';
import { ConflictError, InvalidRequestError, NotFoundError, QuotaExceededError } from './errors.js';
import type { SecretsKey } from './secrets-key.js';
import { newId } from '../store/ids.js';

const STORE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
export const STORES_PER_OWNER = 32;
/** An instance made with a store takes all of its secrets. */
const ENTRIES_PER_STORE = SECRETS_PER_INSTANCE;
const HOSTS_PER_ENTRY = 16;
const ALLOWLIST_ENTRIES = 64;

export type SecretStoreView = Omit<SecretStoreRecord, 'owner'>;
export type SecretEntryView = Omit<SecretStoreEntryRecord, 'sealedValue'>;

/** Entries of an egress allowlist or a secret's hosts: host names (`*.domain` too) or, for an
 * allowlist, addresses and CIDRs; normalised. */
function checkEntries(entries: string[], hostsOnly: boolean, max: number, what: string): string[] {
  if (entries.length > max) throw new InvalidRequestError(`at most ${max} entries in ${what}`);
  return entries.map((raw) => {
    const e = parseEntry(raw);
    if (!e || (hostsOnly && e.kind !== 'host')) throw new InvalidRequestError(`not ${hostsOnly ? 'a host name (or *.domain)' : 'a host name, address or CIDR'} in ${what}: ${raw}`, { entry: raw });
    return e.kind === 'cidr' ? e.cidr : e.subdomains ? `*.${e.name}` : e.name;
  });
}

/**
 * OpenComputer's secret stores, over forkpoint's egress secrets: a store is a named group of an
 * owner's secrets, each with the hosts whose requests carry it; an instance made with a store
 * (EgressSecretService.bind) sees each secret as a placeholder in a variable of its name (the
 * egress proxy puts the value in, for those hosts only) and gets the store's egress allowlist.
 * Values are sealed and never shown back.
 */
export class SecretStoreService {
  constructor(
    private readonly store: Store,
    private readonly key: SecretsKey,
    private readonly log: Logger,
  ) {}

  async create(owner: string, input: { name: string; egressAllowlist?: string[] | undefined }): Promise<SecretStoreView> {
    if (!STORE_NAME.test(input.name)) throw new InvalidRequestError('a secret store name is 1-63 letters, digits, dots, dashes or underscores', { name: input.name });
    const egressAllowlist = checkEntries(input.egressAllowlist ?? [], false, ALLOWLIST_ENTRIES, 'egressAllowlist');
    if (await this.store.secretStores.byName(owner, input.name)) throw new ConflictError(`secret store ${input.name} exists`, { reason: 'SECRET_STORE_EXISTS', name: input.name });
    if ((await this.store.secretStores.list(owner)).length >= STORES_PER_OWNER) {
      throw new QuotaExceededError(`at most ${STORES_PER_OWNER} secret stores per owner`, { reason: 'SECRET_STORES_PER_OWNER', limit: STORES_PER_OWNER });
    }
    const now = new Date().toISOString();
    const rec: SecretStoreRecord = { id: newId('ss'), owner, name: input.name, egressAllowlist, createdAt: now, updatedAt: now };
    if (!(await this.store.secretStores.insert(rec))) throw new ConflictError(`secret store ${input.name} exists`, { reason: 'SECRET_STORE_EXISTS', name: input.name });
    this.log.info({ owner, secretStore: rec.id }, 'secret store created');
    return view(rec);
  }

  async list(owner: string): Promise<SecretStoreView[]> {
    return (await this.store.secretStores.list(owner)).map(view);
  }

  async get(owner: string, id: string): Promise<SecretStoreView> {
    return view(await this.find(owner, id));
  }

  async update(owner: string, id: string, patch: { name?: string | undefined; egressAllowlist?: string[] | undefined }): Promise<SecretStoreView> {
    const rec = await this.find(owner, id);
    if (patch.name !== undefined && patch.name !== rec.name) {
      if (!STORE_NAME.test(patch.name)) throw new InvalidRequestError('a secret store name is 1-63 letters, digits, dots, dashes or underscores', { name: patch.name });
      if (await this.store.secretStores.byName(owner, patch.name)) throw new ConflictError(`secret store ${patch.name} exists`, { reason: 'SECRET_STORE_EXISTS', name: patch.name });
    }
    const next: SecretStoreRecord = {
      ...rec,
      name: patch.name ?? rec.name,
      egressAllowlist: patch.egressAllowlist ? checkEntries(patch.egressAllowlist, false, ALLOWLIST_ENTRIES, 'egressAllowlist') : rec.egressAllowlist,
      updatedAt: new Date().toISOString(),
    };
    if (!(await this.store.secretStores.update(next))) throw new ConflictError(`secret store ${next.name} exists`, { reason: 'SECRET_STORE_EXISTS', name: next.name });
    return view(next);
  }

  /** The store and its secrets. Instances made with it keep their placeholders; from now on the
   * proxy has no value for them (they go out as they are). */
  async delete(owner: string, id: string): Promise<void> {
    if (!(await this.store.secretStores.delete(owner, id))) throw new NotFoundError('secret store', id);
    this.log.info({ owner, secretStore: id }, 'secret store deleted');
  }

  async setSecret(owner: string, id: string, name: string, value: string, allowedHosts: string[] = []): Promise<SecretEntryView> {
    const rec = await this.find(owner, id);
    if (!SECRET_NAME.test(name)) throw new InvalidRequestError('a secret name is 1-64 letters, digits or _, not starting with a digit (it names an environment variable)', { name });
    if (!SECRET_VALUE.test(value)) throw new InvalidRequestError('a secret value is 1-8192 printable ASCII characters (it goes into HTTP headers: no line breaks)', { name });
    const hosts = checkEntries(allowedHosts, true, HOSTS_PER_ENTRY, 'allowedHosts');
    const existing = await this.store.secretStores.entry(rec.id, name);
    if (!existing && (await this.store.secretStores.entries(rec.id)).length >= ENTRIES_PER_STORE) {
      throw new QuotaExceededError(`at most ${ENTRIES_PER_STORE} secrets per store`, { reason: 'SECRETS_PER_STORE', limit: ENTRIES_PER_STORE });
    }
    const now = new Date().toISOString();
    const entry: SecretStoreEntryRecord = { storeId: rec.id, name, sealedValue: await this.key.seal(value), allowedHosts: hosts, createdAt: existing?.createdAt ?? now, updatedAt: now };
    await this.store.secretStores.putEntry(entry);
    this.log.info({ owner, secretStore: rec.id, secret: name }, existing ? 'store secret replaced' : 'store secret created');
    return entryView(entry);
  }

  async listSecrets(owner: string, id: string): Promise<SecretEntryView[]> {
    const rec = await this.find(owner, id);
    return (await this.store.secretStores.entries(rec.id)).map(entryView);
  }

  async deleteSecret(owner: string, id: string, name: string): Promise<void> {
    const rec = await this.find(owner, id);
    if (!(await this.store.secretStores.deleteEntry(rec.id, name))) throw new NotFoundError('secret', name);
  }

  private async find(owner: string, id: string): Promise<SecretStoreRecord> {
    const rec = await this.store.secretStores.get(owner, id);
    if (!rec) throw new NotFoundError('secret store', id);
    return rec;
  }
}

const view = ({ owner: _owner, ...rest }: SecretStoreRecord): SecretStoreView => rest;
const entryView = ({ sealedValue: _sealed, ...rest }: SecretStoreEntryRecord): SecretEntryView => rest;
