/**
 * What a node's writes to its instances carry: its id and the epoch of its lease (its fencing
 * token). Set once the node has joined; until then (and on a lone embedded node before it
 * listens) writes carry none. A write whose epoch another node has ended since (it judged this
 * one silent) is refused with StaleWriteError, whatever the writer read before.
 */
export class WriteFence {
  private lease: { node: string; epoch: number } | undefined;

  get current(): { node: string; epoch: number } | undefined {
    return this.lease;
  }

  set(node: string, epoch: number): void {
    this.lease = { node, epoch };
  }
}

/** A write of a node whose lease ended, or of an instance that is no longer its own. */
export class StaleWriteError extends Error {
  override readonly name = 'StaleWriteError';
  readonly code = 'STALE_WRITE';
  constructor(
    readonly instanceId: string,
    readonly lease: { node: string; epoch: number },
  ) {
    super(`instance ${instanceId} is not this node's under its lease ${lease.epoch} (another node has it, or ended this node's lease)`);
  }
}
