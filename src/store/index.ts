import { CheckpointStore } from './checkpoints.js';
import { openDb, type Db } from './db.js';
import { DurableStore } from './durable.js';
import { ExecutionStore } from './executions.js';
import { ImageStore } from './images.js';
import { InstanceStore } from './instances.js';
import { LayerStore } from './layers.js';
import { PortForwardStore } from './port-forwards.js';
import { TemplateStore } from './templates.js';
import { TokenStore } from './tokens.js';

export interface Store {
  db: Db;
  tokens: TokenStore;
  instances: InstanceStore;
  checkpoints: CheckpointStore;
  layers: LayerStore;
  executions: ExecutionStore;
  portForwards: PortForwardStore;
  images: ImageStore;
  durable: DurableStore;
  templates: TemplateStore;
  close(): void;
}

export function openStore(file: string): Store {
  const db = openDb(file);
  return {
    db,
    tokens: new TokenStore(db),
    instances: new InstanceStore(db),
    checkpoints: new CheckpointStore(db),
    layers: new LayerStore(db),
    executions: new ExecutionStore(db),
    portForwards: new PortForwardStore(db),
    images: new ImageStore(db),
    durable: new DurableStore(db),
    templates: new TemplateStore(db),
    close: () => db.close(),
  };
}
