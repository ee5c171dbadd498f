import { createHash } from 'node:crypto';
import type { Store } from '../store/index.js';
import { isStoreAway } from './errors.js';
import type { EnvdFileLink, FileLinkDirection, PreviewLinks, SandboxTokenKind } from './previews.js';

/** How many (sandbox, API token) pairs an E2B file URL that names no sandbox is tried against:
 * each is a hash, done for a request nobody has authenticated yet. */
export const MAX_ENVD_LINK_CANDIDATES = 4096;

/** How many API tokens the cache for a database away remembers (the most recently checked). */
const REMEMBERED = 10_000;

/** An API token: everything of its owner's (an operator's also sees the cluster). */
export interface OwnerCredential {
  kind: 'owner';
  owner: string;
  tokenId: string;
  operator: boolean;
}

/** A sandbox's access token (E2B's envd `X-Access-Token`): that sandbox's envd and ports. */
export interface SandboxCredential {
  kind: 'sandbox';
  owner: string;
  sandboxId: string;
}

/** A sandbox's traffic token (E2B's `E2B-Traffic-Access-Token`, which its code interpreter
 * sends to its port): that sandbox's ports, not its envd. */
export interface TrafficCredential {
  kind: 'traffic';
  owner: string;
  sandboxId: string;
}

/** A preview link or its cookie: one port of one sandbox, until it expires or the API token
 * that made it is revoked. */
export interface PreviewCredential {
  kind: 'preview';
  owner: string;
  sandboxId: string;
  port: number;
}

/** A signed file link: one path of one sandbox, read or written, until it expires or the API
 * token that made it is revoked. `forkpoint`: a link this server signed (OpenComputer's
 * `downloadUrl`), for its route under the sandbox's id; `envd`: a URL E2B's SDK signed with the
 * sandbox's access token, for envd's `/files`, which names the user as well. */
export interface FileLinkCredential {
  kind: 'file';
  form: 'forkpoint' | 'envd';
  owner: string;
  sandboxId: string;
  path: string;
  direction: FileLinkDirection;
  /** For `envd`: the user it signs (empty: the sandbox's default user). */
  user?: string;
}

/** A volume's content token (E2B's volume token): that volume's files, nothing else, until the
 * API token that asked for it is revoked. */
export interface VolumeCredential {
  kind: 'volume';
  owner: string;
  volumeId: string;
}

/** Every credential forkpoint accepts; what each may open is the HTTP edge's one table. */
export type Credential = OwnerCredential | SandboxCredential | TrafficCredential | PreviewCredential | FileLinkCredential | VolumeCredential;

/**
 * Turns what a client presents into a credential, or nothing: API tokens (the store's),
 * sandbox access tokens (derived from the API token that asked for them, so revoking that token
 * revokes them) and preview links (signed for one port).
 */
export class Credentials {
  /** API tokens the database vouched for lately (by their hash), and when: while it is away, one
   * vouched for within `graceMs` is taken on that word, so a revocation takes effect within
   * `graceMs` at worst. With the database there, every check asks it. */
  private readonly vouched = new Map<string, { id: string; owner: string; at: number }>();

  constructor(
    private readonly store: Store,
    private readonly links: () => PreviewLinks,
    /** Owners whose API tokens may see the cluster (FORKPOINT_OPERATORS). */
    private readonly operators: ReadonlySet<string>,
    private readonly graceMs = 0,
  ) {}

  async apiToken(token: string): Promise<OwnerCredential | undefined> {
    const key = createHash('sha256').update(token).digest('hex');
    let rec: { id: string; owner: string } | undefined;
    let at = Date.now();
    try {
      rec = await this.store.tokens.verify(token);
    } catch (err) {
      const seen = this.vouched.get(key);
      if (!isStoreAway(err) || !seen || at - seen.at > this.graceMs) throw err;
      ({ at } = seen);
      rec = seen;
    }
    // Re-inserted on each use: the oldest-used is the first forgotten.
    this.vouched.delete(key);
    if (!rec) return undefined;
    this.vouched.set(key, { id: rec.id, owner: rec.owner, at });
    if (this.vouched.size > REMEMBERED) this.vouched.delete(this.vouched.keys().next().value!);
    return { kind: 'owner', owner: rec.owner, tokenId: rec.id, operator: this.operators.has(rec.owner) };
  }

  /** The access token of a sandbox, for the API token that asks. */
  accessTokenFor(by: OwnerCredential, sandboxId: string): string {
    return this.links().sandboxToken('access', by.owner, sandboxId, by.tokenId);
  }

  /** The traffic token of a sandbox, for the API token that asks. */
  trafficTokenFor(by: OwnerCredential, sandboxId: string): string {
    return this.links().sandboxToken('traffic', by.owner, sandboxId, by.tokenId);
  }

