import { webcrypto } from 'node:crypto';

type X509 = typeof import('@peculiar/x509');
let loaded: Promise<X509> | undefined;

/** @peculiar/x509, loaded when an instance with secrets first needs a certificate: it (and the
 * Reflect metadata API its ASN.1 parsers resolve through tsyringe) takes ~110 ms to load, which
 * every server start paid. */
function x509Module(): Promise<X509> {
  loaded ??= import('reflect-metadata').then(() => import('@peculiar/x509')).then((x509) => {
    x509.cryptoProvider.set(webcrypto as unknown as Crypto);
    return x509;
  });
  return loaded;
}

const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const DAY_MS = 86_400_000;

/** A certificate and its private key, PEM. */
export interface CertificateAndKey {
  certPem: string;
  keyPem: string;
}

/** PEM ending in a newline, so that PEMs concatenate into a chain or a bundle. */
const lined = (text: string) => (text.endsWith('\n') ? text : `${text}\n`);
async function keyPemOf(x509: X509, key: CryptoKey): Promise<string> {
  return lined(x509.PemConverter.encode(await webcrypto.subtle.exportKey('pkcs8', key as webcrypto.CryptoKey), 'PRIVATE KEY'));
}

const serial = () => Buffer.from(webcrypto.getRandomValues(new Uint8Array(16))).toString('hex').replace(/^[89a-f]/, '1');

/** A certificate authority of one instance's: the certificates its egress proxy shows the
 * sandbox for hosts with a secret rule. It may sign server certificates only (path length 0). */
export async function newEgressCa(name: string): Promise<CertificateAndKey> {
  const x509 = await x509Module();
  const keys = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as unknown as CryptoKeyPair;
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: `CN=${name}, O=forkpoint`,
    notBefore: new Date(now - DAY_MS),
    notAfter: new Date(now + 3650 * DAY_MS),
    keys,
    signingAlgorithm: ALG,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { certPem: lined(cert.toString('pem')), keyPem: await keyPemOf(x509, keys.privateKey) };
}

/** A server certificate for `host`, signed by the CA, valid for a week. */
export async function issueServerCertificate(ca: CertificateAndKey, host: string): Promise<CertificateAndKey> {
  const x509 = await x509Module();
  const caCert = new x509.X509Certificate(ca.certPem);
  const caKey = await webcrypto.subtle.importKey('pkcs8', x509.PemConverter.decodeFirst(ca.keyPem), ALG, false, ['sign']);
  const keys = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as unknown as CryptoKeyPair;
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: `CN=${host}`,
    issuer: caCert.subject,
    notBefore: new Date(now - DAY_MS),
    notAfter: new Date(now + 7 * DAY_MS),
    publicKey: keys.publicKey,
    signingKey: caKey as unknown as CryptoKey,
    signingAlgorithm: ALG,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension([{ type: 'dns', value: host }]),
      await x509.AuthorityKeyIdentifierExtension.create(caCert),
    ],
  });
  return { certPem: lined(cert.toString('pem')), keyPem: await keyPemOf(x509, keys.privateKey) };
}
