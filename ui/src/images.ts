import { api } from './api.js';
import { fill, h, statusBadge, when } from './dom.js';

/** The owner's images and templates, with a button that starts an instance of one. */
export function imagesPage(root: HTMLElement, report: (err: unknown, info?: string) => void): void {
  const images = h('tbody', { 'data-testid': 'images' });
  const templates = h('tbody', { 'data-testid': 'templates' });
  const start = (body: { image?: string; template?: string }) => async () => {
    try {
      const inst = await api.create(body);
      location.hash = `#/instances/${inst.id}`;
    } catch (err) {
      report(err);
    }
  };
  const reference = h('input', { 'aria-label': 'image reference', placeholder: 'python:3.12-slim or registry.example/team/app:tag', maxlength: 512, size: 48, 'data-testid': 'pull-reference' });
  const pullButton = h('button', { class: 'primary', 'data-testid': 'pull' }, 'Pull');
  const pullForm = h('form', { class: 'row' }, reference, pullButton);
  pullForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    pullButton.disabled = true;
    pullButton.textContent = 'Pulling…';
    try {
      const r = await api.pull(reference.value.trim());
      report(undefined, `pulled ${r.image.name} (${r.fetched_bytes === 0 ? 'nothing fetched' : `${r.fetched_bytes} bytes fetched`})`);
      reference.value = '';
      await listImages();
    } catch (err) {
      report(err);
    } finally {
      pullButton.disabled = false;
      pullButton.textContent = 'Pull';
    }
  });
  fill(root,
    h('section', { class: 'panel' }, h('h1', {}, 'Images'),
      h('p', { class: 'muted' }, 'Pull one from a registry, or import or build one with ', h('code', {}, 'forkpoint image import'), ' and ', h('code', {}, 'forkpoint image build'), '.'),
      pullForm,
      h('div', { class: 'table-wrap' }, h('table', {}, h('thead', {}, h('tr', {}, ...['Name', 'Kind', 'Base', 'Layers', 'Created', ''].map((t) => h('th', {}, t)))), images))),
    h('section', { class: 'panel' }, h('h1', {}, 'Templates'),
      h('div', { class: 'table-wrap' }, h('table', {}, h('thead', {}, h('tr', {}, ...['Name', 'Status', 'Start command', 'Created', ''].map((t) => h('th', {}, t)))), templates))));

  const listImages = () => api.images().then((r) => {
    fill(images, ...r.images.map((i) =>
      h('tr', { 'data-image': i.name },
        h('td', { class: 'mono' }, i.name), h('td', {}, i.kind), h('td', { class: 'muted mono wrap' }, i.base ?? ''), h('td', {}, i.layers),
        h('td', { class: 'muted' }, when(i.created_at)),
        h('td', {}, h('button', { class: 'small', onclick: start({ image: i.name }) }, 'Start instance')))));
  }, report);
  void listImages();
  api.templates().then((r) => {
    fill(templates, ...r.templates.map((t) =>
      h('tr', { 'data-template': t.name },
        h('td', { class: 'mono' }, t.name), h('td', {}, statusBadge(t.status)), h('td', { class: 'mono muted wrap' }, t.start_command ?? ''),
        h('td', { class: 'muted' }, when(t.created_at)),
        h('td', {}, h('button', { class: 'small', disabled: t.status !== 'ready', onclick: start({ template: t.name }) }, 'Start instance')))));
    if (r.templates.length === 0) fill(templates, h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'No templates.')));
  }, report);
}
