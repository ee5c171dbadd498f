import { z } from 'zod';
import { Env } from './common.js';
import { Instance } from './instances.js';

/** Checkpoints, rollback, fork and lineage. */

export const CreateCheckpointRequest = z
  .object({
    label: z.string().max(200).optional(),
    memory: z.boolean().optional().describe('keep memory and running processes (default true); false: files only'),
    retention: z.object({ mode: z.literal('delete_oldest') }).optional().describe('at the instance\'s limit, delete the oldest ready checkpoint instead of answering 429'),
  })
  .strict()
  .meta({ id: 'CreateCheckpointRequest', examples: [{ label: 'before' }, { label: 'files only', memory: false }] });

export const WaitQuery = z.object({
  wait: z
    .preprocess((v) => (v === 'true' || v === '1' ? true : v === 'false' || v === '0' ? false : v), z.union([z.boolean(), z.literal('durable')]))
    .optional()
    .describe('`true`: answer once the checkpoint is no longer processing; `durable`: once it is in the object store too (409 with reason NO_OBJECT_STORE on a server without one)'),
});

export const Checkpoint = z
  .object({
    id: z.string(),
    instance_id: z.string(),
    label: z.string().nullable(),
    status: z.enum(['processing', 'ready', 'failed']),
    memory: z.boolean(),
    parent_id: z.string().nullable().describe('the checkpoint this one followed (its nearest one still there), or null'),
    delta_bytes: z.number().int().nullable(),
    memory_bytes: z.number().int().nullable(),
    pause_ms: z.number().nullable().describe('how long the instance was frozen: dump to restored (null for a stopped instance)'),
    error: z.string().nullable(),
    created_at: z.string(),
    ready_at: z.string().nullable(),
    durable: z.boolean().describe('its layers and memory image are in the object store (with one configured)'),
    uploaded_bytes: z.number().int().nullable().describe('what making it durable uploaded: blobs it shares with earlier checkpoints were there already'),
  })
  .meta({
    id: 'Checkpoint',
    examples: [
      {
        id: 'ckpt_0123456789abcdef',
        instance_id: 'inst_0123456789abcdef',
        label: 'before',
        status: 'ready',
        memory: true,
        parent_id: null,
        delta_bytes: 4096,
        memory_bytes: 1310720,
        pause_ms: 26.3,
        error: null,
        created_at: '2026-11-22T08:00:00.000Z',
        ready_at: '2026-11-22T08:00:00.100Z',
        durable: false,
        uploaded_bytes: null,
      },
    ],
  });

export const CheckpointPage = z.object({ items: z.array(Checkpoint), next_cursor: z.string().nullable() }).meta({ id: 'CheckpointPage' });

export const RollbackRequest = z
  .object({ checkpoint_id: z.string().min(1).max(64) })
  .strict()
  .meta({ id: 'RollbackRequest', examples: [{ checkpoint_id: 'ckpt_0123456789abcdef' }] });

export const ForkRequest = z
  .object({
    name: z.string().max(63).optional().describe('the new instance\'s name; with count, a prefix: name-1, name-2, ...'),
    checkpoint_id: z.string().max(64).optional().describe('without it, an implicit checkpoint of the current state is taken'),
    count: z.number().int().min(1).max(64).optional().describe('how many forks; with it the answer is {instances: [...]}'),
    env: Env.optional().describe('variables added to the source\'s'),
    volumes: z
      .enum(['same', 'none'])
      .optional()
      .describe('`same` (default): the source\'s volumes, shared with it; `none`: an empty, read-only directory in each one\'s place (a process that had a volume file open then fails the fork)'),
  })
  .strict()
  .meta({ id: 'ForkRequest', examples: [{ checkpoint_id: 'ckpt_0123456789abcdef' }, { checkpoint_id: 'ckpt_0123456789abcdef', count: 3, name: 'worker' }] });

export const ForkResult = z.object({ instances: z.array(Instance) }).meta({ id: 'ForkResult' });

export interface LineageShape {
  kind: 'instance' | 'checkpoint';
  id: string;
  label: string | null;
  status: string;
  children: LineageShape[];
}
export const Lineage: z.ZodType<LineageShape> = z
  .object({
    kind: z.enum(['instance', 'checkpoint']),
    id: z.string(),
    label: z.string().nullable(),
    status: z.string(),
    get children(): z.ZodArray<z.ZodType<LineageShape>> {
      return z.array(Lineage);
    },
  })
  .meta({ id: 'LineageNode' });
