import { api, type Instance } from './api.js';
import { fill, h, statusBadge, when } from './dom.js';

const POLL_MS = 2000;

/** The instances page: a table whose statuses follow the server's, and a create form. */
export function instancesPage(root: HTMLElement, report: (err: unknown, info?: string) => void, signal: AbortSignal): void {
  const body = h('tbody', { 'data-testid': 'instances' });
  const image = h('select', { name: 'image', 'aria-label': 'image', 'data-testid': 'create-image' });
  const name = h('input', { name: 'name', 'aria-label': 'name', placeholder: 'name (optional)', maxlength: 63, 'data-testid': 'create-name' });
  const create = h('button', { class: 'primary', 'data-testid': 'create' }, 'Create instance');
  create.addEventListener('click', async () => {
    create.disabled = true;
    try {
      const inst = await api.create({ image: image.value || undefined, name: name.value.trim() || undefined });
      location.hash = `#/instances/${inst.id}`;
    } catch (err) {
      report(err);
    } finally {
      create.disabled = false;
    }
  });

  const row = (i: Instance) =>
    h('tr', { class: 'clickable', 'data-instance': i.id, onclick: () => (location.hash = `#/instances/${i.id}`) },
      // A link, so the keyboard reaches it too; the row's click is a larger target for the mouse.
      h('td', { class: 'mono' }, h('a', { href: `#/instances/${i.id}` }, i.id)),
      h('td', {}, i.name),
      h('td', {}, statusBadge(i.status)),
      h('td', {}, i.image),
      h('td', { class: 'mono muted' }, i.source_instance_id ? `fork of ${i.source_instance_id}` : ''),
      h('td', { class: 'muted' }, when(i.created_at)));

  fill(root,
    h('section', { class: 'panel' },
      h('h1', {}, 'Instances'),
      h('div', { class: 'row' }, image, name, create)),
    h('section', { class: 'panel' },
      h('table', {}, h('thead', {}, h('tr', {}, ...['Id', 'Name', 'Status', 'Image', 'Origin', 'Created'].map((t) => h('th', {}, t)))), body)));

  api.images().then((r) => {
    const names = r.images.map((i) => i.name);
    fill(image, ...names.map((n) => h('option', { value: n, selected: n === 'default' }, n)));
  }, report);

  const poll = async () => {
    while (!signal.aborted) {
      try {
        const page = await api.instances(signal);
        fill(body, ...page.items.map(row));
        if (page.items.length === 0) fill(body, h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'No instances yet.')));
      } catch (err) {
        if (signal.aborted) return;
        report(err);
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  };
  void poll();
}
