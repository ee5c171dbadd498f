import { z } from 'zod';

export const Health = z
  .object({
    ok: z.boolean(),
    version: z.string(),
    engine: z.object({
      criu: z.object({ path: z.string(), version: z.string().nullable(), ok: z.boolean() }),
      overlay: z.boolean(),
      cgroups: z.number().int(),
      root: z.boolean(),
    }),
  })
  .meta({ id: 'Health' });
