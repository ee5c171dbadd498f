import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip, createGzip } from 'node:zlib';
import type { Logger } from 'pino';
import type { SandboxRuntime } from '../seam/runtime.js';
import type { DurableManifest } from '../store/durable.js';
import type { CheckpointRecord } from '../store/checkpoints.js';
import type { Store } from '../store/index.js';
import { isObjectStoreAway, type ObjectStore } from '../store/object-store.js';
import { backoffDelay, retryUntil } from '../lib/backoff.js';
import { delayUnlessAborted } from '../lib/deadline.js';
import { UnavailableError } from './errors.js';

/** A failed upload is tried again after this, then twice as long each time, up to RETRY_LAST_MS. */
const RETRY_FIRST_MS = 2_000;
const RETRY_LAST_MS = 10 * 60_000;

export interface DurableState {
  durable: boolean;
  /** Bytes this checkpoint added to the object store (blobs it shares were there already). */
  uploadedBytes: number | null;
}

/**
 * Durable checkpoints: with an object store configured, a `ready` checkpoint is uploaded in the
 * background as gzipped, content-addressed blobs — one per layer (a layer packs to the same bytes
 * every time, and is packed once) and one for its memory image — and a small manifest. A blob
 * already there is not uploaded again; deleting checkpoints drops their references, and a blob
 * nothing references is deleted from the bucket.
 */
/** How often a wait for durability looks. */
const DURABLE_POLL_MS = 200;

export class DurableCheckpoints {
  private queue: Promise<void> = Promise.resolve();
  /** Uploads that failed, waiting for their next try: the object store may be back by then. */
  private readonly retries = new Map<string, NodeJS.Timeout>();
  private closed = false;

  constructor(
    private readonly store: Store,
    private readonly engine: SandboxRuntime,
    private readonly objects: ObjectStore | undefined,
    private readonly tmpDir: string,
    private readonly log: Logger,
  ) {}

  get enabled(): boolean {
    return this.objects !== undefined;
  }

  /** Whether the object store answers; undefined without one. */
  async reachable(): Promise<boolean | undefined> {
    if (!this.objects) return undefined;
    return this.objects.reachable().then(
      () => true,
      () => false,
    );
  }

  /** Resolves once the checkpoint is in the object store (true), or once `signal` aborts (false). */
  async waitFor(checkpointId: string, signal: AbortSignal): Promise<boolean> {
    for (;;) {
      if ((await this.state(checkpointId)).durable) return true;
      if (signal.aborted || this.closed) return false;
      await delayUnlessAborted(DURABLE_POLL_MS, signal);
    }
  }

  async state(checkpointId: string): Promise<DurableState> {
    const d = await this.store.durable.get(checkpointId);
    return { durable: d !== undefined, uploadedBytes: d?.uploadedBytes ?? null };
  }

  /** Uploads the checkpoint after the ones already queued (one at a time: the disk and the
   * link are shared with the sandboxes). One that fails is tried again later, less and less
   * often, and at the next start. */
  schedule(checkpointId: string): void {
    this.enqueue(checkpointId, 0);
  }

  private enqueue(checkpointId: string, failures: number): void {
    if (!this.objects || this.closed) return;
    clearTimeout(this.retries.get(checkpointId));
    this.retries.delete(checkpointId);
    this.queue = this.queue
      .then(() => this.upload(checkpointId))
      .catch((err: unknown) => this.retryLater(checkpointId, failures + 1, err));
  }

  private retryLater(checkpointId: string, failures: number, err: unknown): void {
    const delayMs = backoffDelay({ firstMs: RETRY_FIRST_MS, lastMs: RETRY_LAST_MS }, failures);
    this.log.warn({ err, checkpoint: checkpointId, failures, retryInMs: delayMs }, 'upload to the object store failed; tried again later');
    if (this.closed) return;
    const timer = setTimeout(() => this.enqueue(checkpointId, failures), delayMs);
    timer.unref();
    this.retries.set(checkpointId, timer);
  }

  /** Resolves when the queued uploads are done (tests, shutdown). */
  async idle(): Promise<void> {
    await this.queue;
  }

