import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import { newEgressCa, type CertificateAndKey } from '../lib/egress-ca.js';
import { parseEntry } from '../lib/egress-policy.js';
import type { EgressSecrets, SecretRule } from '../seam/runtime.js';
import type { SandboxHandle } from '../seam/sandbox.js';
import type { Store } from '../store/index.js';
import type { InstanceRecord, InstanceSecret } from '../store/instances.js';
import { InvalidRequestError, NotFoundError, QuotaExceededError } from './errors.js';
import type { SecretsKey } from './secrets-key.js';

export const SECRET_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,63}$/;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
/** A value goes into HTTP headers: printable ASCII, spaces and tabs, nothing that ends a line. */
export const SECRET_VALUE = /^[\x20-\x7e\t]{1,8192}$/;
export const SECRETS_PER_OWNER = 128;
export const SECRETS_PER_INSTANCE = 16;
const HOSTS_PER_SECRET = 16;
/** What a sandbox sees in place of a secret store's secret (OpenComputer's shape). */
const STORE_PLACEHOLDER_PREFIX = 'osb_sealed_';

/** Where the instance's CA goes in its sandbox, and the bundle it is added to if the image has one. */
export const EGRESS_CA_PATH = '/usr/local/share/ca-certificates/forkpoint-egress.crt';
const SYSTEM_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
const MAX_BUNDLE_BYTES = 4 << 20;

export interface SecretView {
  name: string;
  createdAt: string;
  updatedAt: string;
}

/** A secret an instance asks to use: in requests to `hosts`, through `env` (default: its name). */
export interface SecretRequest {
  name: string;
  hosts: string[];
  env?: string | undefined;
}

/**
 * Owners' secrets, and what instances make of them: a sandbox sees a placeholder in an
 * environment variable; the egress proxy puts the value in its place in requests to the hosts
 * the instance named. Values are sealed in the store and opened only to hand the engine an
 * instance's rules; no view, event or log carries one.
 */
export class EgressSecretService {
  constructor(
    private readonly store: Store,
    private readonly key: SecretsKey,
    private readonly log: Logger,
  ) {}

  async put(owner: string, name: string, value: string): Promise<SecretView> {
    if (!SECRET_NAME.test(name)) throw new InvalidRequestError('a secret name is 1-64 letters, digits or _, not starting with a digit', { name });
    if (!SECRET_VALUE.test(value)) throw new InvalidRequestError('a secret value is 1-8192 printable ASCII characters (it goes into HTTP headers: no line breaks)', { name });
    const existing = await this.store.ownerSecrets.get(owner, name);
    if (!existing && (await this.store.ownerSecrets.list(owner)).length >= SECRETS_PER_OWNER) {
      throw new QuotaExceededError(`at most ${SECRETS_PER_OWNER} secrets per owner`, { reason: 'SECRETS_PER_OWNER', limit: SECRETS_PER_OWNER });
    }
    const now = new Date().toISOString();
    await this.store.ownerSecrets.put({ owner, name, sealedValue: await this.key.seal(value), createdAt: existing?.createdAt ?? now, updatedAt: now });
    this.log.info({ owner, secret: name }, existing ? 'secret replaced' : 'secret created');
    return { name, createdAt: existing?.createdAt ?? now, updatedAt: now };
  }

  async list(owner: string): Promise<SecretView[]> {
    return (await this.store.ownerSecrets.list(owner)).map((r) => ({ name: r.name, createdAt: r.createdAt, updatedAt: r.updatedAt }));
  }

  async delete(owner: string, name: string): Promise<void> {
    if (!SECRET_NAME.test(name) || !(await this.store.ownerSecrets.delete(owner, name))) throw new NotFoundError('secret', name);
    this.log.info({ owner, secret: name }, 'secret deleted');
  }

