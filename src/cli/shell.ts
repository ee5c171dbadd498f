import { WebSocket } from 'ws';
import { Api, CliError, resolveTarget } from './api.js';
import type { Common } from './client.js';

export interface ShellOptions extends Common {
  attach?: string;
  user?: string;
  command?: string;
}

/** Ctrl-]: leaves the terminal running and lets go of it (as telnet's escape). */
const DETACH = 0x1d;

const size = () => ({ rows: process.stdout.rows || 24, cols: process.stdout.columns || 80 });

/**
 * An interactive terminal in an instance over its PTY WebSocket: the local terminal in raw mode,
 * keystrokes in, output out, its size followed (SIGWINCH). The shell's exit ends it with the
 * shell's status; Ctrl-] detaches (the terminal runs on: `--attach` takes it up again).
 */
export async function shell(id: string, o: ShellOptions): Promise<void> {
  const a = new Api(resolveTarget(o));
  const inst = encodeURIComponent(id);
  const ptyId =
    o.attach ??
    (await a.call<{ id: string }>('POST', `/instances/${inst}/pty`, { ...size(), user: o.user, ...(o.command ? { command: o.command } : {}) })).id;
  const url = `${a.target.url.replace(/^http/, 'ws')}/instances/${inst}/pty/${encodeURIComponent(ptyId)}`;
  // A server that takes the connection and never answers the upgrade is given up on.
  const ws = new WebSocket(url, { headers: a.headers(), handshakeTimeout: 15_000 });
  const stdin = process.stdin;
  const raw = stdin.isTTY === true;
  let detached = false;

  const resize = () => void a.call('POST', `/instances/${inst}/pty/${encodeURIComponent(ptyId)}/resize`, size()).catch(() => {});
  const onKey = (data: Buffer) => {
    if (raw && data.includes(DETACH)) {
      detached = true;
      ws.close(1000, 'detached');
      return;
    }
    if (ws.readyState === WebSocket.OPEN) ws.send(data);
  };

  const closed = new Promise<{ code: number; reason: string }>((resolve, reject) => {
    ws.once('open', () => {
      if (raw) stdin.setRawMode(true);
      stdin.on('data', onKey);
      stdin.resume();
      process.on('SIGWINCH', resize);
      if (o.attach) resize(); // this terminal's size, not the last client's
    });
    ws.on('message', (d: Buffer) => process.stdout.write(d));
    ws.once('close', (code, reason) => resolve({ code, reason: reason.toString() }));
    ws.once('error', (err) => reject(new CliError(`the terminal's connection failed: ${err.message}`, 'UNREACHABLE', 3, { cause: err })));
  });
  let end: { code: number; reason: string };
  try {
    end = await closed;
  } finally {
    process.off('SIGWINCH', resize);
    stdin.off('data', onKey);
    if (raw) stdin.setRawMode(false);
    stdin.pause();
  }
  if (detached) {
    process.stderr.write(`\r\ndetached from ${ptyId}; take it up again with: forkpoint shell ${id} --attach ${ptyId}\n`);
    return;
  }
  // A normal close says `exit <code>`; 4000 + an HTTP status says why the attach ended.
  const exit = /^exit (-?\d+)$/.exec(end.reason);
  if (exit) {
    process.exitCode = Number(exit[1]);
    return;
  }
  if (end.code >= 4000) throw new CliError(end.reason || `the terminal ended (${end.code})`, `HTTP_${end.code - 4000}`);
  process.exitCode = 0;
}
