import type { Store } from '../store/index.js';
import type { PreviewLinks } from './previews.js';

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

/** A preview link or its cookie: one port of one sandbox, until it expires. */
export interface PreviewCredential {
  kind: 'preview';
  owner: string;
  sandboxId: string;
  port: number;
}

/** Every credential forkpoint accepts; what each may open is the HTTP edge's one table. */
export type Credential = OwnerCredential | SandboxCredential | PreviewCredential;

/**
 * Turns what a client presents into a credential, or nothing: API tokens (the store's),
 * sandbox access tokens (derived from the API token that asked for them, so revoking that token
 * revokes them) and preview links (signed for one port).
 */
export class Credentials {
  constructor(
    private readonly store: Store,
    private readonly links: () => PreviewLinks,
    /** Owners whose API tokens may see the cluster (FORKPOINT_OPERATORS). */
    private readonly operators: ReadonlySet<string>,
  ) {}

  async apiToken(token: string): Promise<OwnerCredential | undefined> {
    const rec = await this.store.tokens.verify(token);
    return rec && { kind: 'owner', owner: rec.owner, tokenId: rec.id, operator: this.operators.has(rec.owner) };
  }

  /** The access token of a sandbox, for the API token that asks. */
  accessTokenFor(by: OwnerCredential, sandboxId: string): string {
    return this.links().accessToken(by.owner, sandboxId, by.tokenId);
  }

  async accessToken(sandboxId: string, token: string): Promise<SandboxCredential | undefined> {
    const rec = await this.store.instances.get(sandboxId);
    const madeBy = rec && this.links().verifyAccess(token, rec.owner, sandboxId);
    if (!rec || !madeBy) return undefined;
    const parent = await this.store.tokens.get(madeBy);
    if (!parent || parent.revokedAt || parent.owner !== rec.owner) return undefined;
    return { kind: 'sandbox', owner: rec.owner, sandboxId };
  }

  previewLink(signed: string, sandboxId: string, port: number): PreviewCredential | undefined {
    const owner = this.links().verify(signed, sandboxId, port);
    return owner === undefined ? undefined : { kind: 'preview', owner, sandboxId, port };
  }
}
