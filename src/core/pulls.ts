import { BadReferenceError, formatReference, parseReference, plainHttpAllowed, type ImageReference } from '../lib/image-reference.js';
import { PullError, type PullFailure } from '../seam/errors.js';
import type { ImagePuller, PulledImage, PullProgress } from '../seam/runtime.js';

export type { PullProgress };
import { ForkpointError, InvalidRequestError, PayloadTooLargeError, QuotaExceededError, UnavailableError } from './errors.js';

/** Pulls one owner may have running at once on a node: each takes disk, bandwidth and CPU. */
const PULLS_PER_OWNER = 2;

/** What a registry's refusal means to an API caller, with the reason in `details`. */
function pullFailure(err: PullError): ForkpointError {
  const details = { reason: `REGISTRY_${err.reason}` satisfies `REGISTRY_${PullFailure}` };
  switch (err.reason) {
    case 'DENIED':
      return new ForkpointError('FORBIDDEN', err.message, details, { cause: err });
    case 'NOT_IN_REGISTRY':
      return new ForkpointError('NOT_FOUND', err.message, details, { cause: err });
    case 'TOO_LARGE':
      return new PayloadTooLargeError(err.message, details);
    case 'NO_PLATFORM':
      return new InvalidRequestError(err.message, details, { cause: err });
    default:
      return new UnavailableError(err.message, details, { cause: err });
  }
}

export interface PullSettings {
  /** Registries (host or host:port) spoken to in plain HTTP besides loopback's. */
  insecureRegistries: readonly string[];
  maxPullBytes: number;
  /** What one owner's pulled images may weigh in all (as fetched). */
  ownerMaxPulledBytes: number;
  /** The blob cache beyond the blobs of the pulled trees on this node. */
  cacheBytes: number;
}

/** What an owner's pulled images weigh now, but for the one named `except` (a pull replaces it). */
export type PulledBytes = (owner: string, except: string) => Promise<number>;

/** An image reference as the catalog names what it pulled: the whole of it, so that `python:3`
 * and `docker.io/library/python:3` are one image. */
export function canonicalImageName(text: string): string {
  return formatReference(checkedReference(text));
}

/** What `parse` makes of a client's text; a text it refuses is the client's error (400, `details`). */
export function parsedOrInvalid<T>(parse: () => T, details: Record<string, string>): T {
  try {
    return parse();
  } catch (err) {
    if (err instanceof BadReferenceError) throw new InvalidRequestError(err.message, details);
    throw err;
  }
}

const checkedReference = (text: string): ImageReference => parsedOrInvalid(() => parseReference(text), { image: text, reason: 'BAD_REFERENCE' });

/** Pulls from registries through the engine's puller, with this server's rules: which registries
 * may be plain HTTP, how much a pull may fetch, whose credentials it uses (the request's, else the
 * owner's kept ones), and what a failure answers. */
/** The credentials an owner keeps for a registry, if any. */
export type KeptCredentials = (owner: string, registry: string) => Promise<{ username: string; password: string } | undefined>;

export class ImagePulls {
  private readonly running = new Map<string, number>();

  constructor(
    private readonly puller: ImagePuller,
    private readonly settings: PullSettings,
    private readonly kept: KeptCredentials = async () => undefined,
    private readonly pulledBytes: PulledBytes = async () => 0,
  ) {}

  async pull(owner: string, text: string, credentials: { username: string; password: string } | undefined, signal: AbortSignal, holdLayers: (layerIds: string[]) => Promise<void>, onProgress?: (p: PullProgress) => void): Promise<{ name: string; pulled: PulledImage }> {
    const image = checkedReference(text);
    const now = this.running.get(owner) ?? 0;
    if (now >= PULLS_PER_OWNER) throw new QuotaExceededError(`${now} pulls of yours are running on this node; wait for one to end`, { reason: 'PULLS_PER_OWNER', limit: PULLS_PER_OWNER });
    this.running.set(owner, now + 1);
    try {
      // Given with the pull, or kept by the owner for the registry.
      const creds = credentials ?? (await this.kept(owner, image.registry));
      const name = formatReference(image);
      // The smaller of a pull's bound and what is left of the owner's.
      const left = Math.max(0, this.settings.ownerMaxPulledBytes - (await this.pulledBytes(owner, name)));
      const maxBytes = Math.min(this.settings.maxPullBytes, left);
      try {
        const pulled = await this.puller.pull({ image, plainHttp: plainHttpAllowed(image, this.settings.insecureRegistries), credentials: creds, maxBytes, onProgress, holdLayers }, signal);
        return { name, pulled };
      } catch (err) {
        if (err instanceof PullError && err.reason === 'TOO_LARGE' && left < this.settings.maxPullBytes) {
          throw new QuotaExceededError(`your pulled images may weigh ${this.settings.ownerMaxPulledBytes} bytes in all, and ${left} are left: ${err.message}`, { reason: 'PULLED_PER_OWNER', limit_bytes: this.settings.ownerMaxPulledBytes, left_bytes: left });
        }
        throw err;
      }
    } catch (err) {
      if (err instanceof PullError) throw pullFailure(err);
      throw err;
    } finally {
      const left = (this.running.get(owner) ?? 1) - 1;
      if (left > 0) this.running.set(owner, left);
      else this.running.delete(owner);
    }
  }

  /** The node's blob cache back within its bound, keeping what the trees in `keep` came from. */
  trimCache(keep: readonly string[]): Promise<{ removedBytes: number }> {
    return this.puller.trimCache(keep, this.settings.cacheBytes);
  }
}
