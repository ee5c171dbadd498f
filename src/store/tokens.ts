import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Db } from './db.js';
import { newId } from './ids.js';

export interface TokenRecord {
  id: string;
  owner: string;
  name: string;
  createdAt: string;
  lastUsedAt: string | null;
  revokedAt: string | null;
}

interface TokenRow {
  id: string;
  owner: string;
  name: string;
  secret_hash: Buffer;
  created_at: string;
  last_used_at: string | null;
  revoked_at: string | null;
}

const toRecord = (r: TokenRow): TokenRecord => ({
  id: r.id,
  owner: r.owner,
  name: r.name,
  createdAt: r.created_at,
  lastUsedAt: r.last_used_at,
  revokedAt: r.revoked_at,
});

const hash = (secret: string): Buffer => createHash('sha256').update(secret).digest();

/** A token is `fpk_<id>.<secret>`: the id finds the row, the secret is compared as a hash in
 * constant time. Only the hash is stored. */
export class TokenStore {
  constructor(private readonly db: Db) {}

  create(owner: string, name: string): { token: string; record: TokenRecord } {
    const id = newId('tok', 12);
    const secret = randomBytes(24).toString('base64url');
    const now = new Date().toISOString();
    this.db
      .prepare('INSERT INTO tokens (id, owner, name, secret_hash, created_at) VALUES (?, ?, ?, ?, ?)')
      .run(id, owner, name, hash(secret), now);
    return { token: `fpk_${id}.${secret}`, record: this.get(id)! };
  }

  get(id: string): TokenRecord | undefined {
    const row = this.db.prepare('SELECT * FROM tokens WHERE id = ?').get(id) as TokenRow | undefined;
    return row && toRecord(row);
  }

  list(): TokenRecord[] {
    return (this.db.prepare('SELECT * FROM tokens ORDER BY created_at').all() as TokenRow[]).map(toRecord);
  }

  countActive(): number {
    return this.db.prepare('SELECT COUNT(*) FROM tokens WHERE revoked_at IS NULL').pluck().get() as number;
  }

  revoke(id: string): boolean {
    const r = this.db
      .prepare('UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL')
      .run(new Date().toISOString(), id);
    return r.changes > 0;
  }

  /** The owner of a valid token, or undefined. */
  verify(token: string): TokenRecord | undefined {
    const m = /^fpk_(tok_[0-9a-z]+)\.([A-Za-z0-9_-]+)$/.exec(token);
    const probe = hash(m ? m[2]! : token);
    const row = m
      ? (this.db.prepare('SELECT * FROM tokens WHERE id = ?').get(m[1]) as TokenRow | undefined)
      : undefined;
    // Compare even when no row matched, so that timing does not tell ids apart.
    const stored = row?.secret_hash ?? Buffer.alloc(32);
    const equal = timingSafeEqual(stored, probe);
    if (!row || !equal || row.revoked_at) return undefined;
    return toRecord(row);
  }
}
