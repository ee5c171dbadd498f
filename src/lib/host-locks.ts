import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { mkdir } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { Readable, Writable } from 'node:stream';

/** A lock another live process holds. */
export class LockHeldError extends Error {
  override readonly name = 'LockHeldError';
  constructor(
    readonly what: string,
    readonly path: string,
  ) {
    super(`${what} belongs to another live forkpoint server (${path} is locked)`);
  }
}

/**
 * Exclusive locks on files (flock(2)) for as long as this process lives, and not a moment longer:
 * they are held by a `flock` child reading this process's pipe, which ends when this process
 * does, even by kill -9, and takes the locks with it. Node has no flock of its own.
 */
export class HostLocks {
  private constructor(private readonly holder: ChildProcessByStdio<Writable, Readable, null>) {}

  /** Takes every lock (`what` names each in errors), waiting up to `waitS` for one a process
   * that just died still holds; a lock a live process holds is a LockHeldError. */
  static async take(locks: { path: string; what: string }[], waitS = 2): Promise<HostLocks> {
    for (const l of locks) await mkdir(dirname(l.path), { recursive: true, mode: 0o700 });
    // flock -E 75 FILE flock -E 76 FILE2 ... sh -c 'echo held; exec cat'
    const args = locks.flatMap((l, i) => [...(i ? ['flock'] : []), '-w', String(waitS), '-E', String(75 + i), l.path]);
    const holder = spawn('flock', [...args, 'sh', '-c', 'echo held; exec cat >/dev/null'], { stdio: ['pipe', 'pipe', 'ignore'] });
    const held = await new Promise<number | 'held'>((resolve, reject) => {
      holder.once('error', reject);
      holder.stdout.once('data', () => resolve('held'));
      holder.once('exit', (code) => resolve(code ?? -1));
    });
    if (held !== 'held') {
      const failed = locks[held - 75];
      if (failed) throw new LockHeldError(failed.what, failed.path);
      throw new Error(`could not take the locks ${locks.map((l) => l.path).join(', ')}: flock exited with ${held}`);
    }
    holder.unref();
    holder.stdout.destroy();
    (holder.stdin as Writable & { unref?: () => void }).unref?.();
    return new HostLocks(holder);
  }

  release(): void {
    this.holder.stdin.end();
    this.holder.kill();
  }
}
