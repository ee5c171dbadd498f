import type { Selectable } from 'kysely';
import type { Db } from './db.js';
import type { Tables } from './schema.js';

export interface PortForwardRecord {
  id: string;
  instanceId: string;
  owner: string;
  guestPort: number;
  hostPort: number;
  protocol: 'tcp';
  label: string | null;
  createdAt: string;
}

type Row = Selectable<Tables['port_forwards']>;

const fromRow = (r: Row): PortForwardRecord => ({
  id: r.id,
  instanceId: r.instance_id,
  owner: r.owner,
  guestPort: r.guest_port,
  hostPort: r.host_port,
  protocol: r.protocol,
  label: r.label,
  createdAt: r.created_at,
});

export class PortForwardStore {
  constructor(private readonly db: Db) {}

  async insert(f: PortForwardRecord): Promise<void> {
    await this.db
      .insertInto('port_forwards')
      .values({
        id: f.id,
        instance_id: f.instanceId,
        owner: f.owner,
        guest_port: f.guestPort,
        host_port: f.hostPort,
        protocol: f.protocol,
        label: f.label,
        created_at: f.createdAt,
      })
      .execute();
  }

  async get(id: string): Promise<PortForwardRecord | undefined> {
    const row = await this.db.selectFrom('port_forwards').selectAll().where('id', '=', id).executeTakeFirst();
    return row && fromRow(row);
  }

  async forInstance(instanceId: string): Promise<PortForwardRecord[]> {
    return (await this.db.selectFrom('port_forwards').selectAll().where('instance_id', '=', instanceId).orderBy('created_at').orderBy('id').execute()).map(fromRow);
  }

  async all(): Promise<PortForwardRecord[]> {
    return (await this.db.selectFrom('port_forwards').selectAll().orderBy('created_at').orderBy('id').execute()).map(fromRow);
  }

  async remove(id: string): Promise<void> {
    await this.db.deleteFrom('port_forwards').where('id', '=', id).execute();
  }

  async removeAllOf(instanceId: string): Promise<void> {
    await this.db.deleteFrom('port_forwards').where('instance_id', '=', instanceId).execute();
  }
}
