import { lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { basename, join } from 'node:path';
import { z } from 'zod';
import { EngineError } from '../seam/errors.js';
import { daemonUnderShim, isAlive, isAliveSync, processStartTime } from './launcher.js';
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
 * tree's page faults and memory-map events, which CRIU checks against the image. The daemon
 * outlives a server that dies (it has a shim of its own): the server after it finds the transfer
 * by its record (lazyTransferLeftBehind) and holds to the same two rules.
 */

/**
 * A transfer's files, in its restore's work directory (the instance's, kept across restarts):
 * - `lazy-pages.ready`: a byte once the daemon listens (its --status-fd, by criu-run). Its socket
 *   is no sign: it exists from the bind, before the listen, and a restore that connects in
 *   between is refused.
 * - `lazy-pages-<token>.exit`: the daemon's exit code, written by its shim when it ends; a name of
 *   its own for each transfer, since a daemon a rollback replaced may still end after the next
 *   transfer started.
 * - `lazy-pages.json`: the daemon's shim and, once restored, the tree it serves (TransferRecord),
 *   so that a server started after this one's death finds a transfer still under way: a dump
 *   then would miss every page not yet in (they read as absent, and come back as zeros), and a
 *   daemon that fails then takes its tree with it as it would have.
 */
export interface LazyPagesFiles {
  ready: string;
  exit: string;
  record: string;
}

/** The files of a new transfer in `workDir`, none of an earlier one left. */
export function lazyPagesFiles(workDir: string): LazyPagesFiles {
  mkdirSync(workDir, { recursive: true });
  forgetLazyTransfer(workDir);
  return { ...filesIn(workDir), exit: join(workDir, `lazy-pages-${randomBytes(6).toString('hex')}.exit`) };
}

const filesIn = (workDir: string) => ({ ready: join(workDir, 'lazy-pages.ready'), record: join(workDir, 'lazy-pages.json') });
const EXIT_FILE = /^lazy-pages-[0-9a-f]{12}\.exit$/;

const ProcessIdentity = z.object({ pid: z.number().int().positive(), startTime: z.string().regex(/^\d+$/) });
type ProcessIdentity = z.infer<typeof ProcessIdentity>;
const TransferRecord = z.object({ shim: ProcessIdentity, exit: z.string().regex(EXIT_FILE), tree: ProcessIdentity.optional() });
type TransferRecord = z.infer<typeof TransferRecord>;

function writeRecord(file: string, record: TransferRecord): void {
  writeFileSync(`${file}.tmp`, JSON.stringify(record), { mode: 0o600 });
  renameSync(`${file}.tmp`, file);
}

function readRecord(file: string): TransferRecord | undefined {
  try {
    return TransferRecord.parse(JSON.parse(readFileSync(file, 'utf8')));
  } catch {
    return undefined;
  }
}

/** The tree the transfer of `workDir` serves, once restored. */
export function recordLazyTree(workDir: string, tree: ProcessIdentity): void {
  const { record } = filesIn(workDir);
  const r = readRecord(record);
  if (r) writeRecord(record, { ...r, tree });
}

/** A transfer done with success leaves nothing to find: the one whose exit file is `exitFile`
 * (only its own file, if the record is a later transfer's by now: a rollback's, say), or
 * whatever is there (before a new transfer). */
export function forgetLazyTransfer(workDir: string, exitFile?: string): void {
  const files = filesIn(workDir);
  if (exitFile !== undefined) {
    rmSync(exitFile, { force: true });
    if (readRecord(files.record)?.exit !== basename(exitFile)) return;
  }
  for (const f of Object.values(files)) rmSync(f, { force: true });
  let names: string[] = [];
  try {
    names = readdirSync(workDir);
  } catch {
    return; // no work directory: nothing to forget
  }
  for (const name of names) if (EXIT_FILE.test(name)) rmSync(join(workDir, name), { force: true });
}

/** What a server that adopts `tree` finds of a transfer into it that a server before it started:
 * none (or one of an earlier tree), one still under way (its shim alive), or one that ended, with
 * success or not (a daemon killed with its shim wrote no exit code: not). */
export type LeftTransfer = { state: 'none' } | { state: 'running'; follow: () => FollowedTransfer } | { state: 'ended'; ok: boolean; exitFile: string };

/** A transfer as its follower sees it: its end, a way to end it, and its exit file. */
export type FollowedTransfer = Pick<LazyPages, 'done' | 'kill' | 'exitFile'>;

export async function lazyTransferLeftBehind(workDir: string, tree: ProcessIdentity): Promise<LeftTransfer> {
  const files = filesIn(workDir);
  const r = readRecord(files.record);
  // A record without its tree: the server died between the restore's answer and the record's
  // update; the transfer can only be this tree's (the last launch's).
  if (!r || (r.tree && (r.tree.pid !== tree.pid || r.tree.startTime !== tree.startTime))) return { state: 'none' };
  // Alive first: a shim writes the exit code before it exits.
  const exitFile = join(workDir, r.exit);
  if (await isAlive(r.shim.pid, r.shim.startTime)) return { state: 'running', follow: () => followShim(r.shim, exitFile) };
  return { state: 'ended', ok: exitCode(exitFile) === 0, exitFile };
}

/** The code a shim wrote (none if it wrote none: killed with it, say). */
function exitCode(file: string): number | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8').trim();
  } catch {
    return undefined;
  }
  return /^\d{1,3}$/.test(text) ? Number(text) : undefined;
}

