import { describe, expect, it } from 'vitest';
import { BadReferenceError, formatReference, looksLikeReference, parseReference, plainHttpAllowed } from '../../src/lib/image-reference.js';

describe('image references, as Docker reads them', () => {
  it.each([
    ['python', { registry: 'docker.io', repository: 'library/python', tag: 'latest', digest: undefined }],
    ['python:3.12-slim', { registry: 'docker.io', repository: 'library/python', tag: '3.12-slim' }],
    ['docker.io/library/python:3.12-slim', { registry: 'docker.io', repository: 'library/python', tag: '3.12-slim' }],
    ['team/app', { registry: 'docker.io', repository: 'team/app', tag: 'latest' }],
    ['localhost/app', { registry: 'localhost', repository: 'app', tag: 'latest' }],
    ['127.0.0.1:5000/team/app:v1', { registry: '127.0.0.1:5000', repository: 'team/app', tag: 'v1' }],
    ['registry.example/a/b/c@sha256:' + 'a'.repeat(64), { registry: 'registry.example', repository: 'a/b/c', tag: undefined, digest: 'sha256:' + 'a'.repeat(64) }],
    ['ghcr.io/o/app:1.0@sha256:' + 'b'.repeat(64), { registry: 'ghcr.io', repository: 'o/app', tag: '1.0', digest: 'sha256:' + 'b'.repeat(64) }],
  ])('%s', (text, want) => {
    expect(parseReference(text)).toMatchObject(want);
  });

  it('writes one name for one image', () => {
    expect(formatReference(parseReference('python:3'))).toBe('docker.io/library/python:3');
    expect(formatReference(parseReference('docker.io/library/python:3'))).toBe('docker.io/library/python:3');
    expect(formatReference(parseReference('127.0.0.1:5000/x'))).toBe('127.0.0.1:5000/x:latest');
  });

  it.each(['', 'UPPER/case', 'app:', 'app@sha256:short', 'bad host!/x', 'a//b', '-x', 'app:' + 'x'.repeat(200), '--help', 'x; rm -rf /', 'x'.repeat(600)])(
    'refuses %j: nothing that does not match goes to a command line',
    (text) => {
      expect(() => parseReference(text)).toThrow(BadReferenceError);
    },
  );

  it('tells a registry reference from a local name', () => {
    expect(looksLikeReference('debian')).toBe(false);
    expect(looksLikeReference('my-app')).toBe(false);
    expect(looksLikeReference('python:3')).toBe(true);
    expect(looksLikeReference('team/app')).toBe(true);
  });

  it('speaks plain HTTP to loopback and listed registries only', () => {
    expect(plainHttpAllowed(parseReference('127.0.0.1:5000/a'), [])).toBe(true);
    expect(plainHttpAllowed(parseReference('localhost:5000/a'), [])).toBe(true);
    expect(plainHttpAllowed(parseReference('registry.lan:5000/a'), [])).toBe(false);
    expect(plainHttpAllowed(parseReference('registry.lan:5000/a'), ['registry.lan:5000'])).toBe(true);
    expect(plainHttpAllowed(parseReference('python'), [])).toBe(false);
  });
});
