import { AgentClosedError, AgentError, AgentProtocolError, AgentTimeoutError } from '../seam/errors.js';
import { EngineError } from '../seam/errors.js';
import { ConflictError, ForkpointError, InsufficientStorageError, InvalidRequestError, isNoSpace, UnavailableError } from './errors.js';

/** What an engine or agent failure means to an API caller. Anything not recognised is passed
 * on as it is (a bug: the HTTP face answers 500 and logs it). */
export function engineFailure(err: unknown): Error {
  if (err instanceof ForkpointError) return err;
  if (isNoSpace(err)) return new InsufficientStorageError(undefined, { cause: err });
  if (err instanceof EngineError) {
    switch (err.code) {
      case 'PROCESS_LOST':
      case 'NOT_RUNNING':
      case 'LAYER_LIMIT':
      case 'AGENT_BROKEN':
      case 'MEMORY_LOST':
      case 'VOLUME_BUSY':
        return new ConflictError(err.message, { engine: err.code }, { cause: err });
      case 'SPAWN_FAILED':
        return new InvalidRequestError(err.message);
      default:
        return new UnavailableError(err.message, { engine: err.code }, { cause: err });
    }
  }
  // The agent refused a file operation: something inside the sandbox broke forkpoint's own files.
  if (err instanceof AgentError) return new ConflictError(`the sandbox refused: ${err.message}`, { errno: err.errno }, { cause: err });
  if (err instanceof AgentProtocolError) return new ConflictError(`the sandbox's agent broke the protocol: ${err.message}`, { engine: 'AGENT_BROKEN' }, { cause: err });
  if (err instanceof AgentClosedError || err instanceof AgentTimeoutError) {
    return new UnavailableError(`the sandbox's agent: ${err.message}`, { engine: 'AGENT_UNREACHABLE' }, { cause: err });
  }
  return err as Error;
}
