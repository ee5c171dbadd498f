import { Code, ConnectError, type HandlerContext, type ServiceImpl } from '@connectrpc/connect';
import type { Forkpoint } from '../../core/forkpoint.js';
import { ForkpointError } from '../../core/errors.js';
import { UnknownUserError } from '../../core/users.js';
import type { ExecutionState } from '../../core/executions.js';
import { callerOf, dropConnectionKey, envdPath, envdUser, type SandboxCaller } from './caller.js';
import { Process, Signal, type ProcessEvent, type ProcessSelector } from './gen/process/process_pb.js';
import { EventQueue } from '../../lib/event-queue.js';

type Event = ProcessEvent['event'];
const MAX_QUEUED = 16 << 20;
const DEFAULT_KEEPALIVE_S = 50;

/** Core errors as Connect's codes (the SDK maps them onto its own error classes). */
export function connectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  if (err instanceof UnknownUserError) return new ConnectError(err.message, Code.Unauthenticated, undefined, undefined, err);
  if (err instanceof ForkpointError) {
    const code = { FORBIDDEN: Code.PermissionDenied, NOT_FOUND: Code.NotFound, INVALID_REQUEST: Code.InvalidArgument, CONFLICT: Code.FailedPrecondition, UNAUTHENTICATED: Code.Unauthenticated, QUOTA_EXCEEDED: Code.ResourceExhausted, INSUFFICIENT_STORAGE: Code.ResourceExhausted, UNAVAILABLE: Code.Unavailable }[err.code as string] ?? Code.Internal;
    return new ConnectError(err.message, code, undefined, undefined, err);
  }
  return new ConnectError('internal error; see the server log', Code.Internal, undefined, undefined, err);
}

const dataEvent = (stream: 1 | 2, pty: boolean, data: Buffer): Event => ({
  case: 'data',
  value: { $typeName: 'process.ProcessEvent.DataEvent', output: pty ? { case: 'pty', value: data } : stream === 1 ? { case: 'stdout', value: data } : { case: 'stderr', value: data } },
});
const endEvent = (exitCode: number, status: string, error?: string): Event => ({
  case: 'end',
  value: { $typeName: 'process.ProcessEvent.EndEvent', exitCode, exited: error === undefined, status, ...(error !== undefined ? { error } : {}) },
});
const keepAlive = (): Event => ({ case: 'keepalive', value: { $typeName: 'process.ProcessEvent.KeepAlive' } });
const sizeOf = (e: Event) => (e.case === 'data' && e.value.output.value ? e.value.output.value.length : 64);

/**
 * envd's process service over the executions of the core: a process is an execution, its pid
 * the one inside the sandbox. As envd: a client going away leaves the process running (it can
 * `Connect` again); the request's own deadline kills it.
 */
