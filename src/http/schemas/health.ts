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
      user_namespaces: z.enum(['on', 'off']).describe("whether new instances get a user namespace of their own unless they ask otherwise (FORKPOINT_USER_NAMESPACES); each instance's view says which it has"),
    }),
  })
  .meta({ id: 'Health' });
