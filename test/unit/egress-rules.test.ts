import { describe, expect, it } from 'vitest';
import { egressAllows, hostMatches, DEFAULT_POLICY } from '../../src/lib/egress-policy.js';
import { nestedVolumePaths, volumePathProblem } from '../../src/lib/volume-path.js';

// The egress proxy's copy of the firewall's decision, and where a volume may go: plain functions.
describe('what the egress proxy lets a sandbox reach (the firewall\'s decision, in code)', () => {
  const SANDBOXES = '10.88.0.0/16';
  it('never the metadata address, loopback or the sandboxes\' own subnet, whatever is allowed', () => {
    const open = { egress: 'allow' as const, allow: ['0.0.0.0/0', 'evil.example'], deny: [] };
    for (const ip of ['169.254.169.254', '127.0.0.1', '10.88.0.7']) expect(egressAllows(open, 'evil.example', ip, SANDBOXES), ip).toBe(false);
  });
  it('public addresses by default; private ranges only when allowed, by address or by name; deny first', () => {
    expect(egressAllows(DEFAULT_POLICY, 'api.example.com', '93.184.216.34')).toBe(true);
    expect(egressAllows(DEFAULT_POLICY, 'internal.example', '172.31.5.2')).toBe(false);
    expect(egressAllows({ egress: 'allow', allow: ['172.16.0.0/12'], deny: [] }, 'internal.example', '172.31.5.2')).toBe(true);
    expect(egressAllows({ egress: 'deny', allow: ['*.example'], deny: [] }, 'internal.example', '172.31.5.2')).toBe(true);
    expect(egressAllows({ egress: 'deny', allow: [], deny: [] }, 'api.example.com', '93.184.216.34')).toBe(false);
    expect(egressAllows({ egress: 'allow', allow: ['93.184.216.0/24'], deny: ['api.example.com'] }, 'api.example.com', '93.184.216.34')).toBe(false);
  });
  it('a rule\'s host pattern: exact, or *. for the domain and its subdomains (as network policies read it)', () => {
    expect(hostMatches('api.example.com', 'API.example.com')).toBe(true);
    expect(hostMatches('api.example.com', 'x.api.example.com')).toBe(false);
    expect(hostMatches('*.example.com', 'a.b.example.com')).toBe(true);
    expect(hostMatches('*.example.com', 'example.com')).toBe(true);
    expect(hostMatches('*.example.com', 'badexample.com')).toBe(false);
    expect(hostMatches('10.0.0.1', '10.0.0.1')).toBe(false);
  });
});

describe('where a volume may be mounted', () => {
  it('an absolute path of plain names, outside what forkpoint mounts itself; volumes do not nest', () => {
    for (const ok of ['/data', '/home/user/work', '/srv/a-b_c.d', '/opt/x@1']) expect(volumePathProblem(ok), ok).toBeUndefined();
    for (const bad of ['/', '', 'data', '/a/../b', '/a/./b', '/a//b', '/proc', '/proc/x', '/dev/shm', '/sys', '/.fp', '/tmp/x', '/a:b', '/a]b', '/a,b', '/a b', `/${'x'.repeat(300)}`, '/1/2/3/4/5/6/7/8/9']) {
      expect(volumePathProblem(bad), bad).toBeDefined();
    }
    expect(nestedVolumePaths(['/a', '/ab'])).toBeUndefined();
    expect(nestedVolumePaths(['/a', '/a/b'])).toEqual(['/a', '/a/b']);
    expect(nestedVolumePaths(['/a', '/a'])).toEqual(['/a', '/a']);
  });
});