export function processService(fp: Forkpoint): ServiceImpl<typeof Process> {
  const tags = new Map<string, string>(); // `${instance}/${tag}` → execution id

  async function find(c: SandboxCaller, sel: ProcessSelector | undefined): Promise<ExecutionState> {
    if (sel?.selector.case === 'pid') return fp.executions.byPid(c.owner, c.id, sel.selector.value);
    if (sel?.selector.case === 'tag') {
      const execId = tags.get(`${c.id}/${sel.selector.value}`);
      if (execId) return fp.executions.get(c.owner, c.id, execId);
      throw new ConnectError(`no process tagged ${sel.selector.value}`, Code.NotFound);
    }
    throw new ConnectError('a process selector (pid or tag) is required', Code.InvalidArgument);
  }

  /** The process's events from `from` on, until it ends, the client goes or the deadline. */
  async function* follow(c: SandboxCaller, state: ExecutionState, from: [number, number], ctx: HandlerContext, onDeadline: () => void): AsyncGenerator<{ event: { $typeName: 'process.ProcessEvent'; event: Event } }> {
    const pty = state.record.kind === 'pty';
    const queue = new EventQueue<Event>(sizeOf, MAX_QUEUED);
    let lostWhy: string | undefined;
    const attachment = await fp.executions.attach(c.owner, c.id, state.record.id, from, {
      output: (stream, _offset, data) => queue.push(dataEvent(stream, pty, data)),
      replayed: () => {},
      exit: (code, signal) => {
        queue.push(signal ? endEvent(-1, `signal: ${signal}`) : endEvent(code, `exit status ${code}`));
        queue.end();
      },
      lost: (why) => {
        lostWhy = why;
        queue.end();
      },
    });
    const deadline = ctx.timeoutMs();
    let expired = false;
    const expire = () => {
      expired = true;
      onDeadline();
      queue.end();
    };
    const timer = deadline !== undefined ? setTimeout(expire, deadline) : undefined;
    const onAbort = () => queue.end();
    ctx.signal.addEventListener('abort', onAbort);
    const every = Number(ctx.requestHeader.get('keepalive-ping-interval')) || DEFAULT_KEEPALIVE_S;
    try {
      for await (const event of queue.withKeepAlive(every * 1000, keepAlive)) {
        if (ctx.signal.aborted || expired) break;
        yield { event: { $typeName: 'process.ProcessEvent', event } };
      }
    } finally {
      clearTimeout(timer);
      ctx.signal.removeEventListener('abort', onAbort);
      attachment.detach();
    }
    // A stream its deadline ended says so, as envd's does (E2B's Python SDK raises its timeout
    // from this code; a stream that just stopped read as a command without an end).
    const reason: unknown = ctx.signal.reason;
    if (expired || (reason instanceof ConnectError && reason.code === Code.DeadlineExceeded)) {
      if (!expired) onDeadline(); // Connect's own deadline fired first
      throw new ConnectError('the request ran past its deadline', Code.DeadlineExceeded);
    }
    if (lostWhy === undefined || ctx.signal.aborted) return;
    // The process was lost because its sandbox stopped (killed, paused, gone): envd's VM would
    // have taken the connection with it. Lost while the sandbox runs on (a rollback replaced its
    // processes), the stream ends with the process.
    if (!(await sandboxRuns(c))) {
      ctx.values.get(dropConnectionKey)();
      throw new ConnectError('terminated: the sandbox stopped', Code.Unknown);
    }
    yield { event: { $typeName: 'process.ProcessEvent', event: endEvent(-1, 'lost', lostWhy) } };
  }

  async function sandboxRuns(c: SandboxCaller): Promise<boolean> {
    if (fp.instances.isBeingDeleted(c.id)) return false;
    const r = await fp.instances.get(c.owner, c.id).catch(() => undefined);
    return r?.status === 'running';
  }

  return {
    async *start(req, ctx) {
      const c = callerOf(ctx);
      const cfg = req.process;
      if (!cfg?.cmd) throw new ConnectError('process.cmd is required', Code.InvalidArgument);
      let state: ExecutionState;
      try {
        const user = await envdUser(fp, c);
        state = await fp.executions.start(c.owner, c.id, {
          kind: req.pty ? 'pty' : 'exec',
          argv: [cfg.cmd, ...cfg.args],
          env: cfg.envs,
          user,
          cwd: cfg.cwd ? envdPath(cfg.cwd, user.home) : user.home,
          pty: req.pty?.size ? { rows: req.pty.size.rows || 24, cols: req.pty.size.cols || 80 } : undefined,
          keepStdinOpen: req.stdin ?? true,
        });
      } catch (err) {
        throw connectError(err);
      }
      if (req.tag) tags.set(`${c.id}/${req.tag}`, state.record.id);
      yield { event: { $typeName: 'process.ProcessEvent', event: { case: 'start', value: { $typeName: 'process.ProcessEvent.StartEvent', pid: state.pid ?? 0 } } } };
      const kill = () => void fp.executions.signal(c.owner, c.id, state.record.id, 9).catch(() => {});
      yield* follow(c, state, [0, 0], ctx, kill);
    },

    async *connect(req, ctx) {
      const c = callerOf(ctx);
      const state = await find(c, req.process).catch((err: unknown) => Promise.reject(connectError(err)));
      if (!state.running) throw new ConnectError(`process ${state.pid} is not running`, Code.NotFound);
      yield { event: { $typeName: 'process.ProcessEvent', event: { case: 'start', value: { $typeName: 'process.ProcessEvent.StartEvent', pid: state.pid ?? 0 } } } };
      yield* follow(c, state, [state.stdoutBytes, state.stderrBytes], ctx, () => {});
    },

    async list(_req, ctx) {
      const c = callerOf(ctx);
      const page = await fp.executions.list(c.owner, c.id, 1000).catch((err: unknown) => Promise.reject(connectError(err)));
      const tagOf = new Map([...tags].filter(([k]) => k.startsWith(`${c.id}/`)).map(([k, v]) => [v, k.slice(c.id.length + 1)]));
      return {
        processes: page.items
          .filter((s) => s.running && s.pid !== null)
          .map((s) => ({ pid: s.pid!, tag: tagOf.get(s.record.id), config: { cmd: s.record.argv[0] ?? '', args: s.record.argv.slice(1), envs: {}, cwd: s.record.cwd } })),
      };
    },

    async sendInput(req, ctx) {
      const c = callerOf(ctx);
      const state = await find(c, req.process).catch((err: unknown) => Promise.reject(connectError(err)));
      const data = req.input?.input.value;
      if (data?.length) await fp.executions.input(c.owner, c.id, state.record.id, Buffer.from(data)).catch((err: unknown) => Promise.reject(connectError(err)));
      return {};
    },

    async streamInput(reqs, ctx) {
      const c = callerOf(ctx);
      let target: ExecutionState | undefined;
      for await (const r of reqs) {
        if (r.event.case === 'start') target = await find(c, r.event.value.process).catch((err: unknown) => Promise.reject(connectError(err)));
        else if (r.event.case === 'data') {
          if (!target) throw new ConnectError('the stream starts with the process it is for', Code.InvalidArgument);
          const data = r.event.value.input?.input.value;
          if (data?.length) await fp.executions.input(c.owner, c.id, target.record.id, Buffer.from(data)).catch((err: unknown) => Promise.reject(connectError(err)));
        }
      }
      return {};
    },

    async closeStdin(req, ctx) {
      const c = callerOf(ctx);
      const state = await find(c, req.process).catch((err: unknown) => Promise.reject(connectError(err)));
      await fp.executions.closeInput(c.owner, c.id, state.record.id).catch((err: unknown) => Promise.reject(connectError(err)));
      return {};
    },

    async sendSignal(req, ctx) {
      const c = callerOf(ctx);
      const state = await find(c, req.process).catch((err: unknown) => Promise.reject(connectError(err)));
      const signo = req.signal === Signal.SIGKILL ? 9 : req.signal === Signal.SIGTERM ? 15 : 0;
      if (!signo) throw new ConnectError('signal is SIGKILL or SIGTERM', Code.InvalidArgument);
      await fp.executions.signal(c.owner, c.id, state.record.id, signo).catch((err: unknown) => Promise.reject(connectError(err)));
      return {};
    },

    async update(req, ctx) {
      const c = callerOf(ctx);
      const state = await find(c, req.process).catch((err: unknown) => Promise.reject(connectError(err)));
      const size = req.pty?.size;
      if (size) await fp.executions.resize(c.owner, c.id, state.record.id, size.rows, size.cols).catch((err: unknown) => Promise.reject(connectError(err)));
      return {};
    },
  };
}