  /** What a new instance's record holds for the secrets it asks for, and those of the secret
   * store it names: each with a placeholder of its own, the variables its commands see, a CA of
   * its own (sealed), and the store's egress allowlist. */
  async bind(owner: string, requested: SecretRequest[] | undefined, storeName?: string): Promise<{ secrets: InstanceSecret[]; env: Record<string, string>; egressCa: string | null; egressAllowlist: string[] }> {
    const fromStore = storeName === undefined ? { secrets: [], egressAllowlist: [] } : await this.bindStore(owner, storeName);
    const secrets: InstanceSecret[] = [...fromStore.secrets];
    const env: Record<string, string> = Object.fromEntries(secrets.map((s) => [s.env, s.placeholder]));
    if (!requested?.length && !secrets.length) return { secrets: [], env: {}, egressCa: null, egressAllowlist: fromStore.egressAllowlist };
    if ((requested?.length ?? 0) + secrets.length > SECRETS_PER_INSTANCE) throw new InvalidRequestError(`at most ${SECRETS_PER_INSTANCE} secrets per instance`);
    for (const r of requested ?? []) {
      if (!SECRET_NAME.test(r.name) || !(await this.store.ownerSecrets.get(owner, r.name))) throw new NotFoundError('secret', r.name);
      const envName = r.env ?? r.name;
      if (!ENV_NAME.test(envName)) throw new InvalidRequestError(`not an environment variable name: ${envName}`, { env: envName });
      if (env[envName] !== undefined) throw new InvalidRequestError(`two secrets in ${envName}`, { env: envName });
      if (!r.hosts.length || r.hosts.length > HOSTS_PER_SECRET) throw new InvalidRequestError(`a secret names 1-${HOSTS_PER_SECRET} hosts`, { secret: r.name });
      const hosts = r.hosts.map((h) => {
        const e = parseEntry(h);
        if (e?.kind !== 'host') throw new InvalidRequestError(`not a host name (or *.domain): ${h}`, { host: h });
        return e.subdomains ? `*.${e.name}` : e.name;
      });
      const placeholder = `fpsecret_${randomBytes(16).toString('hex')}`;
      secrets.push({ name: r.name, env: envName, hosts, placeholder });
      env[envName] = placeholder;
    }
    const ca = await newEgressCa(`forkpoint egress ${owner.slice(0, 32)}`);
    return { secrets, env, egressCa: await this.key.seal(JSON.stringify(ca)), egressAllowlist: fromStore.egressAllowlist };
  }

  /** A store's secrets as an instance holds them: in variables of their names. One with no hosts
   * of its own is put in for the store's allowlisted host names; with neither, for none (the
   * proxy opens TLS only to hosts a secret names). */
  private async bindStore(owner: string, name: string): Promise<{ secrets: InstanceSecret[]; egressAllowlist: string[] }> {
    const store = await this.store.secretStores.byName(owner, name);
    if (!store) throw new NotFoundError('secret store', name);
    const allowlistHosts = store.egressAllowlist.filter((e) => parseEntry(e)?.kind === 'host');
    const secrets = (await this.store.secretStores.entries(store.id)).map((e): InstanceSecret => ({
      name: e.name,
      env: e.name,
      hosts: e.allowedHosts.length ? e.allowedHosts : allowlistHosts,
      placeholder: `${STORE_PLACEHOLDER_PREFIX}${randomBytes(16).toString('hex')}`,
      store: store.id,
    }));
    return { secrets, egressAllowlist: store.egressAllowlist };
  }

  private async sealedValueOf(owner: string, s: InstanceSecret): Promise<string | undefined> {
    if (s.store) return (await this.store.secretStores.entry(s.store, s.name))?.sealedValue;
    return (await this.store.ownerSecrets.get(owner, s.name))?.sealedValue;
  }

  private async caOf(rec: InstanceRecord): Promise<CertificateAndKey | undefined> {
    return rec.egressCa ? (JSON.parse(await this.key.open(rec.egressCa)) as CertificateAndKey) : undefined;
  }

  /** The instance's rules for the engine's egress proxy, values opened (null: it has none). A
   * secret deleted since is left out: its placeholder goes out as it is. */
  async forEngine(rec: InstanceRecord): Promise<EgressSecrets | null> {
    const ca = await this.caOf(rec);
    if (!ca || !rec.secrets.length) return null;
    const rules: SecretRule[] = [];
    for (const s of rec.secrets) {
      const sealed = await this.sealedValueOf(rec.owner, s);
      if (sealed !== undefined && s.hosts.length) rules.push({ hosts: s.hosts, placeholder: s.placeholder, value: await this.key.open(sealed) });
    }
    return { ca, rules };
  }

  /** Puts the instance's CA where its tools look for trusted ones: a file of its own, and the
   * system bundle if the image has one. Answers the variables that point the rest at them. */
  async installCa(rec: InstanceRecord, sb: SandboxHandle): Promise<Record<string, string>> {
    const ca = await this.caOf(rec);
    if (!ca) return {};
    const pem = Buffer.from(ca.certPem.endsWith('\n') ? ca.certPem : `${ca.certPem}\n`);
    return sb.call(async (agent) => {
      await agent.mkdir('/usr/local/share/ca-certificates');
      await agent.writeAt(EGRESS_CA_PATH, 0, pem, { truncate: true, mode: 0o644 });
      const env: Record<string, string> = { NODE_EXTRA_CA_CERTS: EGRESS_CA_PATH };
      const bundle = await agent.readFile(SYSTEM_BUNDLE, MAX_BUNDLE_BYTES).catch(() => undefined);
      if (bundle && !bundle.truncated) {
        const sep = bundle.data.length && bundle.data[bundle.data.length - 1] !== 0x0a ? Buffer.from('\n') : Buffer.alloc(0);
        await agent.writeAt(SYSTEM_BUNDLE, bundle.data.length, Buffer.concat([sep, pem]), { truncate: false });
        Object.assign(env, { SSL_CERT_FILE: SYSTEM_BUNDLE, REQUESTS_CA_BUNDLE: SYSTEM_BUNDLE, CURL_CA_BUNDLE: SYSTEM_BUNDLE });
      }
      return env;
    });
  }
}
