import { FitAddon } from '@xterm/addon-fit';
import { Terminal } from '@xterm/xterm';
import '@xterm/xterm/css/xterm.css';
import { api, enc, session } from './api.js';

export interface TerminalView {
  /** Closes the socket and the terminal's shell in the sandbox. */
  dispose(): void;
}

/**
 * A shell in the sandbox on a PTY, drawn by xterm.js into `box` (which must be in the page: xterm
 * measures it): keys go to the PTY over the attach WebSocket, its output comes back as bytes; the
 * PTY follows the box's size.
 */
export async function openTerminal(box: HTMLElement, instanceId: string, onClosed: (why: string) => void): Promise<TerminalView> {
  const term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000, fontFamily: 'ui-monospace, "Liberation Mono", monospace' });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  let disposed = false;
  let socket: WebSocket | undefined;
  let resizeTimer: number | undefined;
  const observer = new ResizeObserver(() => {
    if (box.isConnected) fit.fit();
  });
  observer.observe(box);

  const pty = await api.pty(instanceId, term.rows, term.cols).catch((err: unknown) => {
    observer.disconnect();
    term.dispose();
    throw err;
  });
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  // Browsers cannot set headers on a WebSocket: the token goes in the query (the server keeps it
  // out of its logs).
  socket = new WebSocket(`${proto}//${location.host}/instances/${enc(instanceId)}/pty/${enc(pty.id)}?token=${enc(session.token ?? '')}`);
  socket.binaryType = 'arraybuffer';
  socket.onmessage = (m) => term.write(typeof m.data === 'string' ? m.data : new Uint8Array(m.data as ArrayBuffer));
  socket.onclose = (e) => {
    if (disposed) return;
    term.write('\r\n\x1b[2m[terminal closed]\x1b[0m\r\n');
    onClosed(e.reason || `closed (${e.code})`);
  };
  term.onData((d) => {
    if (socket?.readyState === WebSocket.OPEN) socket.send(d);
  });
  term.onResize(({ rows, cols }) => {
    // A drag of the window resizes many times a second: the PTY follows the last.
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(() => {
      api.resizePty(instanceId, pty.id, rows, cols).catch(() => {});
    }, 100);
  });
  term.focus();

  return {
    dispose() {
      disposed = true;
      observer.disconnect();
      window.clearTimeout(resizeTimer);
      socket?.close();
      api.closePty(instanceId, pty.id).catch(() => {});
      term.dispose();
    },
  };
}