  private async upload(id: string): Promise<void> {
    const objects = this.objects!;
    const c = await this.store.checkpoints.get(id);
    if (!c || c.status !== 'ready' || (await this.store.durable.get(id))) return;
    // Another node's checkpoint: that node uploads it.
    if (!c.layers.every((l) => this.engine.disk.hasLayer(l))) return;
    let uploaded = 0;
    const layers: DurableManifest['layers'] = [];
    for (const layerId of c.layers) {
      let sha = await this.store.durable.layerBlob(layerId);
      let bytes = 0;
      if (!sha || !(await this.store.durable.hasBlob(sha))) {
        const blob = await this.putBlob(() => this.engine.disk.exportLayer(layerId));
        sha = blob.sha;
        bytes = blob.bytes;
        uploaded += blob.uploaded;
        await this.store.durable.setLayerBlob(layerId, sha);
      }
      layers.push({ id: layerId, blob: sha, bytes });
    }
    let memory: DurableManifest['memory'] = null;
    if (c.memory && this.engine.disk.hasCheckpointImages(id)) {
      const blob = await this.putBlob(() => this.engine.disk.exportCheckpointImages(id));
      uploaded += blob.uploaded;
      memory = { blob: blob.sha, bytes: blob.bytes };
    }
    const manifest: DurableManifest = { checkpointId: id, image: c.image, agentLayer: c.agentLayer, baseLayer: c.baseLayer, hostname: c.hostname, layers, memory };
    await objects.putJson(`manifests/${id}.json`, manifest);
    await this.store.durable.put({ checkpointId: id, manifest, uploadedBytes: uploaded, durableAt: new Date().toISOString() });
    // Deleted while it was being uploaded: what it referenced goes now.
    if (!(await this.store.checkpoints.get(id))) await this.forget(id);
    this.log.info({ checkpoint: id, uploadedBytes: uploaded }, 'checkpoint durable');
  }

  /** Packs a stream into a gzipped temporary file while hashing it, and uploads it unless a
   * blob of that hash is there already. The stream is opened only when it is piped at once: one
   * that fails before anything listens (tar of a layer deleted meanwhile) would end the process. */
  private async putBlob(open: () => Readable): Promise<{ sha: string; bytes: number; uploaded: number }> {
    await mkdir(this.tmpDir, { recursive: true, mode: 0o700 });
    const file = join(this.tmpDir, `blob-${randomBytes(8).toString('hex')}`);
    const hash = createHash('sha256');
    try {
      await pipeline(
        open(),
        createGzip({ level: 6 }),
        new Transform({
          transform(chunk: Buffer, _enc, cb) {
            hash.update(chunk);
            cb(null, chunk);
          },
        }),
        createWriteStream(file, { mode: 0o600 }),
      );
      const sha = hash.digest('hex');
      const { size } = await stat(file);
      if (await this.store.durable.hasBlob(sha)) return { sha, bytes: size, uploaded: 0 };
      await this.objects!.putFile(`blobs/${sha}`, file);
      await this.store.durable.addBlob(sha, size);
      return { sha, bytes: size, uploaded: size };
    } finally {
      await rm(file, { force: true });
    }
  }

  /**
   * Makes sure this node has the checkpoint's layers and memory image, fetching from the object
   * store what it lacks (and keeping it: layers are shared by every later checkpoint and fork).
   * A no-op for a checkpoint whose data is all here.
   */
  async ensureLocal(c: Pick<CheckpointRecord, 'id' | 'layers' | 'memory'>): Promise<void> {
    const checkpointId = c.id;
    const missingLayers = c.layers.filter((l) => !this.engine.disk.hasLayer(l));
    const missingMemory = c.memory && !this.engine.disk.hasCheckpointImages(checkpointId);
    if (!missingLayers.length && !missingMemory) return;
    const d = await this.store.durable.get(checkpointId);
    if (!this.objects || !d) throw new UnavailableError(`checkpoint ${checkpointId} has lost data on this node and no durable copy`, { checkpoint: checkpointId });
    for (const layerId of missingLayers) {
      const part = d.manifest.layers.find((l) => l.id === layerId);
      if (!part) throw new UnavailableError(`the durable copy of checkpoint ${checkpointId} lacks layer ${layerId}`);
      await this.fetch(checkpointId, part.blob, (blob) => this.engine.disk.importLayer(layerId, blob));
      this.log.info({ checkpoint: checkpointId, layer: layerId }, 'layer fetched from the object store');
    }
    if (missingMemory) {
      if (!d.manifest.memory) throw new UnavailableError(`the durable copy of checkpoint ${checkpointId} has no memory image`);
      await this.fetch(checkpointId, d.manifest.memory.blob, (blob) => this.engine.disk.importCheckpointImages(checkpointId, blob));
      this.log.info({ checkpoint: checkpointId }, 'memory image fetched from the object store');
    }
  }

