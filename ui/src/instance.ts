import { api, type Checkpoint, type Instance } from './api.js';
import { bytes, fill, h, statusBadge, when } from './dom.js';
import { followEvents } from './events.js';
import { fileBrowser } from './files.js';
import { processPanel } from './processes.js';
import { drawLineage } from './lineage.js';
import { openTerminal, type TerminalView } from './terminal.js';

type Report = (err: unknown, info?: string) => void;

/**
 * One instance: its state and actions, a terminal, its files, its checkpoints (roll back to one,
 * fork from one) and its family tree. Kept current by the instance's event stream.
 */
export function instancePage(root: HTMLElement, id: string, report: Report, signal: AbortSignal): void {
  const title = h('h1', {});
  const facts = h('div', { class: 'row muted' });
  const status = h('span', { 'data-testid': 'status' });
  const label = h('input', { placeholder: 'checkpoint label (optional)', 'aria-label': 'checkpoint label', maxlength: 200, 'data-testid': 'checkpoint-label' });
  const checkpointButton = h('button', { class: 'primary', 'data-testid': 'checkpoint' }, 'Checkpoint');
  const hibernateButton = h('button', { 'data-testid': 'hibernate' }, 'Hibernate');
  const wakeButton = h('button', { 'data-testid': 'wake' }, 'Wake');
  const deleteButton = h('button', { class: 'danger', 'data-testid': 'delete' }, 'Delete');
  const checkpointsBody = h('tbody', { 'data-testid': 'checkpoints' });
  const lineageBox = h('div', {});
  const eventsBox = h('div', { class: 'events mono', 'data-testid': 'events' });
  const terminalBox = h('div', { class: 'terminal-box', 'data-testid': 'terminal' });
  const terminalNote = h('span', { class: 'muted' });
  const files = fileBrowser(id, report);
  const processes = processPanel(id, report, signal);
  let terminal: TerminalView | undefined;

  /** Runs an action with its button held, then shows what it did or why it failed. */
  const act = (button: HTMLButtonElement, run: () => Promise<string | void>) => async () => {
    button.disabled = true;
    try {
      const said = await run();
      if (said) report(undefined, said);
    } catch (err) {
      report(err);
    } finally {
      button.disabled = false;
      await refresh();
    }
  };

  checkpointButton.addEventListener('click', act(checkpointButton, async () => {
    const ck = await api.checkpoint(id, label.value.trim() || undefined);
    label.value = '';
    return `checkpoint ${ck.id} is ${ck.status}`;
  }));
  hibernateButton.addEventListener('click', act(hibernateButton, async () => {
    await api.hibernate(id);
    return 'hibernated';
  }));
  wakeButton.addEventListener('click', act(wakeButton, async () => {
    await api.wake(id);
    return 'woken';
  }));
  deleteButton.addEventListener('click', async () => {
    if (!confirm(`Delete instance ${id}? Its checkpoints go with it.`)) return;
    try {
      await api.remove(id);
      location.hash = '#/';
    } catch (err) {
      report(err);
    }
  });

  const newTerminal = h('button', { class: 'small', 'data-testid': 'new-terminal' }, 'New terminal');
  const startTerminal = async () => {
    terminal?.dispose();
    terminal = undefined;
    terminalBox.replaceChildren();
    terminalNote.textContent = '';
    try {
      terminal = await openTerminal(terminalBox, id, (why) => (terminalNote.textContent = why));
    } catch (err) {
      terminalNote.textContent = err instanceof Error ? err.message : String(err);
    }
  };
  newTerminal.addEventListener('click', () => void startTerminal());
  signal.addEventListener('abort', () => terminal?.dispose());

  const checkpointRow = (c: Checkpoint, inst: Instance) => {
    const ready = c.status === 'ready';
    const rollback = h('button', { class: 'small', disabled: !ready, 'data-rollback': c.id }, 'Roll back');
    const fork = h('button', { class: 'small', disabled: !ready, 'data-fork': c.id }, 'Fork');
    rollback.addEventListener('click', act(rollback, async () => {
      await api.rollback(id, c.id);
      // The processes are the checkpoint's now: the shell of this page was not among them.
      void startTerminal();
      return `rolled back to ${c.label ?? c.id}`;
    }));
    fork.addEventListener('click', act(fork, async () => {
      const made = await api.fork(id, c.id);
      return `forked: ${made.id}`;
    }));
    return h('tr', { 'data-checkpoint': c.id, 'data-status': c.status },
      h('td', {}, c.label ?? h('span', { class: 'muted' }, 'no label'), inst.head_checkpoint_id === c.id ? h('span', { class: 'muted' }, ' (head)') : null,
        h('div', { class: 'mono muted small' }, c.id)),
      h('td', {}, statusBadge(c.status)),
      h('td', { class: 'muted', title: c.memory ? 'memory, processes and files' : 'files only' }, bytes((c.delta_bytes ?? 0) + (c.memory_bytes ?? 0)), c.memory ? '' : ' (files)'),
      h('td', { class: 'muted' }, c.pause_ms === null ? '' : `${c.pause_ms.toFixed(0)} ms`),
      h('td', { class: 'muted', title: c.created_at }, when(c.created_at)),
      h('td', {}, rollback, ' ', fork));
  };

  let refreshing: Promise<void> | undefined;
  let again = false;
  /** Reads the instance, its checkpoints and its tree again; calls that come meanwhile make one more read. */
  async function refresh(): Promise<void> {
    if (refreshing) {
      again = true;
      return refreshing;
    }
    refreshing = (async () => {
      do {
        again = false;
        try {
          const [inst, cks, tree] = await Promise.all([api.instance(id, signal), api.checkpoints(id, signal), api.lineage(id, signal)]);
          title.textContent = inst.name || inst.id;
          fill(status, statusBadge(inst.status));
          const fact = (...parts: (Node | string)[]) => h('span', {}, ...parts);
          fill(facts, fact(h('span', { class: 'mono' }, inst.id)), fact(`image ${inst.image}`), inst.node ? fact(`node ${inst.node}`) : null,
            fact(`${inst.limits.cpu_percent}% CPU, ${inst.limits.memory_mb} MiB, ${inst.limits.disk_mb === null ? 'no disk limit' : `${inst.limits.disk_mb} MiB disk`}`),
            fact(inst.user_namespace ? 'own user ids' : 'host user ids'),
            inst.source_instance_id ? fact(h('a', { href: `#/instances/${inst.source_instance_id}` }, `fork of ${inst.source_instance_id}`)) : null,
            inst.error ? h('span', { class: 'status status-error' }, inst.error) : null);
          hibernateButton.disabled = inst.status !== 'running';
          wakeButton.disabled = inst.status !== 'hibernated';
          checkpointButton.disabled = inst.status !== 'running';
          fill(checkpointsBody, ...cks.items.map((c) => checkpointRow(c, inst)));
          if (cks.items.length === 0) fill(checkpointsBody, h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'No checkpoints yet.')));
          fill(lineageBox, drawLineage(tree, id, (to) => (location.hash = `#/instances/${to}`)));
        } catch (err) {
          if (signal.aborted) return;
          report(err);
        }
      } while (again && !signal.aborted);
    })().finally(() => (refreshing = undefined));
    return refreshing;
  }

  fill(root,
    h('section', { class: 'panel' },
      h('div', { class: 'row' }, title, status, h('span', { class: 'spacer' }), label, checkpointButton, hibernateButton, wakeButton, deleteButton),
      facts),
    h('div', { class: 'grid' },
      h('div', {},
        h('section', { class: 'panel' }, h('div', { class: 'row' }, h('h2', {}, 'Terminal'), terminalNote, h('span', { class: 'spacer' }), newTerminal), terminalBox),
        files.element,
        processes.element),
      h('div', {},
        h('section', { class: 'panel' }, h('h2', {}, 'Checkpoints'),
          h('div', { class: 'table-wrap' }, h('table', {}, h('thead', {}, h('tr', {}, ...['Checkpoint', 'Status', 'Size', 'Pause', 'Taken', ''].map((t) => h('th', {}, t)))), checkpointsBody))),
        h('section', { class: 'panel' }, h('h2', {}, 'Lineage'), lineageBox),
        h('section', { class: 'panel' }, h('h2', {}, 'Events'), eventsBox))));

  void refresh().then(async () => {
    if (signal.aborted) return;
    if (status.textContent === 'running') await startTerminal();
    await files.refresh();
    await processes.refresh();
  });
  void followEvents(id, (e) => {
    eventsBox.prepend(h('div', { 'data-event': e.type }, `${new Date(e.at).toLocaleTimeString()}  ${e.type}`));
    while (eventsBox.childElementCount > 200) eventsBox.lastElementChild?.remove();
    if (e.type === 'instance.deleted') location.hash = '#/';
    else if (e.type.startsWith('exec.')) void processes.refresh();
    else void refresh();
  }, signal);
}
