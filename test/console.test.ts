import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { layerOf, push, startRegistry, writeOciLayout, type TestRegistry } from './helpers/registry.js';
import { startServer, type TestServer } from './helpers/server.js';

/**
 * The web console at /ui, driven in Debian's Chromium (installed by the set-up with --test) through
 * playwright-core, against a real server and real sandboxes: what a person does there, end to end.
 * Screenshots of each page are written to test-output/console/ (README shows one).
 */
const CHROMIUM = '/usr/bin/chromium';
const SHOTS = new URL('../test-output/console/', import.meta.url).pathname;
// Chromium's own background connections would be refused by a closed network, many at a time.
const ARGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];

let s: TestServer;
let browser: Browser;
let registry: TestRegistry;
let work: string;
const created = new Set<string>();

beforeAll(async () => {
  s = await startServer();
  // A registry with one small image, for the images page's pull.
  work = await mkdtemp(join(tmpdir(), 'forkpoint-console-'));
  registry = await startRegistry();
  await writeOciLayout(join(work, 'layout'), 'v1', [await layerOf('/opt/forkpoint/images/default')], {});
  await push(join(work, 'layout'), 'v1', `${registry.host}/console/app:v1`);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS, headless: true, timeout: 30_000 });
  await mkdir(SHOTS, { recursive: true });
});
afterAll(async () => {
  await browser?.close();
  for (const id of created) await s?.api('DELETE', `/instances/${id}`).catch(() => {});
  await s?.close();
  await registry?.close();
  if (work) await rm(work, { recursive: true, force: true });
});

/** A fresh browser context and page whose console errors and uncaught exceptions are kept. */
async function openPage(): Promise<{ context: BrowserContext; page: Page; errors: string[] }> {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 }, acceptDownloads: true });
  const page = await context.newPage();
  page.setDefaultTimeout(20_000);
  const errors: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  page.on('pageerror', (e) => errors.push(`uncaught: ${e.message}`));
  return { context, page, errors };
}

async function signIn(page: Page, token: string): Promise<void> {
  await page.goto(`${s.url}/ui`);
  // By its label, and sent with the keyboard: as a screen reader's user would.
  await page.getByLabel('API token').fill(token);
  await page.keyboard.press('Enter');
}

const terminalText = (page: Page) => page.locator('.xterm-rows').innerText();