  /** The content token of a volume, for the API token that asks (derived, not stored: the same
   * each time it is asked for). */
  volumeTokenFor(by: OwnerCredential, volumeId: string): string {
    return this.links().sandboxToken('volume', by.owner, volumeId, by.tokenId);
  }

  async volumeToken(volumeId: string, token: string): Promise<VolumeCredential | undefined> {
    const rec = await this.store.volumes.get(volumeId);
    const madeBy = rec && this.links().verifySandboxToken('volume', token, rec.owner, volumeId);
    if (!rec || !madeBy || !(await this.lives(madeBy, rec.owner))) return undefined;
    return { kind: 'volume', owner: rec.owner, volumeId };
  }

  async accessToken(sandboxId: string, token: string): Promise<SandboxCredential | undefined> {
    const owner = await this.sandboxTokenOwner('access', sandboxId, token);
    return owner === undefined ? undefined : { kind: 'sandbox', owner, sandboxId };
  }

  async trafficToken(sandboxId: string, token: string): Promise<TrafficCredential | undefined> {
    const owner = await this.sandboxTokenOwner('traffic', sandboxId, token);
    return owner === undefined ? undefined : { kind: 'traffic', owner, sandboxId };
  }

  /** The owner a sandbox token of that kind speaks for: its instance's, if the token was made for
   * this instance and the API token that asked for it lives. */
  private async sandboxTokenOwner(kind: SandboxTokenKind, sandboxId: string, token: string): Promise<string | undefined> {
    const rec = await this.store.instances.get(sandboxId);
    const madeBy = rec && this.links().verifySandboxToken(kind, token, rec.owner, sandboxId);
    if (!rec || !madeBy || !(await this.lives(madeBy, rec.owner))) return undefined;
    return rec.owner;
  }

  /** Whether an instance of that id exists (an id is random: this tells nothing to guess with). */
  async sandboxExists(sandboxId: string): Promise<boolean> {
    return (await this.store.instances.get(sandboxId)) !== undefined;
  }

  async previewLink(signed: string, sandboxId: string, port: number): Promise<PreviewCredential | undefined> {
    const link = this.links().verify(signed, sandboxId, port);
    if (!link || !(await this.lives(link.tokenId, link.owner))) return undefined;
    return { kind: 'preview', owner: link.owner, sandboxId, port };
  }

  /** A preview link of a port, for the API token that asks. */
  previewLinkFor(by: OwnerCredential, sandboxId: string, port: number, ttlS: number): { token: string; expiresAt: Date } {
    return this.links().sign(by.owner, sandboxId, port, ttlS, by.tokenId);
  }

  /** A signed link to read or write one file of a sandbox, for the API token that asks. */
  fileLinkFor(by: OwnerCredential, sandboxId: string, path: string, direction: FileLinkDirection, ttlS: number): { token: string; expiresAt: Date } {
    return this.links().fileLink(direction, by.owner, sandboxId, path, ttlS, by.tokenId);
  }

  async fileLink(signed: string, sandboxId: string, path: string, direction: FileLinkDirection): Promise<FileLinkCredential | undefined> {
    const link = this.links().verifyFileLink(direction, signed, sandboxId, path);
    if (!link || !(await this.lives(link.tokenId, link.owner))) return undefined;
    return { kind: 'file', form: 'forkpoint', owner: link.owner, sandboxId, path, direction };
  }

  /**
   * The sandbox file an E2B-signed file URL opens: the URL names its sandbox only by its host
   * name, which a deployment behind `E2B_SANDBOX_URL` does not have, so without `sandboxId` the
   * running sandboxes are tried (each with each live API token of its owner's: an access token is
   * made for one), newest first and at most MAX_ENVD_LINK_CANDIDATES of them. The API token the
   * access token was made for must live, as for the access token itself. Expiry is the caller's.
   */
  async envdFileLink(signature: string, link: EnvdFileLink, sandboxId?: string): Promise<FileLinkCredential | undefined> {
    if (!/^v1_[A-Za-z0-9+/]{43}$/.test(signature)) return undefined;
    const links = this.links();
    for (const g of await this.store.tokens.runningSandboxGrants(MAX_ENVD_LINK_CANDIDATES, sandboxId)) {
      if (links.isEnvdFileSignature(signature, link, g.owner, g.sandboxId, g.tokenId)) {
        return { kind: 'file', form: 'envd', owner: g.owner, sandboxId: g.sandboxId, path: link.path, direction: link.operation === 'read' ? 'download' : 'upload', user: link.user };
      }
    }
    return undefined;
  }

  /** Whether the API token a derived credential was made from is still the owner's, unrevoked. */
  private async lives(tokenId: string, owner: string): Promise<boolean> {
    const parent = await this.store.tokens.get(tokenId);
    return Boolean(parent && !parent.revokedAt && parent.owner === owner);
  }
}
