import { api, type Execution } from './api.js';
import { fill, h, statusBadge, when } from './dom.js';

/** How often the list is read again while something in it runs. */
const POLL_MS = 5000;

/** A command as one line: `sh -c SCRIPT` as its script, as it was given. */
const commandLine = (argv: string[]) => (argv.length === 3 && argv[0] === '/bin/sh' && argv[1] === '-c' ? argv[2]! : argv.join(' '));

/**
 * An instance's commands that run on (background processes, streamed commands, terminals): start
 * one in the background, see whether each runs and how it ended, read what it printed (the last
 * 256 KiB a stream the sandbox keeps), stop it.
 */
export function processPanel(instanceId: string, report: (err: unknown, info?: string) => void, signal: AbortSignal): { element: HTMLElement; refresh(): Promise<void> } {
  const body = h('tbody', { 'data-testid': 'processes' });
  const output = h('pre', { class: 'mono output', 'data-testid': 'process-output', hidden: true });
  const command = h('input', { placeholder: 'a command to run in the background', 'aria-label': 'background command', maxlength: 4096, 'data-testid': 'process-command' });
  const start = h('button', { class: 'small primary', 'data-testid': 'process-start' }, 'Start');
  let shown: string | undefined;

  start.addEventListener('click', () => void (async () => {
    const text = command.value.trim();
    if (!text) return;
    start.disabled = true;
    try {
      const p = await api.startProcess(instanceId, text);
      command.value = '';
      report(undefined, `started ${p.exec_id}`);
    } catch (err) {
      report(err);
    } finally {
      start.disabled = false;
      await refresh();
    }
  })());

  async function show(execId: string): Promise<void> {
    try {
      const e = await api.execution(instanceId, execId);
      shown = execId;
      output.hidden = false;
      output.dataset.exec = execId;
      output.textContent = `${e.stdout}${e.stderr ? `\n[stderr]\n${e.stderr}` : ''}${e.truncated ? '\n[only the last 256 KiB a stream]' : ''}`;
    } catch (err) {
      report(err);
    }
  }

  function row(e: Execution): HTMLTableRowElement {
    const running = e.status === 'running';
    const stop = h('button', { class: 'small danger', disabled: !running, 'data-stop': e.id }, 'Stop');
    stop.addEventListener('click', () => void api.killExecution(instanceId, e.id, 15).then(() => new Promise((r) => setTimeout(r, 200))).then(refresh, report));
    const out = h('button', { class: 'small', 'data-output': e.id }, 'Output');
    out.addEventListener('click', () => void show(e.id));
    return h('tr', { 'data-exec': e.id, 'data-status': e.status },
      h('td', { class: 'wrap mono' }, commandLine(e.command), h('div', { class: 'mono muted small' }, e.id)),
      h('td', { class: 'muted' }, e.kind),
      h('td', {}, statusBadge(e.status)),
      h('td', { class: 'muted' }, e.exit_code === null ? '' : String(e.exit_code)),
      h('td', { class: 'muted', title: e.started_at }, when(e.started_at)),
      h('td', {}, out, ' ', stop));
  }

  // A background process's end comes with no event (nobody follows it): while one runs, the list
  // is read again now and then.
  let poll: ReturnType<typeof setTimeout> | undefined;
  signal.addEventListener('abort', () => clearTimeout(poll));

  async function refresh(): Promise<void> {
    clearTimeout(poll);
    try {
      const page = await api.executions(instanceId);
      if (!signal.aborted && page.items.some((e) => e.status === 'running')) poll = setTimeout(() => void refresh(), POLL_MS);
      fill(body, ...page.items.map(row));
      if (page.items.length === 0) fill(body, h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'Nothing runs in the background.')));
      if (shown) await show(shown);
    } catch (err) {
      fill(body, h('tr', {}, h('td', { colspan: 6, class: 'muted' }, err instanceof Error ? err.message : String(err))));
    }
  }

  const element = h(
    'section',
    { class: 'panel' },
    h('div', { class: 'row' }, h('h2', {}, 'Processes'), h('span', { class: 'spacer' }), command, start, h('button', { class: 'small', 'data-testid': 'processes-refresh', onclick: () => void refresh() }, 'Refresh')),
    h('div', { class: 'table-wrap' }, h('table', {}, h('thead', {}, h('tr', {}, ...['Command', 'Kind', 'Status', 'Exit', 'Started', ''].map((t) => h('th', {}, t)))), body)),
    output,
  );
  return { element, refresh };
}
