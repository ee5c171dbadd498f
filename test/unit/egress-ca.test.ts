import { createSecureContext, connect } from 'node:tls';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { X509Certificate } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { issueServerCertificate, newEgressCa } from '../../src/lib/egress-ca.js';

describe('an instance\'s egress CA', () => {
  it('signs server certificates a TLS client that trusts it accepts for that host, and only that host', async () => {
    const ca = await newEgressCa('forkpoint egress inst_test');
    const caCert = new X509Certificate(ca.certPem);
    expect(caCert.ca).toBe(true);
    const leaf = await issueServerCertificate(ca, 'api.example.test');
    const leafCert = new X509Certificate(leaf.certPem);
    expect(leafCert.checkIssued(caCert)).toBe(true);
    expect(leafCert.verify(caCert.publicKey)).toBe(true);
    expect(leafCert.checkHost('api.example.test')).toBe('api.example.test');
    expect(leafCert.checkHost('other.example.test')).toBeUndefined();
    expect(leafCert.ca).toBe(false);

    const server = createServer({ cert: leaf.certPem, key: leaf.keyPem }, (_req, res) => res.end('ok'));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    const handshake = (servername: string, trusted: boolean) =>
      new Promise<string>((resolve) => {
        const s = connect({ host: '127.0.0.1', port, servername, ...(trusted ? { secureContext: createSecureContext({ ca: ca.certPem }) } : {}) });
        s.once('secureConnect', () => {
          s.destroy();
          resolve('ok');
        });
        s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
      });
    try {
      expect(await handshake('api.example.test', true)).toBe('ok');
      expect(await handshake('other.example.test', true)).toBe('ERR_TLS_CERT_ALTNAME_INVALID');
      expect(await handshake('api.example.test', false)).toBe('UNABLE_TO_VERIFY_LEAF_SIGNATURE');
    } finally {
      server.close();
    }
  });
});