/** How often a transfer left behind is looked at: its end matters to a dump waiting for it. */
const FOLLOW_POLL_MS = 20;

/** A transfer left behind, followed by its shim (not the server's child): its exit code once the
 * shim is gone (-1 if it left none). */
function followShim(shim: ProcessIdentity, exitFile: string): FollowedTransfer {
  const done = (async () => {
    // Unref'd: a server shutting down does not wait for a transfer it only follows.
    while (await isAlive(shim.pid, shim.startTime)) await new Promise((r) => setTimeout(r, FOLLOW_POLL_MS).unref());
    return exitCode(exitFile) ?? -1;
  })();
  const kill = () => {
    if (!isAliveSync(shim.pid, shim.startTime)) return;
    try {
      process.kill(-shim.pid, 'SIGKILL');
    } catch {
      // gone meanwhile
    }
  };
  return { done, kill, exitFile };
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
  /** Where its shim writes that code. */
  exitFile: string;
  kill(): void;
}

/** Starts `command` (`fp-agent criu-run --ready-file files.ready ... criu lazy-pages ...`) under a
 * shim that writes its exit code to `files.exit`, and records the shim (`files.record`) before
 * anything can connect to the daemon. */
export function startLazyPages(opts: { agentPath: string; command: string[]; files: LazyPagesFiles; logFile: string; spawner: Spawner | undefined }): LazyPages {
  const { files } = opts;
  const d = daemonUnderShim({ agentPath: opts.agentPath, command: opts.command, exitFile: files.exit, logFile: opts.logFile, cgroupProcs: [], spawner: opts.spawner });
  let ended = false;
  void d.exit.then(() => (ended = true));
  const recorded = d.pid.then(async (pid) => {
    const startTime = pid > 0 ? await processStartTime(pid).catch(() => undefined) : undefined;
    if (startTime === undefined) throw new EngineError('RESTORE_FAILED', `the lazy-pages daemon did not start (its log: ${opts.logFile})`);
    writeRecord(files.record, { shim: { pid, startTime }, exit: basename(files.exit) });
  });
  const listening = (async () => {
    const deadline = performance.now() + LISTEN_DEADLINE_MS;
    await recorded;
    // The restore must not connect before the daemon listens.
    while ((lstatSync(files.ready, { throwIfNoEntry: false })?.size ?? 0) < 1) {
      if (ended) throw new EngineError('RESTORE_FAILED', `the lazy-pages daemon ended before it listened (its log: ${opts.logFile})`);
      if (performance.now() > deadline) throw new EngineError('TIMEOUT', `the lazy-pages daemon did not listen within ${LISTEN_DEADLINE_MS} ms`);
      await new Promise((r) => setTimeout(r, 1));
    }
  })();
  listening.catch(() => {});
  return { listening, done: d.exit, kill: d.kill, exitFile: files.exit };
}