  /** Downloads a blob into `unpack`; a download or a blob that fails its hash is the object
   * store's failure (503, the call can be made again), and the import keeps nothing of it. */
  private async fetch(checkpointId: string, sha: string, unpack: (blob: Readable) => Promise<void>): Promise<void> {
    try {
      await unpack(verifiedGunzip(await this.objects!.get(`blobs/${sha}`), sha));
    } catch (err) {
      throw new UnavailableError(`could not fetch checkpoint ${checkpointId}'s data from the object store: ${(err as Error).message}`, { checkpoint: checkpointId, blob: sha }, { cause: err });
    }
  }

  /** A deleted checkpoint: its manifest goes, and the blobs nothing else references. */
  async forget(checkpointId: string): Promise<void> {
    if (!this.objects || !(await this.store.durable.get(checkpointId))) return;
    await this.store.durable.drop(checkpointId);
    await this.objects.delete(`manifests/${checkpointId}.json`).catch((err: unknown) => this.log.warn({ err, checkpoint: checkpointId }, 'could not delete a manifest'));
    await this.collect();
  }

  /** Deletes the blobs no durable checkpoint references. */
  async collect(): Promise<void> {
    if (!this.objects) return;
    for (const sha of await this.store.durable.garbage()) {
      try {
        await this.objects.delete(`blobs/${sha}`);
        await this.store.durable.removeBlob(sha);
      } catch (err) {
        this.log.warn({ err, blob: sha }, 'could not delete a blob; tried again at the next collection');
      }
    }
  }

  /** At start: uploads what was left out, forgets what was deleted meanwhile. */
  async recover(waitS = 300): Promise<void> {
    if (!this.objects) return;
    const objects = this.objects;
    // The object store may come up after the node: wait for it, saying so.
    await retryUntil(() => objects.ensureBucket(), {
      policy: { firstMs: 250, lastMs: 10_000 },
      deadlineMs: waitS * 1000,
      retryable: isObjectStoreAway,
      onRetry: (err, delayMs, failures) => this.log.warn({ err, retryInMs: delayMs, failures }, 'the object store is not answering yet; waiting for it'),
    });
    for (const id of await this.store.durable.orphans()) await this.forget(id).catch(() => {});
    for (const id of await this.store.durable.pending()) this.schedule(id);
  }

  close(): void {
    this.closed = true;
    for (const timer of this.retries.values()) clearTimeout(timer);
    this.retries.clear();
    this.objects?.close();
  }
}

/** A blob's bytes, uncompressed, checked against the hash it is stored under: a blob damaged
 * or replaced in the bucket fails the stream at its end (so the unpack that reads it fails and
 * keeps nothing) instead of restoring what nobody checkpointed. A failed download fails it too. */
function verifiedGunzip(body: Readable, sha: string): Readable {
  const hash = createHash('sha256');
  const checked = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      hash.update(chunk);
      cb(null, chunk);
    },
    flush(cb) {
      const got = hash.digest('hex');
      cb(got === sha ? null : new Error(`blob ${sha} in the object store hashes to ${got}`));
    },
  });
  const out = createGunzip();
  body.on('error', (err) => out.destroy(err));
  checked.on('error', (err) => out.destroy(err));
  return body.pipe(checked).pipe(out);
}
