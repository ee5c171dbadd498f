import { untilDeadline } from '../lib/deadline.js';
import type { Readable, Writable } from 'node:stream';
import protobuf from 'protobufjs';
import { EngineError } from '../seam/errors.js';

/** The part of CRIU's RPC messages (images/rpc.proto, proto2) forkpoint sends and reads;
 * the field numbers are CRIU's. */
const root = protobuf.parse(`
  syntax = "proto2";
  message criu_opts {
    required int32 images_dir_fd = 1;
    optional int32 pid = 2;
    optional bool leave_running = 3;
    optional bool tcp_established = 5;
    optional int32 log_level = 9;
    optional bool notify_scripts = 12;
    optional string log_file = 10;
    optional string root = 13;
    optional string parent_img = 14;
    optional bool track_mem = 15;
    optional int32 work_dir_fd = 17;
    optional int32 manage_cgroups_mode = 34;
    repeated string irmap_scan_paths = 36;
    optional uint32 empty_ns = 38;
    repeated string external = 37;
    optional bool lazy_pages = 48;
    optional bool tcp_close = 52;
    optional string freeze_cgroup = 44;
    optional int32 network_lock = 64;
    optional uint32 userns_base = 1000;
    optional uint32 userns_size = 1001;
    optional string wp_holder = 1002;
  }
  message criu_req {
    required int32 type = 1;
    optional criu_opts opts = 2;
    optional bool keep_open = 4;
  }
  message criu_restore_resp { required int32 pid = 1; }
  message criu_version { repeated string forkpoint_features = 1000; }
  message criu_resp {
    required int32 type = 1;
    required bool success = 2;
    optional criu_restore_resp restore = 4;
    optional int32 cr_errno = 7;
    optional string cr_errmsg = 9;
    optional criu_version version = 10;
  }
`, { keepCase: true }).root;
const Req = root.lookupType('criu_req');
const Resp = root.lookupType('criu_resp');

export const REQ = { DUMP: 1, RESTORE: 2, VERSION: 10 } as const;
const CG_IGNORE = 0;
const CLONE_NEWNET = 0x40000000;
/** CRIU's criu_network_lock_method: the sandbox's netns is CRIU's own during a dump, and
 * nothing but the sandbox's own sockets live in it. */
const NETWORK_LOCK = { NFTABLES: 2, SKIP: 3 } as const;

import type { Connections } from '../seam/runtime.js';

export type { Connections } from '../seam/runtime.js';

/** Deadlines: a relay's own requests are a few syscalls; CRIU starting up may wait for a busy
 * machine; a dump or restore grows with the sandbox's memory (~2 ms per MiB here). */
export const CRIU_DEADLINES = { control: 10_000, startUp: 30_000, dumpOrRestore: 10 * 60_000 };

export interface CriuResponse {
  type: number;
  success: boolean;
  restore?: { pid: number };
  cr_errno?: number;
  cr_errmsg?: string;
  version?: { forkpoint_features?: string[] };
}

interface Frame {
  kind: string;
  data: Buffer;
}

/**
 * One `criu swrk` behind `fp-agent criu-run --swrk`: started ahead of the work, so CRIU's
 * start-up is paid before a pause, then driven by request frames (see native/criu_run.c).
 * A worker serves one dump or one restore; `end()` lets it go.
 */
export class CriuWorker {
  private pending = Buffer.alloc(0);
  private readonly waiting: { resolve: (f: Frame) => void; reject: (e: Error) => void }[] = [];
  private gone: Error | undefined;
  private features: ReadonlySet<string> = new Set();

  /** `kill` ends the worker by force (CRIU included), for a request past its deadline. */
  constructor(
    private readonly input: Writable,
    output: Readable,
    exited: Promise<unknown>,
    private readonly kill: () => void,
  ) {
    input.on('error', () => {});
    output.on('data', (chunk: Buffer) => this.receive(chunk));
    void exited.then(() => this.fail(new EngineError('CRIU_FAILED', 'the CRIU worker exited')));
  }

  private receive(chunk: Buffer): void {
    this.pending = Buffer.concat([this.pending, chunk]);
    while (this.pending.length >= 5) {
      const n = this.pending.readUInt32LE(0);
      if (this.pending.length < 4 + n) break;
      const frame = { kind: String.fromCharCode(this.pending[4]!), data: this.pending.subarray(5, 4 + n) };
      this.pending = this.pending.subarray(4 + n);
      this.waiting.shift()?.resolve(frame);
    }
  }

  private fail(err: Error): void {
    this.gone ??= err;
    for (const w of this.waiting.splice(0)) w.reject(err);
  }

