import { z } from 'zod';

/** Files inside an instance. Paths are absolute inside the sandbox. */

export const PathQuery = z.object({ path: z.string().min(1).max(4096).meta({ description: 'an absolute path inside the sandbox', examples: ['/root/notes.txt'] }) });

export const WriteQuery = PathQuery.extend({
  mode: z
    .string()
    .regex(/^[0-7]{3,4}$/)
    .optional()
    .meta({ description: 'the new file\'s permission bits in octal, as chmod takes them (default 644)', examples: ['755'] }),
});

export const WatchQuery = PathQuery.extend({
  recursive: z.enum(['true', 'false', '1', '0']).optional().transform((v) => v === 'true' || v === '1').meta({ description: 'also the directories below it, as they come and go' }),
});

/** Raw bytes, both ways (streamed: a file of any size). */
export const Binary = z.custom<unknown>(() => true).meta({ type: 'string', format: 'binary' });

export const FileEntry = z
  .object({ name: z.string(), type: z.enum(['dir', 'file', 'link', 'other']), size: z.number().int() })
  .meta({ id: 'FileEntry' });
export const FileList = z.object({ path: z.string(), items: z.array(FileEntry) }).meta({ id: 'FileList' });

export const FileInfo = z
  .object({
    path: z.string(),
    type: z.enum(['dir', 'file', 'link', 'other']),
    size: z.number().int(),
    mode: z.number().int().describe('permission bits, e.g. 420 (0644)'),
    mtime_ms: z.number().int(),
    target: z.string().nullable().describe('where a symlink points'),
  })
  .meta({ id: 'FileInfo' });

export const WriteFileResult = z.object({ path: z.string(), bytes: z.number().int() }).meta({ id: 'WriteFileResult' });

export const MakeDirectoryRequest = z
  .object({ path: z.string().min(1).max(4096) })
  .strict()
  .meta({ id: 'MakeDirectoryRequest', examples: [{ path: '/srv/app/data' }] });
