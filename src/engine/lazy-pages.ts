import { lstatSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { EngineError } from '../seam/errors.js';
import { daemonUnderShim } from './launcher.js';
import type { Spawner } from './spawner.js';

/**
 * Lazy restores. A fork, rollback or wake of a large memory image (and the restore inside a
 * checkpoint's pause when the upper is frozen by rename) is restored without copying its
 * pages: `criu lazy-pages`, started beside the restore and listening in the restore's work
 * directory, is handed the restored tree's userfaultfds, fills each page the tree touches first,
 * then all the others in the background, and exits 0 once every page is in (a few hundred
 * milliseconds for 256 MiB here). The tree runs meanwhile: a fork of a large sandbox answers
 * before its memory is all in.
 *
 * What it costs: a page the daemon never delivers would read as zeros once the daemon is gone, so
 * a daemon that ends with anything but success takes its sandbox with it (the engine kills the
 * tree), and a dump of the sandbox waits until its memory is all in (a fault the daemon serves
 * while the tree is frozen for CRIU would hold the dump). The daemon is CRIU as the host's root
 * reading the checkpoint's images, as the restore is; what reaches it from the sandbox is the
 * tree's page faults and memory-map events, which CRIU checks against the image.
 */

/** Where `criu lazy-pages` writes a byte once it listens (its --status-fd, by criu-run), in its
 * work directory. Its socket is no sign: it exists from the bind, before the listen, and a
 * restore that connects in between is refused. */
const READY_FILE = 'lazy-pages.ready';

/** The file `criu lazy-pages` in `workDir` writes a byte to once it listens (none there yet). */
export function lazyPagesReadyFile(workDir: string): string {
  const file = join(workDir, READY_FILE);
  mkdirSync(workDir, { recursive: true });
  rmSync(file, { force: true });
  return file;
}

/** How long the daemon may take to listen: its start-up is a CRIU's (~10-20 ms here). */
const LISTEN_DEADLINE_MS = 10_000;

/** Bytes of pages in a memory image: what a restore would copy (CRIU's pages-*.img). */
export function pagesBytes(imagesDir: string): number {
  let total = 0;
  for (const name of readdirSync(imagesDir)) {
    if (!/^pages-\d+\.img$/.test(name)) continue;
    const st = lstatSync(join(imagesDir, name), { throwIfNoEntry: false });
    if (st?.isFile()) total += st.size;
  }
  return total;
}

export interface LazyPages {
  /** Settles once the daemon listens; fails if it ended or did not listen in time. */
  listening: Promise<void>;
  /** The daemon's exit code: 0 once every page of the tree is in. */
  done: Promise<number>;
  kill(): void;
}

/** Starts `command` (`fp-agent criu-run --ready-file readyFile ... criu lazy-pages ...`) under a
 * shim. */
export function startLazyPages(opts: { agentPath: string; command: string[]; readyFile: string; logFile: string; spawner: Spawner | undefined }): LazyPages {
  const d = daemonUnderShim({ agentPath: opts.agentPath, command: opts.command, logFile: opts.logFile, cgroupProcs: [], spawner: opts.spawner });
  let ended = false;
  void d.exit.then(() => (ended = true));
  const listening = (async () => {
    const deadline = performance.now() + LISTEN_DEADLINE_MS;
    // The restore must not connect before the daemon listens.
    while ((lstatSync(opts.readyFile, { throwIfNoEntry: false })?.size ?? 0) < 1) {
      if (ended) throw new EngineError('RESTORE_FAILED', `the lazy-pages daemon ended before it listened (its log: ${opts.logFile})`);
      if (performance.now() > deadline) throw new EngineError('TIMEOUT', `the lazy-pages daemon did not listen within ${LISTEN_DEADLINE_MS} ms`);
      await new Promise((r) => setTimeout(r, 1));
    }
  })();
  listening.catch(() => {});
  return { listening, done: d.exit, kill: d.kill };
}
