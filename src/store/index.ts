import { sql } from 'kysely';
import { CheckpointStore } from './checkpoints.js';
import { openDb, type Db, type SqlDialect } from './db.js';
import { DurableStore } from './durable.js';
import { WriteFence } from './fence.js';
import { ExecutionStore } from './executions.js';
import { ImageStore } from './images.js';
import { InstanceStore } from './instances.js';
import { LayerStore } from './layers.js';
import { NodeStore } from './nodes.js';
import { PortForwardStore } from './port-forwards.js';
import { RegistryCredentialStore } from './registry-credentials.js';
import { TemplateStore } from './templates.js';
import { TokenStore } from './tokens.js';
import { VolumeStore } from './volumes.js';
import { OwnerSecretStore } from './owner-secrets.js';
import { SecretStoreStore } from './secret-stores.js';

export interface Store {
  dialect: SqlDialect;
  tokens: TokenStore;
  instances: InstanceStore;
  checkpoints: CheckpointStore;
  layers: LayerStore;
  executions: ExecutionStore;
  portForwards: PortForwardStore;
  images: ImageStore;
  registryCredentials: RegistryCredentialStore;
  volumes: VolumeStore;
  ownerSecrets: OwnerSecretStore;
  secretStores: SecretStoreStore;
  durable: DurableStore;
  templates: TemplateStore;
  nodes: NodeStore;
  /** The lease this node's instance writes carry (set by the cluster when it joins). */
  fence: WriteFence;
  /** Runs `fn` with a store whose every call is one transaction (or the one this store is in).
   * Inside, only `tx` may be used: the embedded database has one connection, which the
   * transaction holds until it ends. */
  transaction<T>(fn: (tx: Store) => Promise<T>): Promise<T>;
  /** Asks the database something trivial: it answers, or this throws. */
  ping(): Promise<void>;
  close(): Promise<void>;
}

/** Opens the store at `location`: a SQLite file, or a postgres:// URL shared by several nodes. */
export async function openStore(location: string, onIdleError?: (err: Error) => void): Promise<Store> {
  const conn = await openDb(location, onIdleError);
  return storeOn(conn.db, conn.dialect, () => conn.close(), new WriteFence());
}

function storeOn(db: Db, dialect: SqlDialect, close: () => Promise<void>, fence: WriteFence): Store {
  const store: Store = {
    dialect,
    fence,
    tokens: new TokenStore(db),
    instances: new InstanceStore(db, fence),
    checkpoints: new CheckpointStore(db),
    layers: new LayerStore(db),
    executions: new ExecutionStore(db),
    portForwards: new PortForwardStore(db),
    images: new ImageStore(db),
    registryCredentials: new RegistryCredentialStore(db),
    volumes: new VolumeStore(db),
    ownerSecrets: new OwnerSecretStore(db),
    secretStores: new SecretStoreStore(db),
    durable: new DurableStore(db),
    templates: new TemplateStore(db),
    nodes: new NodeStore(db),
    ping: async () => {
      await sql`select 1`.execute(db);
    },
    transaction: (fn) => (db.isTransaction ? fn(store) : db.transaction().execute((trx) => fn(storeOn(trx, dialect, close, fence)))),
    close,
  };
  return store;
}
