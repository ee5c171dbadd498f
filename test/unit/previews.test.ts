import { getSignature } from 'e2b';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { Forkpoint } from '../../src/core/forkpoint.js';
import { PreviewLinks } from '../../src/core/previews.js';
import { envdHostSandbox } from '../../src/http/e2b/caller.js';
import { hostRoute, previewPath } from '../../src/http/routes/proxy.js';

const fpWith = (previewDomain: string) => ({ config: { previewDomain } }) as unknown as Forkpoint;
const id = 'inst_abc123';

describe('preview host names', () => {
  it('auto: a link names the host the client used (a balancer\'s), with its scheme and port; an address gives localhost', () => {
    const auto = fpWith('auto');
    expect(previewPath(auto, { host: 'lb.example', scheme: 'https' }, id, 8080)).toBe(`https://8080-${id}.lb.example/`);
    expect(previewPath(auto, { host: 'localhost:7878', scheme: 'http' }, id, 3000)).toBe(`http://3000-${id}.localhost:7878/`);
    expect(previewPath(auto, { host: '127.0.0.1:7878', scheme: 'http' }, id, 3000)).toBe(`http://3000-${id}.localhost:7878/`);
    expect(previewPath(auto, { host: '[::1]:7878', scheme: 'http' }, id, 3000)).toBe(`http://3000-${id}.localhost:7878/`);
    // A host that is not a name (or is a preview's own) never becomes a domain of links.
    for (const host of ['evil.example/x', 'a b', `80-${id}.lb.example`, '']) expect(previewPath(auto, { host, scheme: 'http' }, id, 1)).toMatch(/\.localhost\/$/);
  });

  it('a configured domain is used whatever the client said; none refuses', () => {
    expect(previewPath(fpWith('preview.test'), { host: 'lb.example', scheme: 'http' }, id, 80)).toBe(`http://80-${id}.preview.test/`);
    expect(() => previewPath(fpWith('none'), { host: 'lb.example', scheme: 'http' }, id, 80)).toThrow(/previews are off/);
  });

  it('routes a preview host under its domain, or under any with auto; nothing else', () => {
    expect(hostRoute('auto', `8080-${id}.lb.example`)).toEqual({ id, port: 8080 });
    expect(hostRoute('auto', `sb-${id}-p3000.localhost:7878`)).toEqual({ id, port: 3000 });
    expect(hostRoute('preview.test', `8080-${id}.lb.example`)).toBeUndefined();
    for (const host of ['lb.example', 'localhost:7878', '127.0.0.1:7878', `8080-${id}`, `8080-${id}.`, `99999-${id}.x.y`]) expect(hostRoute('auto', host), host).toBeUndefined();
  });
});

describe('E2B-signed file URLs', () => {
  it('a signature is what the published SDK\'s getSignature makes with the sandbox\'s access token, for that path, operation, user and expiry only', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'fp-links-'));
    try {
      const links = await PreviewLinks.open(join(dir, 'none'), async (proposed) => proposed);
      const access = links.sandboxToken('access', 'alice', id, 'tok_1');
      const sign = async (path: string, operation: 'read' | 'write', user: string | undefined, expirationInSeconds?: number) =>
        getSignature({ path, operation, user, envdAccessToken: access, ...(expirationInSeconds === undefined ? {} : { expirationInSeconds }) });
      const plain = await sign('/tmp/f', 'read', undefined);
      expect(links.isEnvdFileSignature(plain.signature, { path: '/tmp/f', operation: 'read', user: '' }, 'alice', id, 'tok_1')).toBe(true);
      const timed = await sign('a.txt', 'write', 'root', 60);
      const link = { path: 'a.txt', operation: 'write' as const, user: 'root', expiration: timed.expiration! };
      expect(links.isEnvdFileSignature(timed.signature, link, 'alice', id, 'tok_1')).toBe(true);
      // Any other path, operation, user, expiry, sandbox, owner or API token: no.
      for (const [l, owner, sandbox, token] of [
        [{ ...link, path: 'b.txt' }, 'alice', id, 'tok_1'],
        [{ ...link, operation: 'read' as const }, 'alice', id, 'tok_1'],
        [{ ...link, user: '' }, 'alice', id, 'tok_1'],
        [{ ...link, expiration: link.expiration + 1 }, 'alice', id, 'tok_1'],
        [{ ...link, expiration: undefined }, 'alice', id, 'tok_1'],
        [link, 'alice', 'inst_other', 'tok_1'],
        [link, 'bob', id, 'tok_1'],
        [link, 'alice', id, 'tok_2'],
      ] as const) expect(links.isEnvdFileSignature(timed.signature, l, owner, sandbox, token)).toBe(false);
      expect(links.isEnvdFileSignature('v1_short', link, 'alice', id, 'tok_1')).toBe(false);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('envd\'s own host name (49983-<id>.<domain>) names its sandbox; a preview port\'s does not', () => {
    expect(envdHostSandbox('auto', `49983-${id}.lb.example`)).toBe(id);
    expect(envdHostSandbox('preview.test', `49983-${id}.preview.test:443`)).toBe(id);
    expect(envdHostSandbox('auto', `8080-${id}.lb.example`)).toBeUndefined();
    expect(envdHostSandbox('none', `49983-${id}.lb.example`)).toBeUndefined();
    expect(envdHostSandbox('auto', undefined)).toBeUndefined();
  });
});
