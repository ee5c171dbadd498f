import { describe, expect, it } from 'vitest';
import type { Forkpoint } from '../../src/core/forkpoint.js';
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
