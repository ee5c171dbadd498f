/**
 * What happens to an instance, as it happens, for UIs and agents that follow long work without
 * polling (`GET /instances/{id}/events`). The last events of each instance are kept, so that a
 * client that reconnects with the id of the last event it saw misses nothing in between.
 */
export type InstanceEventType =
  | 'instance.started'
  | 'instance.stopped'
  | 'instance.deleted'
  | 'instance.hibernated'
  | 'instance.woken'
  | 'checkpoint.processing'
  | 'checkpoint.ready'
  | 'checkpoint.failed'
  | 'rollback'
  | 'fork'
  | 'exec.started'
  | 'exec.ended';

export interface InstanceEvent {
  /** Increasing across the server's life: pass it back as Last-Event-ID to resume. */
  seq: number;
  type: InstanceEventType;
  instance_id: string;
  at: string;
  data: Record<string, unknown>;
}

const KEPT = 200;

export class EventBus {
  private seq = 0;
  private readonly recent = new Map<string, InstanceEvent[]>();
  private readonly listeners = new Map<string, Set<(e: InstanceEvent) => void>>();

  private readonly taps = new Set<(e: InstanceEvent) => void>();

  /** Every event of every instance (metrics). Returns the unsubscribe. */
  tap(listener: (e: InstanceEvent) => void): () => void {
    this.taps.add(listener);
    return () => this.taps.delete(listener);
  }

  emit(instanceId: string, type: InstanceEventType, data: Record<string, unknown> = {}): void {
    const event: InstanceEvent = { seq: ++this.seq, type, instance_id: instanceId, at: new Date().toISOString(), data };
    let kept = this.recent.get(instanceId);
    if (!kept) this.recent.set(instanceId, (kept = []));
    kept.push(event);
    if (kept.length > KEPT) kept.shift();
    for (const l of [...(this.listeners.get(instanceId) ?? []), ...this.taps]) {
      try {
        l(event);
      } catch {
        // a listener's failure is its own (its client went away)
      }
    }
    if (type === 'instance.deleted') this.recent.delete(instanceId);
  }

  /** Calls `listener` with every event of the instance after `afterSeq` (kept ones first),
   * then as they come. Returns the unsubscribe. */
  follow(instanceId: string, afterSeq: number | undefined, listener: (e: InstanceEvent) => void): () => void {
    if (afterSeq !== undefined) for (const e of this.recent.get(instanceId) ?? []) if (e.seq > afterSeq) listener(e);
    let set = this.listeners.get(instanceId);
    if (!set) this.listeners.set(instanceId, (set = new Set()));
    set.add(listener);
    return () => {
      set.delete(listener);
      if (!set.size && this.listeners.get(instanceId) === set) this.listeners.delete(instanceId);
    };
  }
}
