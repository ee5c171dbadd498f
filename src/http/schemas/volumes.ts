import { z } from 'zod';

/** Persistent volumes on the Firecase-style face. */

const VolumeName = z.string().min(1).max(63).describe('1-63 lowercase letters, digits, ., _ or -, starting with a letter or digit; unique among your volumes');

export const VolumeParams = z.object({ name: VolumeName });

export const CreateVolumeRequest = z
  .object({
    name: VolumeName,
    size_mb: z.number().int().min(64).max(16 << 20).describe('what it may hold, in MiB (writes past it fail with ENOSPC inside); at most FORKPOINT_MAX_VOLUME_MB'),
  })
  .strict()
  .meta({ id: 'CreateVolumeRequest', examples: [{ name: 'workspace', size_mb: 1024 }] });

export const Volume = z
  .object({
    id: z.string(),
    name: z.string(),
    size_mb: z.number().int(),
    used_bytes: z.number().int().nullable().describe('what its files take now; null when asked of another node than its own'),
    node: z.string().describe('the node whose disk holds it: instances that mount it run there'),
    instances: z.array(z.string()).describe('the instances that mount it'),
    created_at: z.string(),
  })
  .meta({ id: 'Volume', examples: [{ id: 'vol_0123456789abcdef', name: 'workspace', size_mb: 1024, used_bytes: 1179648, node: 'node-3f2a9c1e7b4d', instances: [], created_at: '2026-11-26T08:00:00.000Z' }] });

export const VolumeList = z.object({ items: z.array(Volume) }).meta({ id: 'VolumeList' });

export const VolumeMountRequest = z
  .object({
    name: VolumeName.describe('one of your volumes, on the node the instance is made on'),
    path: z.string().min(2).max(255).describe("where the instance sees it: an absolute path of plain names, made if missing (not under /proc, /dev, /sys, /tmp or /.fp; volumes do not nest)"),
    read_only: z.boolean().optional().describe('mounted read-only (default false)'),
  })
  .strict()
  .meta({ id: 'VolumeMountRequest' });

export const InstanceVolume = z
  .object({
    name: z.string().nullable().describe('the volume; null: an empty, read-only directory in the place of a volume its source had (a fork made with `volumes: "none"`, or from a template)'),
    path: z.string(),
    read_only: z.boolean(),
  })
  .meta({ id: 'InstanceVolume' });
