import { StoreUnavailableError } from '../store/db.js';
import { StaleWriteError } from '../store/fence.js';
/** Errors with a stable code, mapped one-to-one onto HTTP statuses by the HTTP faces. */
export type ErrorCode =
  | 'INVALID_REQUEST'
  | 'UNAUTHENTICATED'
  | 'FORBIDDEN'
  | 'NOT_FOUND'
  | 'CONFLICT'
  | 'QUOTA_EXCEEDED'
  | 'PAYLOAD_TOO_LARGE'
  | 'UNAVAILABLE'
  | 'INSUFFICIENT_STORAGE'
  | 'SANDBOX_NOT_RUNNING'
  | 'DOCKERFILE_INVALID'
  | 'BUILD_STEP_FAILED'
  | 'INTERNAL';

export class ForkpointError extends Error {
  override readonly name: string = 'ForkpointError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details?: unknown,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

export class InvalidRequestError extends ForkpointError {
  override readonly name = 'InvalidRequestError';
  constructor(message: string, details?: unknown, options?: ErrorOptions) {
    super('INVALID_REQUEST', message, details, options);
  }
}

export class NotFoundError extends ForkpointError {
  override readonly name = 'NotFoundError';
  constructor(what: string, id: string) {
    super('NOT_FOUND', `${what} ${id} not found`, { [what]: id });
  }
}

export class ConflictError extends ForkpointError {
  override readonly name = 'ConflictError';
  constructor(message: string, details?: unknown, options?: ErrorOptions) {
    super('CONFLICT', message, details, options);
  }
}

export class QuotaExceededError extends ForkpointError {
  override readonly name = 'QuotaExceededError';
  constructor(message: string, details?: unknown) {
    super('QUOTA_EXCEEDED', message, details);
  }
}

export class UnauthenticatedError extends ForkpointError {
  override readonly name = 'UnauthenticatedError';
  constructor(message = 'a valid API token is required') {
    super('UNAUTHENTICATED', message);
  }
}

export class PayloadTooLargeError extends ForkpointError {
  override readonly name = 'PayloadTooLargeError';
  constructor(message: string, details?: unknown) {
    super('PAYLOAD_TOO_LARGE', message, details);
  }
}

export class UnavailableError extends ForkpointError {
  override readonly name = 'UnavailableError';
  constructor(message: string, details?: unknown, options?: ErrorOptions) {
    super('UNAVAILABLE', message, details, options);
  }
}

/** Every address of the sandboxes' subnet is an instance's (FORKPOINT_NETWORK_CIDR). */
export class AddressesExhaustedError extends UnavailableError {
  constructor() {
    super("every address of the sandboxes' subnet is in use: delete instances, or give the server a larger FORKPOINT_NETWORK_CIDR", { reason: 'ADDRESSES_EXHAUSTED' });
  }
}

/** The disk under the data directory is full: nothing was left half-done, and the call can be
 * made again once there is room. */
export class InsufficientStorageError extends ForkpointError {
  override readonly name = 'InsufficientStorageError';
  constructor(message = 'the disk under the data directory is full; free some space (delete checkpoints or instances) and try again', options?: ErrorOptions) {
    super('INSUFFICIENT_STORAGE', message, undefined, options);
  }
}

/** A Dockerfile (or an image manifest) that cannot be built as written: `line` says where. */
export class DockerfileError extends ForkpointError {
  override readonly name = 'DockerfileError';
  constructor(message: string, readonly line: number | null) {
    super('DOCKERFILE_INVALID', line ? `line ${line}: ${message}` : message, { line });
  }
}

/** A build step that ran and failed: its line, what it was and the end of its output. */
export class BuildStepError extends ForkpointError {
  override readonly name = 'BuildStepError';
  constructor(message: string, details: { line: number | null; step: string; exit_code: number | null; output: string }, options?: ErrorOptions) {
    super('BUILD_STEP_FAILED', message, details, options);
  }
}

export const httpStatusOf: Record<ErrorCode, number> = {
  INVALID_REQUEST: 400,
  UNAUTHENTICATED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  CONFLICT: 409,
  QUOTA_EXCEEDED: 429,
  PAYLOAD_TOO_LARGE: 413,
  UNAVAILABLE: 503,
  INSUFFICIENT_STORAGE: 507,
  // What E2B's proxy answers for a sandbox that is not running (killed, paused): its SDKs read it so.
  SANDBOX_NOT_RUNNING: 502,
  DOCKERFILE_INVALID: 400,
  BUILD_STEP_FAILED: 422,
  INTERNAL: 500,
};

/** Whether an error, or one of its causes, says the disk is full: a syscall's ENOSPC or
 * EDQUOT, SQLite's SQLITE_FULL, or CRIU's words for either in a failure it reported. */
/** The database went away under a call: no connection to it, or it shut down (SQLSTATE 57P0x)
 * or dropped the connection mid-query. */
export function isStoreAway(err: unknown): boolean {
  for (let e = err, depth = 0; e && depth < 5; e = (e as Error).cause, depth++) {
    if (e instanceof StoreUnavailableError) return true;
    const x = e as { code?: unknown; message?: unknown };
    if (typeof x.code === 'string' && /^57P0[123]$/.test(x.code)) return true;
    // node-postgres's own words for a connection that broke or a query that got no answer (a
    // database gone quiet: a partition, a host that froze).
    if (typeof x.message === 'string' && /^(Connection terminated unexpectedly|Connection terminated|Query read timeout|Connection terminated due to connection timeout|timeout exceeded when trying to connect)$/.test(x.message)) return true;
  }
  return false;
}

/** A write refused because this node's lease ended, or the instance is another node's now. */
export function isStaleWrite(err: unknown): err is StaleWriteError {
  return err instanceof StaleWriteError;
}

export function isNoSpace(err: unknown): boolean {
  for (let e = err, depth = 0; e && depth < 5; e = (e as Error).cause, depth++) {
    const x = e as { code?: unknown; message?: unknown };
    if (x.code === 'ENOSPC' || x.code === 'EDQUOT' || x.code === 'SQLITE_FULL') return true;
    if (typeof x.message === 'string' && /No space left on device|Disk quota exceeded|database or disk is full/.test(x.message)) return true;
  }
  return false;
}
