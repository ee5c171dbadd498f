import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';

/** What a sandbox token opens: its envd and ports (`access`), or its ports (`traffic`). */
/** `volume`: a persistent volume's content token (E2B's volume JWT), `id` the volume's. */
export type SandboxTokenKind = 'access' | 'traffic' | 'volume';

/** Which way a signed file link goes: a read (`download`) or a write (`upload`). */
export type FileLinkDirection = 'download' | 'upload';

/** What an E2B file URL (its SDKs' `downloadUrl`/`uploadUrl`) signs, as its query has it: the
 * path and user as given (empty when absent), the operation its method is, and the expiry (unix
 * seconds) if it has one. */
export interface EnvdFileLink {
  path: string;
  user: string;
  operation: 'read' | 'write';
  expiration?: number | undefined;
}

/** The longest a file link may live (OpenComputer's bound). */
export const MAX_FILE_LINK_TTL_S = 86400;

/** The longest a preview link may live. */
export const MAX_PREVIEW_TTL_S = 7 * 86400;

/**
 * Preview links: a browser cannot send the API token as a header, so a link to an instance's
 * port carries a signature of (owner, instance, port, expiry) made with a secret all nodes
 * share. It opens that port of that instance until it expires, and nothing else.
 */
export class PreviewLinks {
  private constructor(private readonly secret: Buffer) {}

  /** The secret every node shares (`share` answers the store's, proposing this one's): a
   * server's own from before nodes (its 0600 file) if it is the first, else a new one. */
  static async open(file: string, share: (proposed: string) => Promise<string>): Promise<PreviewLinks> {
    const own = existsSync(file) ? (await readFile(file, 'utf8')).trim() : '';
    const secret = await share(/^[0-9a-f]{64}$/.test(own) ? own : randomBytes(32).toString('hex'));
    return new PreviewLinks(Buffer.from(secret, 'hex'));
  }

  private mac(owner: string, id: string, port: number, expires: number, tokenId: string): string {
    return createHmac('sha256', this.secret).update(`${owner}\n${id}\n${port}\n${expires}\n${tokenId}`).digest('base64url');
  }

  /** `<expiry>.<owner>.<token id>.<signature>`, good for `ttlS` seconds, made for the API token
   * that asked (whose revocation ends it: the verifier checks that it lives). */
  sign(owner: string, id: string, port: number, ttlS: number, tokenId: string): { token: string; expiresAt: Date } {
    const expires = Math.floor(Date.now() / 1000) + Math.min(Math.max(1, ttlS), MAX_PREVIEW_TTL_S);
    const o = Buffer.from(owner).toString('base64url');
    return { token: `${expires}.${o}.${tokenId}.${this.mac(owner, id, port, expires, tokenId)}`, expiresAt: new Date(expires * 1000) };
  }

  /** The owner a valid, unexpired link of this instance's port speaks for, and the API token it
   * was made for. */
  verify(token: string, id: string, port: number): { owner: string; tokenId: string } | undefined {
    const m = /^(\d{1,12})\.([A-Za-z0-9_-]{1,400})\.(tok_[0-9a-z]{1,40})\.([A-Za-z0-9_-]{43})$/.exec(token);
    if (!m) return undefined;
    const expires = Number(m[1]);
    if (expires < Date.now() / 1000) return undefined;
    const owner = Buffer.from(m[2]!, 'base64url').toString('utf8');
    const want = Buffer.from(this.mac(owner, id, port, expires, m[3]!));
    const got = Buffer.from(m[4]!);
    return want.length === got.length && timingSafeEqual(want, got) ? { owner, tokenId: m[3]! } : undefined;
  }

  /** A sandbox's own token, made for the API token that asked for it: `<token id>.<signature of
   * (kind, owner, instance, token id)>`. Its `access` kind is E2B's envd `X-Access-Token`: that
   * instance's in-sandbox API and ports. Its `traffic` kind is E2B's `E2B-Traffic-Access-Token`:
   * its ports only. Each dies with the API token (the verifier checks that it lives). Derived,
   * not stored: a fork, a new id, gets its own. */
  sandboxToken(kind: SandboxTokenKind, owner: string, id: string, tokenId: string): string {
    return `${tokenId}.${this.sandboxMac(kind, owner, id, tokenId)}`;
  }

