import type { Store } from '../store/index.js';
import type { InstancePatch, InstanceRecord, InstanceStatus } from '../store/instances.js';
import { ConflictError, NotFoundError } from './errors.js';

/**
 * The instance lifecycle, in one place: its states, the transitions between them, and the one
 * way a status is written, a compare-and-set on the row's version and node. A transition whose
 * instance is no longer in a state it starts from, or that another write overtook, or that is
 * no longer this node's, is a named conflict (409, `details.reason`), never a silent overwrite.
 * (`lost` is reached by `release` or the cluster's judgement; its way back is the cluster's,
 * written by the store's own conditional updates.)
 */
export const TRANSITIONS = {
  /** A sandbox booted: a create, a start, a build step. */
  boot: { from: ['starting', 'stopped', 'error'], to: 'running' },
  /** A sandbox restored or adopted in its place: a rollback, a fork's restore, a re-adoption. */
  restore: { from: ['starting', 'running', 'stopped', 'hibernated', 'error'], to: 'running' },
  wake: { from: ['hibernated'], to: 'running' },
  hibernate: { from: ['running'], to: 'hibernated' },
  stop: { from: ['starting', 'running', 'hibernated', 'stopped', 'error'], to: 'stopped' },
  fail: { from: ['starting', 'running', 'hibernated', 'stopped', 'error'], to: 'error' },
  /** Its node lets go of it, a durable checkpoint of the moment taken (a drain): another node
   * takes it over as it does a lost one. */
  release: { from: ['running', 'stopped'], to: 'lost' },
} as const satisfies Record<string, { from: readonly InstanceStatus[]; to: InstanceStatus }>;

export type Transition = keyof typeof TRANSITIONS;

/** How many times a transition reads again when a write that left its state alone came first. */
const ATTEMPTS = 5;

export class TransitionConflictError extends ConflictError {
  constructor(id: string, transition: Transition, status: InstanceStatus | undefined, reason: 'NOT_ALLOWED' | 'OVERTAKEN' | 'NOT_THIS_NODE') {
    super(
      reason === 'NOT_ALLOWED'
        ? `instance ${id} is ${status}: it cannot ${transition} from there`
        : reason === 'NOT_THIS_NODE'
          ? `instance ${id} is no longer this node's`
          : `instance ${id} changed while it was to ${transition}; try again`,
      { reason: `TRANSITION_${reason}`, transition, status, retryable: reason === 'OVERTAKEN' },
    );
  }
}

export function allowed(transition: Transition, from: InstanceStatus): boolean {
  return (TRANSITIONS[transition].from as readonly InstanceStatus[]).includes(from);
}

export class Lifecycle {
  constructor(
    private readonly store: Store,
    /** The node this server is: it moves only its own instances. */
    private readonly nodeId: string,
  ) {}

  /** Moves the instance by `transition`, writing `patch` with its new status, in `tx` when
   * given (the write is then part of that transaction). `known`: the row as its caller last read
   * or wrote it, tried first instead of a read (every write moves a row's version: a stale one
   * fails the compare-and-set and the row is read afresh). */
  async move(id: string, transition: Transition, patch: InstancePatch = {}, tx: Store = this.store, known?: InstanceRecord): Promise<InstanceRecord> {
    for (let attempt = 0; ; attempt++) {
      const cur = attempt === 0 && known?.id === id ? known : await tx.instances.get(id);
      if (!cur) throw new NotFoundError('instance', id);
      if (cur.node !== null && cur.node !== this.nodeId) throw new TransitionConflictError(id, transition, cur.status, 'NOT_THIS_NODE');
      if (!allowed(transition, cur.status)) throw new TransitionConflictError(id, transition, cur.status, 'NOT_ALLOWED');
      const next = await tx.instances.compareAndSet(id, cur.version, cur.node, { ...patch, status: TRANSITIONS[transition].to });
      if (next) return next;
      if (attempt + 1 >= ATTEMPTS) throw new TransitionConflictError(id, transition, cur.status, 'OVERTAKEN');
    }
  }
}