  /** Requests are answered in order, so several can be in flight at once. One that is not
   * answered by its deadline ends the worker: a CRIU that hangs must not hold an instance. */
  private async request(kind: string, data: Buffer | string, timeoutMs = CRIU_DEADLINES.control): Promise<Buffer> {
    if (this.gone) throw this.gone;
    const body = typeof data === 'string' ? Buffer.from(data) : data;
    const head = Buffer.alloc(5);
    head.writeUInt32LE(body.length + 1, 0);
    head[4] = kind.charCodeAt(0);
    const frame = new Promise<Frame>((resolve, reject) => this.waiting.push({ resolve, reject }));
    this.input.write(Buffer.concat([head, body]));
    const answer = await untilDeadline(frame, timeoutMs, () => {
      const err = new EngineError('TIMEOUT', `CRIU worker request '${kind}' did not finish within ${Math.round(timeoutMs / 1000)} s`);
      this.fail(err);
      this.kill();
      throw err;
    });
    if (answer.kind === 'E') throw new EngineError('CRIU_FAILED', answer.data.toString('utf8'));
    return answer.data;
  }

  /** Opens a directory in the relay, for CRIU to reach as /proc/<relay>/fd/<n>. */
  async openDir(path: string): Promise<number> {
    return Number((await this.request('O', path)).toString('utf8'));
  }

  /** Mounts an overlay in place of what is mounted on `target` (criu-run --overlay), its
   * layers idmapped to the uid range at `uidBase` if there is one. */
  async mountOverlay(dir: string, target: string, options: string, uidBase: number | null): Promise<void> {
    await this.request('M', `${dir}\0${target}\0${options}${uidBase === null ? '' : `\0${uidBase}`}`);
  }

  /** Where the relay writes the restored root's pid the moment CRIU reports it. */
  async setPidfile(path: string): Promise<void> {
    await this.request('P', path);
  }

  /** Moves CRIU into the sandbox's cgroups: what it restores is born inside them. */
  async joinCgroups(procsFiles: string[]): Promise<void> {
    if (procsFiles.length) await this.request('C', procsFiles.join('\0'));
  }

  /** The sandbox's network link, made in the netns CRIU restores into (native/netlink.c): the
   * worker's own, or (`inTreeNetns`) the one CRIU makes for a tree in a user namespace, once
   * CRIU says it exists. */
  /** `routeHeld`: the host's route to the address stays where it is until `moveRoute` (a
   * rollback's standby, restored beside the sandbox whose address it has). */
  async setUpNetwork(link: { hostIf: string; address: string; gateway: string; mac: string }, inTreeNetns: boolean, routeHeld = false): Promise<void> {
    const flags = `${inTreeNetns ? '1' : ''}${routeHeld ? 'h' : ''}`;
    await this.request('N', `${link.hostIf}\0${link.address}\0${link.gateway}\0${link.mac}${flags ? `\0${flags}` : ''}`);
  }

  /** The host's route to the link's address goes through it from now on. */
  async moveRoute(link: { hostIf: string; address: string; gateway: string }): Promise<void> {
    await this.request('T', `${link.hostIf}\0${link.address}\0${link.gateway}`);
  }

  /** Mounts a volume's directory on `target` in the worker's mount namespace, as a sandbox of
   * the range at `uidBase` sees it (criu_run.c 'V'): what CRIU binds an external mount from. */
  async mountVolume(dir: string, target: string, uidBase: number | null, readOnly: boolean): Promise<void> {
    await this.request('V', `${dir}\0${target}\0${uidBase ?? ''}\0${readOnly ? '1' : '0'}`);
  }

  async setHostname(pid: number, hostname: string): Promise<void> {
    await this.request('H', `${pid}\0${hostname}`);
  }

  private async rpc(req: Record<string, unknown>, timeoutMs: number): Promise<CriuResponse> {
    const bytes = Req.encode(Req.fromObject(req)).finish();
    const answer = await this.request('R', Buffer.from(bytes), timeoutMs);
    return Resp.toObject(Resp.decode(answer)) as CriuResponse;
  }

  /** Resolves once CRIU itself is up and answering, its start-up done; what forkpoint's
   * patches it carries is known from then on. */
  async ready(): Promise<void> {
    const r = await this.rpc({ type: REQ.VERSION, keep_open: true }, CRIU_DEADLINES.startUp);
    if (!r.success) throw new EngineError('CRIU_FAILED', 'CRIU did not answer its version');
    this.features = new Set(r.version?.forkpoint_features ?? []);
  }

  /** Whether this CRIU restores a tree's user namespace into any range asked (`usernsRange` of
   * `restore`, deploy/criu/0007-*); an unpatched one ignores the option and maps the image's. */
  get rebasesUserns(): boolean {
    return this.features.has('userns-base');
  }

  /** Whether this CRIU restores a tree in a user namespace lazily (deploy/criu/0008-*): an
   * unpatched one cannot make the tree's userfaultfd there, and the restore fails. */
  get lazyIntoUserns(): boolean {
    return this.features.has('lazy-userns');
  }

  /** Whether this CRIU tracks what a tree writes between dumps by userfaultfd write-protection
   * (deploy/criu/0009-*): an unpatched one has no such option, and `track_mem` fails on a kernel
   * without soft-dirty bits. */
  get tracksWrites(): boolean {
    return this.features.has('wp-track');
  }

