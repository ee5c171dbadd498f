/** The ways a call to a sandbox's agent can fail. */

/** The agent refused the request, with an errno from inside the sandbox. */
export class AgentError extends Error {
  override readonly name = 'AgentError';
  constructor(
    readonly errno: number,
    message: string,
  ) {
    super(message);
  }
}

/** The connection closed before the answer came: a pause, or the sandbox went away. */
export class AgentClosedError extends Error {
  override readonly name = 'AgentClosedError';
  constructor(message = 'agent connection closed') {
    super(message);
  }
}

/** No answer within the request's deadline; the connection was given up. */
export class AgentTimeoutError extends Error {
  override readonly name = 'AgentTimeoutError';
}

/** The agent sent something that is not the protocol; the connection was closed. */
export class AgentProtocolError extends Error {
  override readonly name = 'AgentProtocolError';
}