describe('the web console', () => {
  it('is served with a policy that runs code from its own origin only, and needs no token to load', async () => {
    const res = await fetch(`${s.url}/ui`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/html/);
    expect(res.headers.get('content-security-policy')).toContain("script-src 'self'");
    expect(res.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    const script = /src="(\/ui\/assets\/[^"]+\.js)"/.exec(await res.text())?.[1];
    expect(script).toBeDefined();
    const js = await fetch(`${s.url}${script}`);
    expect(js.headers.get('content-type')).toMatch(/^(text|application)\/javascript/);
    expect(js.headers.get('content-security-policy')).toContain("script-src 'self'");
    // Only the built files: no path climbs out of them (sent as they are: undici does not
    // normalise a path as fetch does).
    for (const path of ['/ui/..%2F..%2Fpackage.json', '/ui/assets/..%2F..%2F..%2Fpackage.json', '/ui/%2e%2e/%2e%2e/package.json', '/ui/../../package.json', '/ui/nope.js']) {
      const r = await request(`${s.url}${path}`);
      const body = await r.body.text();
      // Refused by the console (400, 403, 404), or it never reached it (a route outside /ui: 401).
      expect([400, 401, 403, 404], `${path}: ${r.statusCode} ${body}`).toContain(r.statusCode);
      expect(body).not.toContain('"name": "forkpoint"');
      expect((JSON.parse(body) as { error: { code: string } }).error.code, body).toMatch(/^(NOT_FOUND|INVALID_REQUEST|FORBIDDEN|UNAUTHENTICATED)$/);
    }
  });

  it('refuses a wrong token with one clear line, and keeps nothing', async () => {
    const { context, page } = await openPage();
    try {
      await signIn(page, 'fp_not-a-token');
      await expect.poll(() => page.locator('#banner').innerText()).toContain('not valid');
      await expect(page.getByTestId('token').isVisible()).resolves.toBe(true);
      expect(await page.evaluate(() => sessionStorage.getItem('forkpoint.token'))).toBeNull();
    } finally {
      await context.close();
    }
  });

  it('signs in, creates an instance, types into its terminal, uploads and downloads, checkpoints, rolls back and forks, with no console error', async () => {
    const { context, page, errors } = await openPage();
    try {
      await page.goto(`${s.url}/ui`);
      await page.getByTestId('token').waitFor();
      await page.screenshot({ path: `${SHOTS}sign-in.png` });
      await signIn(page, s.token);
      await page.getByTestId('create').waitFor();
      await page.getByTestId('create-name').fill('console-test');
      await page.getByTestId('create').click();
      await page.waitForURL(/#\/instances\/inst_/);
      const id = /#\/instances\/(inst_[A-Za-z0-9]+)/.exec(page.url())![1]!;
      created.add(id);
      await expect.poll(() => page.getByTestId('status').innerText()).toBe('running');

      // The terminal: a shell in the sandbox, over the PTY WebSocket.
      await page.locator('.xterm-rows').waitFor();
      await page.locator('.xterm').click();
      await page.keyboard.type('echo typed-$((6*7)) > /root/typed; cat /root/typed\n');
      await expect.poll(() => terminalText(page), { timeout: 15_000 }).toContain('typed-42');
      expect((await s.exec(id, { command: 'cat /root/typed' })).stdout).toBe('typed-42\n');

      // Files: upload into the directory shown, download back.
      await page.getByTestId('files-refresh').click();
      await page.getByTestId('files').locator('[data-file="typed"]').waitFor();
      await page.getByTestId('upload').setInputFiles({ name: 'note.txt', mimeType: 'text/plain', buffer: Buffer.from('first version\n') });
      await page.getByTestId('files').locator('[data-file="note.txt"]').waitFor();
      expect((await s.exec(id, { command: 'cat /root/note.txt' })).stdout).toBe('first version\n');
      const downloading = page.waitForEvent('download');
      await page.locator('[data-download="note.txt"]').click();
      const download = await downloading;
      expect(download.suggestedFilename()).toBe('note.txt');
      expect(await readFile((await download.path())!, 'utf8')).toBe('first version\n');

      // A background process: started from the page, its output read there, stopped there.
      await page.getByTestId('process-command').fill('echo serving; exec sleep 600');
      await page.getByTestId('process-start').click();
      await expect.poll(() => page.locator('#banner').innerText()).toMatch(/started exec_[0-9a-f]{8}/);
      const execId = /started (exec_[0-9a-f]{8})/.exec(await page.locator('#banner').innerText())![1]!;
      await page.locator(`[data-exec="${execId}"][data-status="running"]`).waitFor();
      await page.locator(`[data-output="${execId}"]`).click();
      await expect.poll(() => page.getByTestId('process-output').textContent()).toBe('serving\n');
      await page.locator(`[data-stop="${execId}"]`).click();
      await page.locator(`[data-exec="${execId}"][data-status="exited"]`).waitFor();
      expect((await s.api('GET', `/instances/${id}/exec/${execId}`)).body).toMatchObject({ status: 'exited', signal: 15 });

      // A checkpoint, labelled; it becomes ready on the page (the event stream says so).
      await page.getByTestId('checkpoint-label').fill('before-change');
      await page.getByTestId('checkpoint').click();
      const row = page.locator('[data-checkpoint][data-status="ready"]');
      await row.waitFor();
      const checkpointId = (await row.getAttribute('data-checkpoint'))!;
      await page.screenshot({ path: `${SHOTS}instance.png`, fullPage: true });

      // Changed after the checkpoint, then rolled back: the file is as it was.
      await s.exec(id, { command: 'echo second version > /root/note.txt' });
      await page.locator(`[data-rollback="${checkpointId}"]`).click();
      await expect.poll(() => page.locator('#banner').innerText()).toContain('rolled back to before-change');
      expect((await s.exec(id, { command: 'cat /root/note.txt' })).stdout).toBe('first version\n');
      await expect.poll(() => page.getByTestId('status').innerText()).toBe('running');
      // The page's terminal is a new one in the restored sandbox, and works.
      await page.locator('.xterm').click();
      await page.keyboard.type('echo after-rollback-$((2+3))\n');
      await expect.poll(() => terminalText(page), { timeout: 15_000 }).toContain('after-rollback-5');

      // A fork from the checkpoint: the lineage graph shows the new instance under it.
      await page.locator(`[data-fork="${checkpointId}"]`).click();
      await expect.poll(() => page.locator('#banner').innerText()).toContain('forked: inst_');
      const forkId = /forked: (inst_[A-Za-z0-9]+)/.exec(await page.locator('#banner').innerText())![1]!;
      created.add(forkId);
      const lineage = page.getByTestId('lineage');
      await lineage.locator(`[data-kind="instance"][data-id="${forkId}"]`).waitFor();
      expect(await lineage.locator(`[data-kind="checkpoint"][data-id="${checkpointId}"]`).count()).toBe(1);
      expect(await lineage.locator('[data-kind="instance"]').count()).toBe(2);
      await page.screenshot({ path: `${SHOTS}lineage.png`, fullPage: true });

      // The fork opens from its node in the graph; its files are the checkpoint's.
      await lineage.locator(`[data-kind="instance"][data-id="${forkId}"]`).click();
      await page.waitForURL(new RegExp(`#/instances/${forkId}$`));
      await expect.poll(() => page.getByTestId('status').innerText()).toBe('running');
      await page.getByTestId('files').locator('[data-file="note.txt"]').waitFor();

      // The images page: what the owner can start an instance of, and a pull from a registry.
      await page.goto(`${s.url}/ui#/images`);
      await page.locator('[data-image="default"]').waitFor();
      const ref = `${registry.host}/console/app:v1`;
      await page.getByLabel('image reference').fill(ref);
      await page.getByTestId('pull').click();
      await page.locator(`[data-image="${ref}"]`).waitFor();
      await expect.poll(() => page.locator('#banner').innerText()).toContain(`pulled ${ref}`);
      await page.screenshot({ path: `${SHOTS}images.png` });

      // The list shows both, with live statuses.
      await page.goto(`${s.url}/ui#/`);
      await page.locator(`[data-instance="${forkId}"]`).waitFor();
      await page.locator(`[data-instance="${id}"] [data-status="running"]`).waitFor();
      await page.screenshot({ path: `${SHOTS}instances.png` });

      expect(errors).toEqual([]);
    } finally {
      await context.close();
    }
  });
});
