import { linkSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { untilDeadline } from '../lib/deadline.js';
import { EngineError } from '../seam/errors.js';
import { daemonUnderShim } from './launcher.js';
import { pagesBytes } from './lazy-pages.js';
import { run } from './run.js';
import type { Spawner } from './spawner.js';

/**
 * Incremental memory checkpoints. This kernel has no soft-dirty bits, so CRIU cannot tell what a
 * sandbox wrote since its last dump; forkpoint's CRIU (deploy/criu/0009-*) tells it by userfaultfd
 * write-protection instead: as a dump of a tree left running ends, every private page is
 * write-protected, and a write lifts the protection. The next dump of the same tree, given the
 * previous one's image as its parent, copies only the pages written since: a sandbox with 1 GiB
 * written once and a small working set pauses for its working set, not its gigabyte.
 *
 * The protection lasts while its userfaultfds are open: `fp-agent wp-hold`, one per tracked
 * sandbox, keeps them, under a shim of its own (it outlives a killed server, as the sandbox
 * does), and exits when the sandbox's PID 1 does. Each checkpoint's image is made whole after
 * the thaw (`fp-agent pages-flatten`: the parent's pages copied in, in the kernel), before it is
 * ready, so that no image depends on another: checkpoints are deleted, uploaded and forked on
 * their own, as before. The parent the dump reads is a set of hard links to the parent image's
 * files, made before the pause: deleting the parent checkpoint meanwhile takes nothing away.
 *
 * Safety: a page reads as written unless this tree's last successful dump (or one before it,
 * whose pages the last one holds too) protected it and nothing wrote it since. The parent is
 * only ever the last image persisted of the very same tree (pid and start time), so a failed or
 * lost arming costs a full copy, never a stale page.
 */

/** The holder's socket, in the instance's run directory: a unix socket path has 107 bytes, and
 * the holder binds one byte longer a name first (wp_hold.c). */
const SOCKET = 'wp-hold.sock';
const MAX_SOCKET_PATH = 106;
/** How long the holder may take to listen (a static binary's start-up). */
const LISTEN_DEADLINE_MS = 5_000;
/** The files of an image a dump with a parent reads from it (CRIU's pagemaps, pages, and the
 * inventory it checks the tasks' start against). */
const PARENT_FILES = /^(pagemap-.+|pages-\d+|inventory)\.img$/;
/** How long making an image whole may take: a copy of the parent's pages, 1-5 s a GiB here. */
const FLATTEN_DEADLINE_MS = 10 * 60_000;
/** Where the parent's links go, inside the new image's own directory. */
const PARENT_LINKS = '.parent';

interface Tree {
  pid: number;
  startTime: string;
}

/** What one dump is given: where the holder listens, and the parent image if there is one. */
export interface TrackedDump {
  holder: string;
  parent: string | undefined;
  /** After the thaw, with the image persisted at `images`: made whole, then the parent of the
   * next dump of this tree. Throws if the image cannot be made whole. */
  persisted(images: string): Promise<{ fromParentPages: number }>;
  /** The dump failed, or its image did not reach the disk: the next one copies everything. */
  failed(): void;
}

export class MemoryTracking {
  private available = false;
  private readonly holders = new Map<string, Tree & { exited: boolean; kill(): void }>();
  /** The last whole image of each tracked tree, by instance, and the bytes of pages its dump
   * wrote itself (before it was made whole). */
  private readonly lastImage = new Map<string, Tree & { images: string; ownBytes: number; incremental: boolean }>();
  private incremental = 0;

  constructor(private readonly opts: { agentPath: string; spawner: Spawner; runDir: (id: string) => string; log: Logger }) {}

  /** Asks the kernel whether write-protection tracks writes here (`fp-agent wp-hold --probe`). */
  async init(): Promise<void> {
    this.available = (await run(this.opts.agentPath, ['wp-hold', '--probe'])).code === 0;
    if (!this.available) this.opts.log.info('this kernel cannot track writes by userfaultfd write-protection (Linux 6.7+): every memory checkpoint copies all of the memory');
  }

  /** Whether this kernel tracks writes by write-protection (asked at `init`). */
  get kernelTracks(): boolean {
    return this.available;
  }

  /** Dumps since start that copied only what changed since their parent. */
  get incrementalCount(): number {
    return this.incremental;
  }

  /** What the next dump of `tree` is likely to write, for the choice of staging it in memory: a
   * tree whose last dump was itself incremental writes about what it wrote then (twice that,
   * and 32 MiB, to spare); any other, all of its memory. */
  expectedImageBytes(id: string, tree: Tree, memoryBytes: number): number {
    const last = this.lastImage.get(id);
    if (!this.available || !last || last.pid !== tree.pid || last.startTime !== tree.startTime || !last.incremental) return memoryBytes;
    return Math.min(memoryBytes, 2 * last.ownBytes + 32 * 2 ** 20);
  }

  /** What a dump of the tree `tree` of instance `id` into `images` needs, or undefined: no
   * tracking here (the kernel), or not asked for (`track`: the dumper's CRIU has `wp-track` and
   * the sandbox is worth it). A dump without it leaves no parent for the next. */
  async prepare(id: string, tree: Tree, images: string, track: boolean): Promise<TrackedDump | undefined> {
    const holder = join(this.opts.runDir(id), SOCKET);
    if (!this.available || !track || Buffer.byteLength(holder) > MAX_SOCKET_PATH) {
      this.lastImage.delete(id);
      return undefined;
    }
    await this.ensureHolder(id, tree, holder);
    const last = this.lastImage.get(id);
    let parent: string | undefined;
    if (last && last.pid === tree.pid && last.startTime === tree.startTime) {
      parent = join(images, PARENT_LINKS);
      try {
        linkParent(last.images, parent);
      } catch (err) {
        this.opts.log.warn({ err, instance: id }, 'could not link the parent memory image: this checkpoint copies all of the memory');
        rmSync(parent, { recursive: true, force: true });
        parent = undefined;
      }
    }
    this.lastImage.delete(id);
    const done = () => {
      if (parent) rmSync(parent, { recursive: true, force: true });
    };
    return {
      holder,
      parent,
      failed: done,
      persisted: async (at) => {
        try {
          let fromParentPages = 0;
          const ownBytes = pagesBytes(at);
          if (parent) {
            // Past the deadline the checkpoint fails; the copy, working in that image's own
            // directory (which goes with the failed checkpoint), is left to end by itself.
            const r = await untilDeadline(run(this.opts.agentPath, ['pages-flatten', at, parent]), FLATTEN_DEADLINE_MS, () => {
              throw new EngineError('TIMEOUT', `the memory image was not made whole within ${FLATTEN_DEADLINE_MS / 60_000} min`);
            });
            if (r.code !== 0) throw new EngineError('DUMP_FAILED', `the memory image could not be made whole: ${r.stderr.trim()}`);
            fromParentPages = Number(/flattened \d+ (\d+)/.exec(r.stderr)?.[1] ?? 0);
            this.incremental++;
          }
          this.lastImage.set(id, { ...tree, images: at, ownBytes, incremental: parent !== undefined });
          return { fromParentPages };
        } finally {
          done();
        }
      },
    };
  }

  /** The instance's tree is gone or replaced: its holder goes (it would by itself, once the
   * tree's PID 1 is gone), and so does what the next dump would have used as its parent. */
  forget(id: string): void {
    this.lastImage.delete(id);
    this.holders.get(id)?.kill();
    this.holders.delete(id);
  }

  private async ensureHolder(id: string, tree: Tree, socket: string): Promise<void> {
    const h = this.holders.get(id);
    if (h && !h.exited && h.pid === tree.pid && h.startTime === tree.startTime) return;
    h?.kill();
    // A holder a killed server left for this tree is told to go by the new one, through the
    // socket: the new one is listening once the socket is another file.
    const which = () => {
      const st = statSync(socket, { throwIfNoEntry: false, bigint: true });
      return st ? `${st.ino}:${st.ctimeNs}` : undefined;
    };
    const before = which();
    const d = daemonUnderShim({ agentPath: this.opts.agentPath, command: [this.opts.agentPath, 'wp-hold', socket, String(tree.pid)], logFile: join(this.opts.runDir(id), 'wp-hold.log'), cgroupProcs: [], spawner: this.opts.spawner });
    const entry = { ...tree, exited: false, kill: d.kill };
    void d.exit.then(() => (entry.exited = true));
    this.holders.set(id, entry);
    const deadline = performance.now() + LISTEN_DEADLINE_MS;
    // CRIU connects as the dump ends; a holder not listening by then costs only the arming.
    const listening = () => {
      const now = which();
      return now !== undefined && now !== before;
    };
    while (!listening() && !entry.exited && performance.now() < deadline) await new Promise((r) => setTimeout(r, 1));
  }
}

/** Hard links to the parent image's files that a dump reads, in `dir` (made here). */
function linkParent(from: string, dir: string): void {
  mkdirSync(dir, { mode: 0o700 });
  for (const name of readdirSync(from)) {
    if (PARENT_FILES.test(name)) linkSync(join(from, name), join(dir, name));
  }
}
