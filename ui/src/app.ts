import '../console.css';
import { ApiError, json, session } from './api.js';
import { fill, h } from './dom.js';
import { instancePage } from './instance.js';
import { imagesPage } from './images.js';
import { instancesPage } from './instances.js';

const app = document.getElementById('app')!;
const nav = document.getElementById('nav')!;
const banner = document.getElementById('banner')!;

let bannerTimer: number | undefined;
/** Shows what an action did, or why it failed: the server's code and message, on one line. */
function report(err: unknown, info?: string): void {
  window.clearTimeout(bannerTimer);
  if (err === undefined) {
    banner.className = 'info';
    banner.textContent = info ?? '';
    bannerTimer = window.setTimeout(() => (banner.hidden = true), 6000);
  } else {
    banner.className = '';
    banner.textContent = err instanceof ApiError ? `${err.code}: ${err.message}` : err instanceof Error ? err.message : String(err);
    if (err instanceof ApiError && err.status === 401) {
      session.signOut();
      route();
    }
  }
  banner.setAttribute('data-kind', err === undefined ? 'info' : 'error');
  banner.hidden = false;
}

function signInPage(): void {
  const token = h('input', { type: 'password', id: 'token', name: 'token', autocomplete: 'off', placeholder: 'fp_…', 'data-testid': 'token' });
  const button = h('button', { class: 'primary', type: 'submit', 'data-testid': 'sign-in' }, 'Sign in');
  const form = h('form', { class: 'panel signin' },
    h('h1', {}, 'Sign in'),
    h('p', { class: 'muted' }, 'With an API token of this server (', h('code', {}, 'forkpoint token create'), ', or the one the server printed at its first start).'),
    h('label', { for: 'token' }, 'API token'), token, button);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    button.disabled = true;
    try {
      const value = token.value.trim();
      await json('GET', '/instances?limit=1', undefined, { token: value });
      session.signIn(value);
      banner.hidden = true;
      route();
    } catch (err) {
      report(err instanceof ApiError && err.status === 401 ? new Error('That token is not valid here.') : err);
    } finally {
      button.disabled = false;
    }
  });
  fill(nav);
  fill(app, form);
  token.focus();
}

let page: AbortController | undefined;
/** One page at a time: leaving one aborts what it had under way (polls, streams, its terminal). */
function route(): void {
  page?.abort();
  page = new AbortController();
  if (!session.token) return signInPage();
  fill(nav,
    h('a', { href: '#/' }, 'Instances'),
    h('a', { href: '#/images' }, 'Images'),
    h('a', { href: '/docs', target: '_blank', rel: 'noopener' }, 'API'),
    h('button', { class: 'small', 'data-testid': 'sign-out', onclick: () => (session.signOut(), route()) }, 'Sign out'));
  const m = /^#\/instances\/([A-Za-z0-9_-]{1,64})$/.exec(location.hash);
  if (m) instancePage(app, m[1]!, report, page.signal);
  else if (location.hash === '#/images') imagesPage(app, report);
  else instancesPage(app, report, page.signal);
}

window.addEventListener('hashchange', route);
window.addEventListener('pagehide', () => page?.abort());
route();
