/**
 * OCI / Docker image references, as Docker reads them: `[registry[:port]/]repository[:tag][@digest]`,
 * a first part with a dot, a colon or `localhost` being the registry (else Docker Hub, whose
 * one-part names are under `library/`). Parsed by hand because the grammar is small and fixed
 * (distribution's reference/regexp.go) and every value here goes to a command line: what does not
 * match is refused, never passed on.
 */
export interface ImageReference {
  /** The registry's host[:port] (Docker Hub: docker.io, which skopeo dials as Docker does). */
  registry: string;
  /** The repository path in that registry (`library/python`, `team/app`). */
  repository: string;
  tag: string | undefined;
  digest: string | undefined;
}

const COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const DIGEST = /^sha256:[0-9a-f]{64}$/;
const HOST = /^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$/;
const DOCKER_HUB = 'docker.io';
/** At most this long, as distribution allows (255 for the name). */
const MAX_LENGTH = 512;

export class BadReferenceError extends Error {
  override readonly name = 'BadReferenceError';
}

/** Whether `text` names an image in a registry rather than a local image: it has a registry, a
 * path, a tag or a digest (a bare word such as `debian` stays a local name). */
export function looksLikeReference(text: string): boolean {
  return /[/:@]/.test(text);
}

export function parseReference(text: string): ImageReference {
  if (text.length === 0 || text.length > MAX_LENGTH) throw new BadReferenceError(`an image reference is 1-${MAX_LENGTH} characters`);
  let rest = text;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(digest)) throw new BadReferenceError(`${text}: a digest is sha256: and 64 hex digits`);
  }
  let tag: string | undefined;
  const lastSlash = rest.lastIndexOf('/');
  const colon = rest.lastIndexOf(':');
  if (colon > lastSlash) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw new BadReferenceError(`${text}: bad tag ${tag}`);
  }
  const parts = rest.split('/');
  let registry = DOCKER_HUB;
  const first = parts[0]!;
  if (parts.length > 1 && (first.includes('.') || first.includes(':') || first === 'localhost' || first.startsWith('['))) {
    if (!HOST.test(first)) throw new BadReferenceError(`${text}: bad registry ${first}`);
    registry = first === 'index.docker.io' || first === 'registry-1.docker.io' ? DOCKER_HUB : first;
    parts.shift();
  }
  if (parts.length === 0 || parts.some((p) => !COMPONENT.test(p))) throw new BadReferenceError(`${text}: a repository is lowercase letters, digits and separators, in parts split by /`);
  if (registry === DOCKER_HUB && parts.length === 1) parts.unshift('library');
  return { registry, repository: parts.join('/'), tag: tag ?? (digest ? undefined : 'latest'), digest };
}

/** The reference written out in full (`registry/repository:tag@digest`): one image, one name. */
export function formatReference(r: ImageReference, opts: { digest?: string } = {}): string {
  const digest = opts.digest ?? r.digest;
  return `${r.registry}/${r.repository}${r.tag && !opts.digest ? `:${r.tag}` : ''}${digest ? `@${digest}` : ''}`;
}

/** The registry's host name without its port or brackets. */
export function registryHost(r: ImageReference): string {
  const m = /^\[([^\]]+)\]/.exec(r.registry);
  if (m) return m[1]!;
  const i = r.registry.lastIndexOf(':');
  return i >= 0 ? r.registry.slice(0, i) : r.registry;
}

/** A registry that may be spoken to in plain HTTP: one on this machine's loopback, or one the
 * operator listed. */
export function plainHttpAllowed(r: ImageReference, insecure: readonly string[]): boolean {
  const host = registryHost(r);
  return host === 'localhost' || /^127\.\d+\.\d+\.\d+$/.test(host) || host === '::1' || insecure.includes(r.registry) || insecure.includes(host);
}

/** A registry's name as a reference would carry it (`host[:port]`, Docker Hub's names as
 * `docker.io`), or a BadReferenceError. */
export function parseRegistry(text: string): string {
  if (!HOST.test(text) || text.length > 255) throw new BadReferenceError(`${text}: a registry is host or host:port`);
  return text === 'index.docker.io' || text === 'registry-1.docker.io' ? DOCKER_HUB : text;
}
