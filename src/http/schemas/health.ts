import { z } from 'zod';

export const Health = z
  .object({
    ok: z.boolean(),
    version: z.string(),
    engine: z.object({
      criu: z.object({ path: z.string(), version: z.string().nullable(), ok: z.boolean(), error: z.string().optional().describe("what `criu check` said at the server's start, when it failed") }),
      overlay: z.boolean(),
      cgroups: z.number().int(),
      root: z.boolean(),
      user_namespaces: z.enum(['on', 'off']).describe("whether new instances get a user namespace of their own unless they ask otherwise (FORKPOINT_USER_NAMESPACES); each instance's view says which it has"),
      lazy_restores: z
        .enum(['on', 'host-ids', 'off'])
        .describe("whether a restore of a memory image with `lazyRestoreMb` MiB of pages or more runs before its memory is in: for every sandbox, for those on the host's ids only (no /dev/userfaultfd here, or a CRIU without forkpoint's patch), or not at all"),
      incremental_checkpoints: z
        .enum(['on', 'off'])
        .describe('whether a memory checkpoint of a sandbox left running copies only the pages written since its previous one (Linux 6.7+ userfaultfd write-protection, and a CRIU with forkpoint\'s patch); each checkpoint is whole once ready either way'),
    }),
  })
  .meta({ id: 'Health' });

export const Readiness = z
  .object({
    ready: z.boolean(),
    checks: z.object({
      engine: z.boolean().describe("CRIU, overlayfs, root and the agent are there (what /healthz's `ok` says)"),
      database: z.boolean().describe('the store answered within 2 s'),
      object_store: z.boolean().optional().describe('the bucket answered within 2 s; absent without an object store'),
      draining: z.boolean().describe('the server is shutting down'),
      fenced: z.boolean().optional().describe('present while the node cannot renew its lease in the shared database: its sandboxes are frozen until it can'),
    }),
  })
  .meta({ id: 'Readiness' });
