import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { UnavailableError } from './errors.js';

const KEY_BYTES = 32;
const IV_BYTES = 12;
const TAG_BYTES = 16;

/**
 * The server's key for what it keeps sealed in the store (registry passwords): AES-256-GCM, the key
 * in a file of mode 0600 beside the data, not in the database. Made on first use when the file is
 * missing; nodes sharing a database must share it (FORKPOINT_SECRETS_KEY_FILE), or what one sealed
 * the others cannot open (said as such, 503 SECRETS_KEY_MISMATCH).
 */
export class SecretsKey {
  private key: Promise<Buffer> | undefined;

  constructor(private readonly file: string) {}

  private load(): Promise<Buffer> {
    this.key ??= (async () => {
      const existing = await readFile(this.file).catch((err: NodeJS.ErrnoException) => {
        if (err.code === 'ENOENT') return undefined;
        throw err;
      });
      if (existing) {
        if (existing.length !== KEY_BYTES) throw new UnavailableError(`the secrets key ${this.file} is not ${KEY_BYTES} bytes`, { reason: 'SECRETS_KEY_INVALID' });
        return existing;
      }
      const made = randomBytes(KEY_BYTES);
      // 'wx': two servers starting at once do not each write their own.
      await writeFile(this.file, made, { mode: 0o600, flag: 'wx' }).catch(async (err: NodeJS.ErrnoException) => {
        if (err.code !== 'EEXIST') throw err;
      });
      return readFile(this.file);
    })();
    this.key.catch(() => (this.key = undefined));
    return this.key;
  }

  async seal(plain: string): Promise<string> {
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv('aes-256-gcm', await this.load(), iv);
    const body = Buffer.concat([cipher.update(plain, 'utf8'), cipher.final()]);
    return Buffer.concat([iv, cipher.getAuthTag(), body]).toString('base64');
  }

  async open(sealed: string): Promise<string> {
    const all = Buffer.from(sealed, 'base64');
    const decipher = createDecipheriv('aes-256-gcm', await this.load(), all.subarray(0, IV_BYTES));
    decipher.setAuthTag(all.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
    try {
      return Buffer.concat([decipher.update(all.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]).toString('utf8');
    } catch (cause) {
      throw new UnavailableError('a sealed secret does not open with this server\'s secrets key (nodes sharing a database need one key: FORKPOINT_SECRETS_KEY_FILE)', { reason: 'SECRETS_KEY_MISMATCH' }, { cause });
    }
  }
}