  /** The API token id a sandbox token of that kind was made for, if it is this instance's. */
  verifySandboxToken(kind: SandboxTokenKind, token: string, owner: string, id: string): string | undefined {
    const m = /^(tok_[0-9a-z]{1,40})\.([A-Za-z0-9_-]{43})$/.exec(token);
    if (!m) return undefined;
    const want = Buffer.from(this.sandboxMac(kind, owner, id, m[1]!));
    const got = Buffer.from(m[2]!);
    return want.length === got.length && timingSafeEqual(want, got) ? m[1] : undefined;
  }

  /** A signed file link (OpenComputer's `downloadUrl`/`uploadUrl`): `<expiry>.<owner>.<token
   * id>.<signature of (direction, owner, instance, path, expiry, token id)>`. It reads (or
   * writes) that one path of that instance until it expires, and nothing else. */
  fileLink(direction: FileLinkDirection, owner: string, id: string, path: string, ttlS: number, tokenId: string): { token: string; expiresAt: Date } {
    const expires = Math.floor(Date.now() / 1000) + Math.min(Math.max(1, ttlS), MAX_FILE_LINK_TTL_S);
    const o = Buffer.from(owner).toString('base64url');
    return { token: `${expires}.${o}.${tokenId}.${this.fileMac(direction, owner, id, path, expires, tokenId)}`, expiresAt: new Date(expires * 1000) };
  }

  /** The owner and API token id a valid, unexpired file link of this path speaks for. */
  verifyFileLink(direction: FileLinkDirection, token: string, id: string, path: string): { owner: string; tokenId: string } | undefined {
    const m = /^(\d{1,12})\.([A-Za-z0-9_-]{1,400})\.(tok_[0-9a-z]{1,40})\.([A-Za-z0-9_-]{43})$/.exec(token);
    if (!m) return undefined;
    const expires = Number(m[1]);
    if (expires < Date.now() / 1000) return undefined;
    const owner = Buffer.from(m[2]!, 'base64url').toString('utf8');
    const want = Buffer.from(this.fileMac(direction, owner, id, path, expires, m[3]!));
    const got = Buffer.from(m[4]!);
    return want.length === got.length && timingSafeEqual(want, got) ? { owner, tokenId: m[3]! } : undefined;
  }

  /** Whether `signature` is what E2B's SDKs sign a file URL with (`getSignature`: `v1_` and the
   * unpadded base64 of sha256 of `path:operation:user:access token[:expiration]`) for the access
   * token this instance's owner's API token `tokenId` was given. */
  isEnvdFileSignature(signature: string, link: EnvdFileLink, owner: string, id: string, tokenId: string): boolean {
    const access = this.sandboxToken('access', owner, id, tokenId);
    const raw = [link.path, link.operation, link.user, access, ...(link.expiration === undefined ? [] : [String(link.expiration)])].join(':');
    const want = Buffer.from(`v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`);
    const got = Buffer.from(signature);
    return want.length === got.length && timingSafeEqual(want, got);
  }

  private fileMac(direction: FileLinkDirection, owner: string, id: string, path: string, expires: number, tokenId: string): string {
    // Length-prefixed: a path may hold any byte but NUL, newlines included.
    const fields = ['file', direction, owner, id, path, String(expires), tokenId].map((f) => `${Buffer.byteLength(f)}:${f}`);
    return createHmac('sha256', this.secret).update(fields.join('')).digest('base64url');
  }

  private sandboxMac(kind: SandboxTokenKind, owner: string, id: string, tokenId: string): string {
    return createHmac('sha256', this.secret).update(`${kind}\n${owner}\n${id}\n${tokenId}`).digest('base64url');
  }
}
