import { z } from 'zod';

/** Secrets on the Firecase-style face: names and dates out, values only in. */

const SecretName = z.string().min(1).max(64).describe('1-64 letters, digits or _, not starting with a digit');

export const SecretParams = z.object({ name: SecretName });

export const PutSecretRequest = z
  .object({ value: z.string().min(1).max(8192).describe('printable ASCII (it goes into HTTP headers); never shown back') })
  .strict()
  .meta({ id: 'PutSecretRequest', examples: [{ value: 'sk-live-0123456789' }] });

export const Secret = z
  .object({ name: z.string(), created_at: z.string(), updated_at: z.string() })
  .meta({ id: 'Secret', examples: [{ name: 'OPENAI_API_KEY', created_at: '2026-11-26T08:00:00.000Z', updated_at: '2026-11-26T08:00:00.000Z' }] });

export const SecretList = z.object({ items: z.array(Secret) }).meta({ id: 'SecretList' });

export const SecretUseRequest = z
  .object({
    name: SecretName.describe('one of your secrets'),
    hosts: z.array(z.string().min(1).max(253)).min(1).max(16).describe('the hosts whose requests carry it (`*.example.com` for the domain and its subdomains)'),
    env: z.string().min(1).max(128).optional().describe('the variable the sandbox finds its placeholder in (default: the secret\'s name)'),
  })
  .strict()
  .meta({ id: 'SecretUseRequest' });

export const InstanceSecret = z
  .object({ name: z.string(), env: z.string(), hosts: z.array(z.string()) })
  .meta({ id: 'InstanceSecret' });
