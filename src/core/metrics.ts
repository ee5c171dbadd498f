import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { EventBus, InstanceEvent } from './events.js';
import type { StandbyKind } from './warm-standbys.js';

/** What the metrics read when scraped: counts the core keeps elsewhere. */
export interface MetricSources {
  instancesByStatus(): Promise<Record<string, number>>;
  jobQueueDepth(): number;
  durableBacklog(): Promise<number>;
  diskFreeBytes(): Promise<number>;
  /** Standbys held now, by kind (for forks, creates, rollbacks), and the memory they hold. */
  standbys(): { byKind: Record<StandbyKind, number>; memoryBytes: number };
}

const seconds = (ms: unknown) => (typeof ms === 'number' ? ms / 1000 : undefined);
/** From a millisecond pause to minutes of waiting for a checkpoint to be ready. */
const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180];

/**
 * The server's Prometheus metrics (`GET /metrics`): what the API is asked and how long it takes,
 * how long checkpoints pause and take, rollbacks, forks and wakes (read off the event bus), and,
 * at each scrape, instances by state, the job queue, the durable upload backlog and the disk.
 */
export class Metrics {
  readonly registry = new Registry();
  private readonly requests = new Histogram({ name: 'forkpoint_http_request_duration_seconds', help: 'API requests by route and status', labelNames: ['method', 'route', 'status'], buckets: BUCKETS, registers: [this.registry] });
  private readonly pause = new Histogram({ name: 'forkpoint_checkpoint_pause_seconds', help: 'How long a checkpoint paused its sandbox', buckets: BUCKETS, registers: [this.registry] });
  private readonly ready = new Histogram({ name: 'forkpoint_checkpoint_ready_seconds', help: 'From a checkpoint asked for to ready', buckets: BUCKETS, registers: [this.registry] });
  private readonly failed = new Counter({ name: 'forkpoint_checkpoints_failed_total', help: 'Checkpoints that ended failed (CRIU or disk)', registers: [this.registry] });
  private readonly rollback = new Histogram({ name: 'forkpoint_rollback_seconds', help: 'Rollbacks in place', buckets: BUCKETS, registers: [this.registry] });
  private readonly fork = new Histogram({ name: 'forkpoint_fork_seconds', help: 'Forks, from a ready checkpoint to every fork running', buckets: BUCKETS, registers: [this.registry] });
  private readonly forked = new Counter({ name: 'forkpoint_forks_total', help: 'Instances forked, by whether each took a standby (warm) or was restored (cold)', labelNames: ['kind'], registers: [this.registry] });
  private readonly rolledBack = new Counter({ name: 'forkpoint_rollbacks_total', help: 'Rollbacks in place, by whether each swapped in a standby (warm) or restored (cold)', labelNames: ['kind'], registers: [this.registry] });
  private readonly wake = new Histogram({ name: 'forkpoint_wake_seconds', help: 'Wakes of hibernated instances', buckets: BUCKETS, registers: [this.registry] });
  private readonly processing = new Map<string, number>();
  private untap: (() => void) | undefined;

  constructor(sources: MetricSources) {
    collectDefaultMetrics({ register: this.registry, prefix: 'forkpoint_process_' });
    const registers = [this.registry];
    new Gauge({
      name: 'forkpoint_instances',
      help: 'Instances of this node by status',
      labelNames: ['status'],
      registers,
      async collect() {
        this.reset();
        for (const [status, n] of Object.entries(await sources.instancesByStatus())) this.set({ status }, n);
      },
    });
    new Gauge({ name: 'forkpoint_job_queue_depth', help: 'Checkpoint jobs queued or running', registers, collect() { this.set(sources.jobQueueDepth()); } });
    new Gauge({ name: 'forkpoint_durable_upload_backlog', help: 'Ready checkpoints not yet in the object store', registers, async collect() { this.set(await sources.durableBacklog()); } });
    new Gauge({
      name: 'forkpoint_warm_standbys',
      help: 'Sandboxes restored or booted ahead and held for the next forks, creates and rollbacks, by kind',
      labelNames: ['kind'],
      registers,
      collect() {
        for (const [kind, n] of Object.entries(sources.standbys().byKind)) this.set({ kind }, n);
      },
    });
    new Gauge({ name: 'forkpoint_warm_standby_memory_bytes', help: 'Memory the held standbys use', registers, collect() { this.set(sources.standbys().memoryBytes); } });
    new Gauge({ name: 'forkpoint_data_disk_free_bytes', help: 'Free bytes under the data directory', registers, async collect() { this.set(await sources.diskFreeBytes()); } });
  }

  watch(events: EventBus): void {
    this.untap ??= events.tap((e) => this.observe(e));
  }

  close(): void {
    this.untap?.();
    this.untap = undefined;
  }

  observeRequest(method: string, route: string, status: number, durationS: number): void {
    this.requests.observe({ method, route, status: String(status) }, durationS);
  }

  async text(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  private observe(e: InstanceEvent): void {
    const id = typeof e.data.checkpoint_id === 'string' ? e.data.checkpoint_id : undefined;
    switch (e.type) {
      case 'checkpoint.processing':
        if (id) this.processing.set(id, performance.now());
        break;
      case 'checkpoint.ready': {
        const p = seconds(e.data.pause_ms);
        if (p !== undefined) this.pause.observe(p);
        const since = id ? this.processing.get(id) : undefined;
        if (since !== undefined) this.ready.observe((performance.now() - since) / 1000);
        if (id) this.processing.delete(id);
        break;
      }
      case 'checkpoint.failed':
        this.failed.inc();
        if (id) this.processing.delete(id);
        break;
      case 'rollback':
        this.record(this.rollback, e.data.ms);
        this.rolledBack.inc({ kind: e.data.warm === true ? 'warm' : 'cold' });
        break;
      case 'fork': {
        this.record(this.fork, e.data.ms);
        const all = Array.isArray(e.data.instance_ids) ? e.data.instance_ids.length : 0;
        const warm = Array.isArray(e.data.warm_ids) ? e.data.warm_ids.length : 0;
        if (warm) this.forked.inc({ kind: 'warm' }, warm);
        if (all > warm) this.forked.inc({ kind: 'cold' }, all - warm);
        break;
      }
      case 'instance.woken':
        this.record(this.wake, e.data.ms);
        break;
      default:
    }
  }

  private record(h: Histogram, ms: unknown): void {
    const s = seconds(ms);
    if (s !== undefined) h.observe(s);
  }
}
