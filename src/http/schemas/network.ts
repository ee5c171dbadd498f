import { z } from 'zod';
import { IdParams } from './common.js';

/** Port forwards and preview links (Firecase's shapes). */

const Port = z.number().int().min(1).max(65535);

export const CreatePortForwardRequest = z
  .object({
    guest_port: Port.describe('the port inside the instance'),
    host_port: Port.optional().describe('the port on the host (on the server\'s listen address); default: any free one'),
    protocol: z.literal('tcp').default('tcp'),
    label: z.string().max(200).optional(),
  })
  .strict()
  .meta({ id: 'CreatePortForwardRequest', examples: [{ guest_port: 8080, label: 'dev server' }] });

export const PortForward = z
  .object({
    id: z.string(),
    instance_id: z.string(),
    guest_port: z.number().int(),
    host_port: z.number().int(),
    protocol: z.literal('tcp'),
    label: z.string().nullable(),
    created_at: z.string(),
  })
  .meta({ id: 'PortForward' });

export const PortForwardAnswer = z.object({ port_forward: PortForward }).meta({ id: 'PortForwardAnswer' });
export const PortForwardList = z.object({ port_forwards: z.array(PortForward) }).meta({ id: 'PortForwardList' });
export const PortForwardParams = IdParams.extend({ forward_id: z.string().min(1).max(64) });

export const PortParams = IdParams.extend({ port: z.coerce.number().int().min(1).max(65535) });

export const PreviewRequest = z
  .object({ ttl_s: z.number().int().min(1).max(7 * 86400).default(3600).describe('how long the link works') })
  .strict()
  .meta({ id: 'PreviewRequest', examples: [{ ttl_s: 600 }] });

export const PreviewLink = z
  .object({
    url: z.string().describe('opens the port in a browser, with no other credential; good until expires_at'),
    expires_at: z.string(),
  })
  .meta({ id: 'PreviewLink' });
