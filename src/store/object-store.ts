import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { CreateBucketCommand, DeleteObjectCommand, GetObjectCommand, HeadBucketCommand, ListObjectsV2Command, PutObjectCommand, S3Client, S3ServiceException } from '@aws-sdk/client-s3';

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
/** A failure worth waiting out: the store not reachable, or answering 5xx (not a refusal). */
export function isObjectStoreAway(err: unknown): boolean {
  return !(err instanceof S3ServiceException) || (err.$metadata.httpStatusCode ?? 500) >= 500;
}

export class ObjectStore {
  private readonly s3: S3Client;

  constructor(private readonly cfg: ObjectStoreConfig) {
    this.s3 = new S3Client({
      endpoint: cfg.endpoint,
      region: cfg.region,
      forcePathStyle: true,
      // Checksums only where S3 requires them: the default streams uploads as aws-chunked with a
      // trailer, which not every S3-compatible server understands (some store the framing).
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      credentials: { accessKeyId: cfg.accessKeyId, secretAccessKey: cfg.secretAccessKey },
      requestHandler: { requestTimeout: REQUEST_TIMEOUT_MS },
    });
  }

  /** Makes the bucket if it is not there (a fresh MinIO, a test's server); one that exists but
   * is not ours to reach fails here, at start, rather than at the first upload. */
  async ensureBucket(): Promise<void> {
    try {
      await this.s3.send(new HeadBucketCommand({ Bucket: this.cfg.bucket }));
    } catch (err) {
      if (!(err instanceof S3ServiceException) || err.$metadata.httpStatusCode !== 404) throw err;
      await this.s3.send(new CreateBucketCommand({ Bucket: this.cfg.bucket })).catch((e: unknown) => {
        // Another node starting at the same moment made it first: it is there, as wanted.
        if (e instanceof S3ServiceException && (e.name === 'BucketAlreadyOwnedByYou' || e.name === 'BucketAlreadyExists')) return;
        throw e;
      });
    }
  }

  /** Whether the bucket answers (readiness). */
  async reachable(): Promise<void> {
    await this.s3.send(new HeadBucketCommand({ Bucket: this.cfg.bucket }));
  }

  private key(name: string): string {
    return `${this.cfg.prefix}${name}`;
  }

  async putFile(name: string, path: string): Promise<void> {
    const { size } = await stat(path);
    await this.s3.send(new PutObjectCommand({ Bucket: this.cfg.bucket, Key: this.key(name), Body: createReadStream(path), ContentLength: size }));
  }

  async putJson(name: string, value: unknown): Promise<void> {
    await this.s3.send(new PutObjectCommand({ Bucket: this.cfg.bucket, Key: this.key(name), Body: JSON.stringify(value), ContentType: 'application/json' }));
  }

  /** An object's bytes, streamed. */
  async get(name: string): Promise<Readable> {
    const r = await this.s3.send(new GetObjectCommand({ Bucket: this.cfg.bucket, Key: this.key(name) }));
    if (!(r.Body instanceof Readable)) throw new Error(`no body for ${name}`);
    return r.Body;
  }

  async delete(name: string): Promise<void> {
    await this.s3.send(new DeleteObjectCommand({ Bucket: this.cfg.bucket, Key: this.key(name) }));
  }

  /** Names under `under` (without the prefix), every page of them. */
  async list(under = ''): Promise<string[]> {
    const out: string[] = [];
    let token: string | undefined;
    do {
      const r = await this.s3.send(new ListObjectsV2Command({ Bucket: this.cfg.bucket, Prefix: this.key(under), ContinuationToken: token }));
      for (const o of r.Contents ?? []) if (o.Key) out.push(o.Key.slice(this.cfg.prefix.length));
      token = r.IsTruncated ? r.NextContinuationToken : undefined;
    } while (token);
    return out;
  }

  close(): void {
    this.s3.destroy();
  }
}
