import { api, type FileEntry } from './api.js';
import { bytes, fill, h } from './dom.js';

/** Joins a directory and a name the sandbox gave (a name is one path part: no slash in it). */
function join(dir: string, name: string): string {
  return dir === '/' ? `/${name}` : `${dir}/${name}`;
}
function parent(dir: string): string {
  const i = dir.lastIndexOf('/');
  return i <= 0 ? '/' : dir.slice(0, i);
}

/** Saves bytes as a download: an object URL of this page's origin, clicked and let go. */
function save(blob: Blob, name: string): void {
  const url = URL.createObjectURL(blob);
  const a = h('a', { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/**
 * A file browser of one instance: a directory at a time, into directories by a click, files
 * downloaded, uploaded into the directory shown, removed.
 */
export function fileBrowser(instanceId: string, report: (err: unknown, info?: string) => void, start = '/root'): { element: HTMLElement; refresh(): Promise<void> } {
  let dir = start;
  const pathEl = h('span', { class: 'files-path', 'data-testid': 'files-path' });
  const body = h('tbody');
  const input = h('input', { type: 'file', 'aria-label': 'upload files', 'data-testid': 'upload', multiple: true });
  input.addEventListener('change', () => void upload());

  async function upload(): Promise<void> {
    const files = [...(input.files ?? [])];
    try {
      for (const f of files) await api.upload(instanceId, join(dir, f.name), f);
      if (files.length) report(undefined, `uploaded ${files.map((f) => f.name).join(', ')} to ${dir}`);
    } catch (err) {
      report(err);
    }
    input.value = '';
    await refresh();
  }

  function row(e: FileEntry): HTMLTableRowElement {
    const path = join(dir, e.name);
    const isDir = e.type === 'dir';
    const name = isDir
      ? h('a', { href: '#', 'data-dir': e.name, onclick: (ev: Event) => (ev.preventDefault(), void go(path)) }, `${e.name}/`)
      : h('span', {}, e.name);
    const actions = h('td', {});
    if (!isDir) {
      actions.append(
        h('button', { class: 'small', 'data-download': e.name, onclick: () => void api.download(instanceId, path).then((b) => save(b, e.name), report) }, 'Download'),
        ' ',
        h('button', { class: 'small danger', 'data-remove': e.name, onclick: () => void api.removeFile(instanceId, path).then(refresh, report) }, 'Remove'),
      );
    }
    return h('tr', { 'data-file': e.name }, h('td', { class: 'wrap mono' }, name), h('td', { class: 'muted' }, e.type), h('td', {}, isDir ? '' : bytes(e.size)), actions);
  }

  async function go(to: string): Promise<void> {
    dir = to;
    await refresh();
  }

  async function refresh(): Promise<void> {
    pathEl.textContent = dir;
    try {
      const list = await api.list(instanceId, dir);
      const items = [...list.items].sort((a, b) => a.name.localeCompare(b.name));
      fill(body, ...items.map(row));
      if (dir !== '/') body.prepend(h('tr', {}, h('td', { colspan: 4 }, h('a', { href: '#', onclick: (ev: Event) => (ev.preventDefault(), void go(parent(dir))) }, '..'))));
    } catch (err) {
      fill(body, h('tr', {}, h('td', { colspan: 4, class: 'muted' }, err instanceof Error ? err.message : String(err))));
    }
  }

  const element = h(
    'section',
    { class: 'panel', 'data-testid': 'files' },
    h('div', { class: 'row' }, h('h2', {}, 'Files'), pathEl, h('span', { class: 'spacer' }), h('label', {}, 'Upload ', input), h('button', { class: 'small', 'data-testid': 'files-refresh', onclick: () => void refresh() }, 'Refresh')),
    h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Type'), h('th', {}, 'Size'), h('th', {}, ''))), body),
  );
  return { element, refresh };
}