  /** `imagesFd`: from `openDir`, which can be done ahead of the pause. `frozenIn`: the freezer
   * group the engine stopped the tree in; CRIU seizes it there, dumps it, leaves it running and
   * frozen. `ownNetns`: the tree
   * has a network namespace of its own, outside the worker's (a tree in a user namespace),
   * dumped empty (its sockets only): the restore makes it afresh, owned by the tree. */
  /** `tracking`: the write-protection holder (memory-tracking.ts), and the image whose pages
   * this dump leaves out where nothing wrote them since. */
  async dump(opts: { pid: number; imagesFd: number; frozenIn?: string; ownNetns?: boolean; watchedPaths?: string[]; externalMounts?: string[]; tracking?: { holder: string; parent: string | undefined } | undefined }): Promise<CriuResponse> {
    return this.rpc({
      type: REQ.DUMP,
      opts: {
        images_dir_fd: opts.imagesFd,
        pid: opts.pid,
        ...(opts.frozenIn ? { freeze_cgroup: opts.frozenIn, leave_running: true } : {}),
        // Established connections are dumped (in repair mode), never a reason to fail.
        tcp_established: true,
        // A tree left running keeps its own connections; its image is only ever restored as a
        // rollback or a fork, which close them, so what reaches a socket during the dump need
        // not be held back. Locking and unlocking cost 15-20 ms of the pause (RCU grace periods).
        // A tree that is restored from its dump (a checkpoint by rename, a hibernation) resumes
        // its connections: those are locked.
        network_lock: opts.frozenIn ? NETWORK_LOCK.SKIP : NETWORK_LOCK.NFTABLES,
        log_level: 2,
        log_file: 'dump.log',
        manage_cgroups_mode: CG_IGNORE,
        ...(opts.ownNetns ? { empty_ns: CLONE_NEWNET } : {}),
        // Where the tree's inotify watches are (watch-paths.ts): CRIU looks there first.
        ...(opts.watchedPaths?.length ? { irmap_scan_paths: opts.watchedPaths } : {}),
        // Volumes are the host's, not the image's: recorded by where they are mounted, and
        // restored from whatever the restore names for that place (as runc does).
        // (volume paths hold no ']', ':' or ',': lib/volume-path.ts)
        ...(opts.externalMounts?.length ? { external: opts.externalMounts.map((path) => `mnt[${path}]:${path}`) } : {}),
        ...(opts.tracking ? { track_mem: true, wp_holder: opts.tracking.holder, ...(opts.tracking.parent ? { parent_img: opts.tracking.parent } : {}) } : {}),
      },
    }, CRIU_DEADLINES.dumpOrRestore);
  }

  /** CRIU, the relay and every thread in the cgroup directory `group` get the kernel's shortest
   * scheduler slice until the next dump or restore is answered, the group's threads then their
   * own back (criu_run.c 'S', sched_slice.c): for a pause on busy CPUs. */
  async shortenSlices(group: string): Promise<void> {
    await this.request('S', group);
  }

  /** `ownNetns`: as for `dump`; the worker then answers CRIU's notifications: when CRIU has made
   * the tree's namespaces, it bounds the user namespace's per-user counters and sets up the
   * network namespace (criu_run.c, 'N' with LATER), before any task of the tree runs. */
  /** `lazy`: the tree's memory is left to the `criu lazy-pages` daemon listening in the work
   * directory (lazy-pages.ts), which fills it on demand and in the background. */
  async restore(opts: { imagesFd: number; workFd: number; root: string; connections: Connections; ownNetns?: boolean; usernsRange?: { base: number; size: number } | undefined; externalMounts?: { key: string; val: string }[]; lazy?: boolean }): Promise<CriuResponse> {
    return this.rpc({
      type: REQ.RESTORE,
      opts: {
        images_dir_fd: opts.imagesFd,
        work_dir_fd: opts.workFd,
        root: opts.root,
        ...(opts.lazy ? { lazy_pages: true } : {}),
        ...(opts.connections === 'restore' ? { tcp_established: true } : { tcp_close: true }),
        // No lock: the restored tree is unreachable until CRIU answers (the relay moves the
        // host's route to its link only then), and the dump's lock was in the dumped namespace.
        // Locking and unlocking here cost an RCU grace period (7-10 ms) in the pause; forkpoint's
        // CRIU honours this (deploy/criu/0002-*), an unpatched one takes the dump's method.
        network_lock: NETWORK_LOCK.SKIP,
        log_level: 2,
        log_file: 'restore.log',
        manage_cgroups_mode: CG_IGNORE,
        ...(opts.ownNetns ? { empty_ns: CLONE_NEWNET, notify_scripts: true } : {}),
        ...(opts.usernsRange ? { userns_base: opts.usernsRange.base, userns_size: opts.usernsRange.size } : {}),
        ...(opts.externalMounts?.length ? { external: opts.externalMounts.map((m) => `mnt[${m.key}]:${m.val}`) } : {}),
      },
    }, CRIU_DEADLINES.dumpOrRestore);
  }

  /** Lets the worker go: CRIU exits, and a restored tree passes to the shim above it. */
  end(): void {
    this.fail(new EngineError('CRIU_FAILED', 'the CRIU worker was ended'));
    this.input.end();
  }
}
