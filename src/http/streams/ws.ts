import type { FastifyBaseLogger } from 'fastify';
import type { WebSocket } from 'ws';
import { ForkpointError, httpStatusOf } from '../../core/errors.js';
import type { Forkpoint } from '../../core/forkpoint.js';

/** How an attached execution's bytes travel on a WebSocket. */
export type Framing =
  /** Raw bytes both ways (terminals): every message in is stdin; output goes out as it is. */
  | 'raw'
  /** OpenComputer's exec framing: a first byte says what follows. In: 0x00 stdin. Out: 0x01
   * stdout, 0x02 stderr, 0x03 the exit code (int32, big-endian), 0x04 end of the scrollback. */
  | 'opencomputer';

const STDIN = 0x00;
const STDOUT = 0x01;
const STDERR = 0x02;
const EXIT = 0x03;
const SCROLLBACK_END = 0x04;

/** A client this far behind is let go (it can attach again: the scrollback replays). */
const MAX_BUFFERED = 4 << 20;
/** Close codes: 4000 + the HTTP status of the error that ended the attach; 1013 too slow. */
export const closeCodeOf = (err: unknown) => (err instanceof ForkpointError ? 4000 + httpStatusOf[err.code] : 4500);
/** A close reason has at most 123 bytes. */
const reason = (text: string) => Buffer.from(text).subarray(0, 120).toString('utf8').replace(/\uFFFD+$/, '');

/**
 * Attaches a WebSocket to an execution: the scrollback, then live output, until the exit
 * (then a normal close, code 1000 with the reason `exit <code>`); what the client sends goes
 * to stdin. The socket closing detaches; the command runs on.
 */
export async function bridgeExecution(
  fp: Forkpoint,
  socket: WebSocket,
  target: { owner: string; id: string; execId: string },
  framing: Framing,
  log: FastifyBaseLogger,
): Promise<void> {
  let open = true;
  const send = (data: Buffer) => {
    if (!open) return;
    socket.send(data);
    if (socket.bufferedAmount > MAX_BUFFERED) end(1013, 'the client fell too far behind; attach again');
  };
  const end = (code: number, why: string) => {
    if (!open) return;
    open = false;
    socket.close(code, reason(why));
  };
  const framed = (tag: number, data?: Buffer) => (data ? Buffer.concat([Buffer.of(tag), data]) : Buffer.of(tag));
  // Input that comes while the attach is under way is kept and written once it is made.
  const early: Buffer[] = [];
  let write: ((b: Buffer) => void) | undefined;
  socket.on('message', (msg: Buffer | ArrayBuffer | Buffer[], isBinary: boolean) => {
    let data = Array.isArray(msg) ? Buffer.concat(msg) : Buffer.isBuffer(msg) ? msg : Buffer.from(msg);
    if (framing === 'opencomputer') {
      if (!isBinary && data[0] !== STDIN) data = Buffer.concat([Buffer.of(STDIN), data]); // a text frame: stdin as it is
      if (data[0] !== STDIN) return; // nothing else is sent to a session
      data = data.subarray(1);
    }
    if (!data.length) return;
    if (write) write(data);
    else early.push(data);
  });
  socket.on('close', () => {
    open = false;
    attachment?.detach();
  });
  socket.on('error', () => {
    open = false;
    attachment?.detach();
  });
  let attachment: Awaited<ReturnType<typeof fp.executions.attach>> | undefined;
  try {
    attachment = await fp.executions.attach(target.owner, target.id, target.execId, [0, 0], {
      output: (stream, _offset, data) => send(framing === 'raw' ? data : framed(stream === 1 ? STDOUT : STDERR, data)),
      replayed: () => framing === 'opencomputer' && send(framed(SCROLLBACK_END)),
      exit: (code) => {
        if (framing === 'opencomputer') {
          const b = Buffer.alloc(4);
          b.writeInt32BE(code, 0);
          send(framed(EXIT, b));
        }
        end(1000, `exit ${code}`);
      },
      lost: (why) => end(1011, `detached: ${why}`),
    });
  } catch (err) {
    if (!(err instanceof ForkpointError)) log.error({ err, execution: target.execId }, 'attach failed');
    end(closeCodeOf(err), (err as Error).message);
    return;
  }
  if (!open) {
    attachment.detach();
    return;
  }
  const a = attachment;
  write = (b) => a.write(b);
  for (const b of early.splice(0)) write(b);
}
