/** Errors with a stable code, mapped one-to-one onto HTTP statuses by the HTTP faces. */
export type ErrorCode =
  | 'INVALID_REQUEST'
  | 'UNAUTHENTICATED'
  | 'NOT_FOUND'
  | 'CONFLICT'
  | 'QUOTA_EXCEEDED'
  | 'PAYLOAD_TOO_LARGE'
  | 'UNAVAILABLE'
  | 'INTERNAL';

export class ForkpointError extends Error {
  override readonly name: string = 'ForkpointError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details?: unknown,
  ) {
    super(message);
  }
}

export class InvalidRequestError extends ForkpointError {
  override readonly name = 'InvalidRequestError';
  constructor(message: string, details?: unknown) {
    super('INVALID_REQUEST', message, details);
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
  constructor(message: string, details?: unknown) {
    super('CONFLICT', message, details);
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
  constructor(message: string, details?: unknown) {
    super('UNAVAILABLE', message, details);
  }
}

export const httpStatusOf: Record<ErrorCode, number> = {
  INVALID_REQUEST: 400,
  UNAUTHENTICATED: 401,
  NOT_FOUND: 404,
  CONFLICT: 409,
  QUOTA_EXCEEDED: 429,
  PAYLOAD_TOO_LARGE: 413,
  UNAVAILABLE: 503,
  INTERNAL: 500,
};
