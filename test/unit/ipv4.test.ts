import { describe, expect, it } from 'vitest';
import { nextFree, parseCidr } from '../../src/lib/ipv4.js';

describe('nextFree: a sandbox\'s address', () => {
  const net = parseCidr('10.9.0.0/29'); // .2 to .6 for sandboxes (.1 the gateway, .7 the broadcast)

  it('is the lowest free one after the gateway, none when all are used', () => {
    expect(nextFree(net, new Set())).toBe('10.9.0.2');
    expect(nextFree(net, new Set(['10.9.0.2', '10.9.0.3']))).toBe('10.9.0.4');
    expect(nextFree(net, new Set(['10.9.0.2', '10.9.0.3', '10.9.0.4', '10.9.0.5', '10.9.0.6']))).toBeUndefined();
  });

  it('is one released lately only when no other is free (its firewall entry may still be going)', () => {
    const recent = new Set(['10.9.0.2', '10.9.0.4']);
    expect(nextFree(net, new Set(), recent)).toBe('10.9.0.3');
    expect(nextFree(net, new Set(['10.9.0.3', '10.9.0.5', '10.9.0.6']), recent)).toBe('10.9.0.2');
    expect(nextFree(net, new Set(['10.9.0.2', '10.9.0.3', '10.9.0.4', '10.9.0.5', '10.9.0.6']), recent)).toBeUndefined();
  });
});
