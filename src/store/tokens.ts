import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Selectable } from 'kysely';
import type { Db } from './db.js';
import { newId } from './ids.js';
import type { Tables } from './schema.js';
import { PreparedQuery } from './prepared.js';

const byId = new PreparedQuery((db, id: string) => db.selectFrom('tokens').selectAll().where('id', '=', id));

/** Owners the server keeps for itself (warm standbys' records, core/warm-standbys.ts): no token speaks
 * for one. Templates' hidden instances are kept under `~template:<owner>` (store/templates.ts). */
export const RESERVED_OWNER_PREFIX = '@';
const RESERVED_OWNER = /^[@~]/;

export interface TokenRecord {
  id: string;
  owner: string;
  name: string;
  createdAt: string;
  lastUsedAt: string | null;
  revokedAt: string | null;
}

const toRecord = (r: Selectable<Tables['tokens']>): TokenRecord => ({
  id: r.id,
  owner: r.owner,
  name: r.name,
  createdAt: r.created_at,
  lastUsedAt: r.last_used_at,
  revokedAt: r.revoked_at,
});

const hash = (secret: string): Buffer => createHash('sha256').update(secret).digest();

/** How a token is written: forkpoint's own, or E2B's (`e2b_` and hex only), which E2B's SDKs
 * check a key against before they send it (Python always, JS when asked). */
export type TokenShape = 'forkpoint' | 'e2b';

/** forkpoint's `fpk_<id>.<secret>`, or E2B's `e2b_<24 hex of the id><48 hex of the secret>`. */
const SHAPES = { forkpoint: /^fpk_(tok_[0-9a-z]+)\.([A-Za-z0-9_-]+)$/, e2b: /^e2b_([0-9a-f]{24})([0-9a-f]{48})$/ } as const;

/** A token's row id and secret, read from either shape. */
function parse(token: string): { id: string; secret: string } | undefined {
  const own = SHAPES.forkpoint.exec(token);
  if (own) return { id: own[1]!, secret: own[2]! };
  const e2b = SHAPES.e2b.exec(token);
  return e2b ? { id: `tok_${e2b[1]!}`, secret: e2b[2]! } : undefined;
}

/** A token names its row by id; its secret is compared as a hash in constant time. Only the
 * hash is stored. Both shapes are one kind of credential, with the same scope. */
export class TokenStore {
  constructor(private readonly db: Db) {}

  async create(owner: string, name: string, shape: TokenShape = 'forkpoint'): Promise<{ token: string; record: TokenRecord }> {
    if (RESERVED_OWNER.test(owner)) throw new Error('an owner\'s name may not begin with @ or ~: such owners are the server\'s own');
    const e2b = shape === 'e2b';
    const idPart = e2b ? randomBytes(12).toString('hex') : undefined;
    const id = idPart ? `tok_${idPart}` : newId('tok', 12);
    const secret = e2b ? randomBytes(24).toString('hex') : randomBytes(24).toString('base64url');
    const row = { id, owner, name, secret_hash: hash(secret), created_at: new Date().toISOString(), last_used_at: null, revoked_at: null };
    await this.db.insertInto('tokens').values(row).execute();
    return { token: idPart ? `e2b_${idPart}${secret}` : `fpk_${id}.${secret}`, record: toRecord(row) };
  }

  async get(id: string): Promise<TokenRecord | undefined> {
    const row = await this.db.selectFrom('tokens').selectAll().where('id', '=', id).executeTakeFirst();
    return row && toRecord(row);
  }

  async list(): Promise<TokenRecord[]> {
    return (await this.db.selectFrom('tokens').selectAll().orderBy('created_at').execute()).map(toRecord);
  }

  /**
   * The running sandboxes (or the one named) with each live API token of their owner's: every
   * pair an access token can have been made for. At most `limit` pairs, newest sandboxes first.
   */
  async runningSandboxGrants(limit: number, sandboxId?: string): Promise<{ sandboxId: string; owner: string; tokenId: string }[]> {
    let q = this.db
      .selectFrom('instances')
      .innerJoin('tokens', (j) => j.onRef('tokens.owner', '=', 'instances.owner').on('tokens.revoked_at', 'is', null))
      .select(['instances.id as sandboxId', 'instances.owner as owner', 'tokens.id as tokenId'])
      .where('instances.status', '=', 'running');
    if (sandboxId !== undefined) q = q.where('instances.id', '=', sandboxId);
    return q.orderBy('instances.created_at', 'desc').limit(limit).execute();
  }

  async countActive(): Promise<number> {
    const row = await this.db.selectFrom('tokens').select((eb) => eb.fn.countAll().as('n')).where('revoked_at', 'is', null).executeTakeFirstOrThrow();
    return Number(row.n);
  }

  async revoke(id: string): Promise<boolean> {
    const r = await this.db
      .updateTable('tokens')
      .set({ revoked_at: new Date().toISOString() })
      .where('id', '=', id)
      .where('revoked_at', 'is', null)
      .executeTakeFirst();
    return r.numUpdatedRows > 0n;
  }

  /** The owner of a valid token, or undefined. */
  async verify(token: string): Promise<TokenRecord | undefined> {
    const m = parse(token);
    const probe = hash(m ? m.secret : token);
    const row = m ? await byId.first(this.db, m.id) : undefined;
    // Compare even when no row matched, so that timing does not tell ids apart.
    const stored = row?.secret_hash ?? Buffer.alloc(32);
    const equal = stored.length === probe.length && timingSafeEqual(stored, probe);
    if (!row || !equal || row.revoked_at) return undefined;
    return toRecord(row);
  }
}
