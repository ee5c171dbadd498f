import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { Readable } from 'node:stream';
import type { S3Client } from '@aws-sdk/client-s3';

type Sdk = typeof import('@aws-sdk/client-s3');

export interface ObjectStoreConfig {
  endpoint: string;
  bucket: string;
  region: string;
  accessKeyId: string;
  secretAccessKey: string;
  /** Every key starts with it (several servers or uses can share a bucket). */
  prefix: string;
}

const REQUEST_TIMEOUT_MS = 120_000;

/** An S3-compatible object store (AWS, R2, MinIO, ...), by the AWS SDK v3: durable checkpoints'
 * blobs and manifests. Path-style addressing, which every S3-compatible server speaks. */
/** The store's own answer to a request (the SDK's service exceptions, told by their shape: the
 * SDK is not loaded until a store is used), with its HTTP status. */
function storeAnswer(err: unknown): { name: string; status: number | undefined } | undefined {
  if (!(err instanceof Error) || !('$fault' in err)) return undefined;
  const { $metadata } = err as Error & { $metadata?: { httpStatusCode?: number } };
  return { name: err.name, status: $metadata?.httpStatusCode };
}

/** A failure worth waiting out: the store not reachable, or answering 5xx (not a refusal). */
export function isObjectStoreAway(err: unknown): boolean {
  const answer = storeAnswer(err);
  return !answer || (answer.status ?? 500) >= 500;
}

export class ObjectStore {
  private client: Promise<{ sdk: Sdk; s3: S3Client }> | undefined;

  constructor(private readonly cfg: ObjectStoreConfig) {}

  /** The SDK and its client, made on first use: the SDK takes ~100 ms to load, which a server
   * with no object store (the embedded default) would pay at every start. */
  private connect(): Promise<{ sdk: Sdk; s3: S3Client }> {
    const cfg = this.cfg;
    this.client ??= import('@aws-sdk/client-s3').then((sdk) => ({
      sdk,
      s3: new sdk.S3Client({
        endpoint: cfg.endpoint,
        region: cfg.region,
        forcePathStyle: true,
        // Checksums only where S3 requires them: the default streams uploads as aws-chunked with a
        // trailer, which not every S3-compatible server understands (some store the framing).
        requestChecksumCalculation: 'WHEN_REQUIRED',
        responseChecksumValidation: 'WHEN_REQUIRED',
        credentials: { accessKeyId: cfg.accessKeyId, secretAccessKey: cfg.secretAccessKey },
        requestHandler: { requestTimeout: REQUEST_TIMEOUT_MS },
      }),
    }));
    return this.client;
  }

  /** Makes the bucket if it is not there (a fresh MinIO, a test's server); one that exists but
   * is not ours to reach fails here, at start, rather than at the first upload. */
  async ensureBucket(): Promise<void> {
    const { sdk, s3 } = await this.connect();
    try {
      await s3.send(new sdk.HeadBucketCommand({ Bucket: this.cfg.bucket }));
    } catch (err) {
      if (storeAnswer(err)?.status !== 404) throw err;
      await s3.send(new sdk.CreateBucketCommand({ Bucket: this.cfg.bucket })).catch((e: unknown) => {
        // Another node starting at the same moment made it first: it is there, as wanted.
        const name = storeAnswer(e)?.name;
        if (name === 'BucketAlreadyOwnedByYou' || name === 'BucketAlreadyExists') return;
        throw e;
      });
    }
  }

  /** Whether the bucket answers (readiness). */
  async reachable(): Promise<void> {
    const { sdk, s3 } = await this.connect();
    await s3.send(new sdk.HeadBucketCommand({ Bucket: this.cfg.bucket }));
  }

  private key(name: string): string {
    return `${this.cfg.prefix}${name}`;
  }

  async putFile(name: string, path: string): Promise<void> {
    const { size } = await stat(path);
    const { sdk, s3 } = await this.connect();
    await s3.send(new sdk.PutObjectCommand({ Bucket: this.cfg.bucket, Key: this.key(name), Body: createReadStream(path), ContentLength: size }));
  }

  async putJson(name: string, value: unknown): Promise<void> {
    const { sdk, s3 } = await this.connect();
    await s3.send(new sdk.PutObjectCommand({ Bucket: this.cfg.bucket, Key: this.key(name), Body: JSON.stringify(value), ContentType: 'application/json' }));
  }

  /** An object's bytes, streamed. */
  async get(name: string): Promise<Readable> {
    const { sdk, s3 } = await this.connect();
    const r = await s3.send(new sdk.GetObjectCommand({ Bucket: this.cfg.bucket, Key: this.key(name) }));
    if (!(r.Body instanceof Readable)) throw new Error(`no body for ${name}`);
    return r.Body;
  }

  async delete(name: string): Promise<void> {
    const { sdk, s3 } = await this.connect();
    await s3.send(new sdk.DeleteObjectCommand({ Bucket: this.cfg.bucket, Key: this.key(name) }));
  }

  /** Names under `under` (without the prefix), every page of them. */
  async list(under = ''): Promise<string[]> {
    const { sdk, s3 } = await this.connect();
    const out: string[] = [];
    let token: string | undefined;
    do {
      const r = await s3.send(new sdk.ListObjectsV2Command({ Bucket: this.cfg.bucket, Prefix: this.key(under), ContinuationToken: token }));
      for (const o of r.Contents ?? []) if (o.Key) out.push(o.Key.slice(this.cfg.prefix.length));
      token = r.IsTruncated ? r.NextContinuationToken : undefined;
    } while (token);
    return out;
  }

  close(): void {
    void this.client?.then(({ s3 }) => s3.destroy());
  }
}
