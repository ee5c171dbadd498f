import type { Db } from './db.js';

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

interface Row {
  id: string;
  instance_id: string;
  owner: string;
  guest_port: number;
  host_port: number;
  protocol: 'tcp';
  label: string | null;
  created_at: string;
}

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

  insert(f: PortForwardRecord): void {
    this.db
      .prepare(
        `INSERT INTO port_forwards (id, instance_id, owner, guest_port, host_port, protocol, label, created_at)
         VALUES (@id, @instanceId, @owner, @guestPort, @hostPort, @protocol, @label, @createdAt)`,
      )
      .run(f);
  }

  get(id: string): PortForwardRecord | undefined {
    const row = this.db.prepare('SELECT * FROM port_forwards WHERE id = ?').get(id) as Row | undefined;
    return row && fromRow(row);
  }

  forInstance(instanceId: string): PortForwardRecord[] {
    return (this.db.prepare('SELECT * FROM port_forwards WHERE instance_id = ? ORDER BY created_at, id').all(instanceId) as Row[]).map(fromRow);
  }

  all(): PortForwardRecord[] {
    return (this.db.prepare('SELECT * FROM port_forwards ORDER BY created_at, id').all() as Row[]).map(fromRow);
  }

  remove(id: string): void {
    this.db.prepare('DELETE FROM port_forwards WHERE id = ?').run(id);
  }

  removeAllOf(instanceId: string): void {
    this.db.prepare('DELETE FROM port_forwards WHERE instance_id = ?').run(instanceId);
  }
}
