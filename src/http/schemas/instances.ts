import { z } from 'zod';
import { Env, Metadata } from './common.js';
import { InstanceVolume, VolumeMountRequest } from './volumes.js';
import { InstanceSecret, SecretUseRequest } from './secrets.js';

/** Instances on the Firecase-style face: snake_case in and out. */

export const IdleTimeout = z
  .number()
  .int()
  .min(0)
  .max(30 * 86400)
  .describe('seconds without activity (no call, no attached client) after which the instance hibernates by itself, its memory kept; any later call wakes it. 0: never');

export const LimitsRequest = z
  .object({
    memory_mb: z.number().int().min(32).max(256 * 1024).optional().describe('memory, page cache included (no swap); default 1024'),
    pids: z.number().int().min(16).max(1 << 20).optional().describe('processes and threads; default 512'),
    cpu_percent: z.number().int().min(1).max(6400).optional().describe('CPU quota, 100 = one core; default 100'),
    disk_mb: z
      .number()
      .int()
      .min(64)
      .max(16 << 20)
      .optional()
      .describe('everything the instance writes, its checkpoints\' changes included (a filesystem of its own); default: the server\'s, none unless configured'),
  })
  .strict()
  .meta({ id: 'LimitsRequest' });

const PolicyEntry = z.string().min(1).max(253).describe('an IPv4 address, a CIDR, a host name, or *.domain for its subdomains');

export const NetworkPolicy = z
  .object({
    egress: z.enum(['allow', 'deny']).default('allow').describe('`allow`: public addresses are reachable; `deny`: only what `allow` lists'),
    allow: z.array(PolicyEntry).max(256).default([]).describe('opened whatever `egress` says, private ranges included (a host name: the addresses its DNS answers give)'),
    deny: z.array(PolicyEntry).max(256).default([]).describe('closed whatever `allow` says'),
  })
  .strict()
  .meta({
    id: 'NetworkPolicy',
    description:
      'Where the instance may open connections to, enforced by the host\'s firewall (root inside cannot change it). Whatever the policy, the host itself (but its DNS), other instances (unless allowed) and link-local metadata addresses are never reachable; private ranges (RFC 1918, 100.64.0.0/10) only when allowed.',
    examples: [{ egress: 'deny', allow: ['registry.npmjs.org', '10.1.2.0/24'], deny: [] }],
  });

export const CreateInstanceRequest = z
  .object({
    name: z.string().max(63).optional().describe('hostname-safe: lowercase letters, digits, hyphens; defaults to the id'),
    image: z.string().max(512).optional().describe('an image name (system or built), or a registry reference (`python:3.12-slim`, `registry.example/team/app@sha256:…`: pulled first if it is not yet); defaults to the server\'s default'),
    template: z.string().max(63).optional().describe('a template: the instance is restored from its checkpoint, its start command already running (instead of `image`)'),
    env: Env.optional(),
    limits: LimitsRequest.optional(),
    metadata: Metadata.optional(),
    max_checkpoints: z.number().int().min(1).max(1000).optional().describe('defaults to the server\'s (10)'),
    idle_timeout_s: IdleTimeout.optional(),
    network: NetworkPolicy.optional(),
    user_namespace: z
      .boolean()
      .optional()
      .describe("run in a user namespace of its own, its ids 0..65535 a range of host ids no other sandbox and no host account has (default: the server's FORKPOINT_USER_NAMESPACES, on unless configured off). false: the host's ids, weaker, for images that need them"),
    volumes: z
      .array(VolumeMountRequest)
      .max(16)
      .optional()
      .describe('persistent volumes to mount (POST /volumes makes them): shared with the other instances that mount them, never part of a checkpoint, kept when the instance is deleted'),
    secrets: z
      .array(SecretUseRequest)
      .max(16)
      .optional()
      .describe('secrets (PUT /secrets/{name} keeps them) its requests to the named hosts carry: its commands see a placeholder in the variable, and the egress proxy puts the value in its place in those requests\' headers (HTTPS through a CA of the instance\'s own, which its image\'s trust store is given)'),
  })
  .strict()
  .meta({ id: 'CreateInstanceRequest', examples: [{ name: 'demo', env: { GREETING: 'hello' }, limits: { memory_mb: 512, disk_mb: 2048 } }] });

export const UpdateInstanceRequest = z
  .object({
    name: z.string().max(63).optional().describe('the hostname from the next boot or fork on'),
    metadata: Metadata.optional().describe('replaces the metadata'),
    idle_timeout_s: IdleTimeout.nullable().optional().describe('seconds without activity before it hibernates by itself; 0 or null: never'),
    network: NetworkPolicy.optional().describe('replaces the egress policy; in force at once for new connections'),
  })
  .strict()
  .meta({ id: 'UpdateInstanceRequest', examples: [{ name: 'renamed', metadata: { stage: 'review' } }] });

export const Limits = z
  .object({
    memory_mb: z.number().int(),
    pids: z.number().int(),
    cpu_percent: z.number().int(),
    disk_mb: z.number().int().nullable().describe('null: no disk limit'),
  })
  .meta({ id: 'Limits' });

export const NodeList = z
  .object({
    nodes: z.array(
      z
        .object({
          id: z.string(),
          url: z.string().describe('where the other nodes reach it'),
          started_at: z.string(),
          heartbeat_at: z.string(),
          live: z.boolean().describe('heard from within FORKPOINT_NODE_DEAD_AFTER_S'),
          load: z.number().int().describe('instances running on it'),
          self: z.boolean().describe('the node that answered'),
          draining: z.boolean().describe('being drained: sent no new instances, its instances handed over'),
        })
        .meta({ id: 'Node' }),
    ),
  })
  .meta({ id: 'NodeList' });

export const DrainResult = z
  .object({
    handed_over: z.array(z.string()).describe('instances now taken over by the other nodes from a durable checkpoint of the moment'),
    kept: z.array(z.string()).describe('instances left on this node (re-adopted at its next start)'),
    reason: z.enum(['NO_OBJECT_STORE', 'NO_OTHER_NODE']).nullable().describe('why none could be handed over'),
  })
  .meta({ id: 'DrainResult' });

export const Instance = z
  .object({
    id: z.string(),
    name: z.string(),
    image: z.string(),
    status: z
      .enum(['starting', 'running', 'hibernated', 'stopped', 'error', 'lost'])
      .describe('`hibernated`: its memory and processes are in an image and its RAM is freed; any call on it wakes it. `lost`: its node stopped answering; `POST /instances/{id}/recover` brings it back on another node from its newest durable checkpoint'),
    env: z.record(z.string(), z.string()),
    limits: Limits,
    metadata: z.record(z.string(), z.string()),
    max_checkpoints: z.number().int().nullable(),
    idle_timeout_s: z.number().int().nullable().describe('seconds without activity before it hibernates by itself; null: never'),
    network: z
      .object({
        address: z.string().nullable().describe('its IPv4 address (kept through rollbacks and wakes; a fork gets its own)'),
        egress: z.enum(['allow', 'deny']),
        allow: z.array(z.string()),
        deny: z.array(z.string()),
        sent_bytes: z.number().int().nullable().describe("since its node's server started; null in a list answered by another node (GET the instance: its node answers)"),
        received_bytes: z.number().int().nullable(),
      })
      .meta({ id: 'InstanceNetwork' }),
    head_checkpoint_id: z.string().nullable().describe('the checkpoint the instance stands on (its latest, or the one rolled back to)'),
    source_instance_id: z.string().nullable().describe('for a fork: the instance it was forked from'),
    source_checkpoint_id: z.string().nullable().describe('for a fork: the checkpoint it was forked from'),
    warm_fork: z.boolean().describe('it took a sandbox made ahead (restored from its checkpoint for a fork, booted from its image for a create) instead of being restored or booted on the call'),
    error: z.string().nullable().describe('why the instance is in `error`, or why a `stopped` one stopped when nothing asked it to (its sandbox ended on its own); null once it runs again'),
    node: z.string().nullable().describe('the node its disk and processes are on (any node answers calls for it)'),
    user_namespace: z.boolean().describe("its processes run in a user namespace of their own (root inside is an unprivileged range of host ids); false: as the host's ids"),
    volumes: z.array(InstanceVolume).describe('the persistent volumes it mounts'),
    secrets: z.array(InstanceSecret).describe('the secrets its requests to those hosts carry (their values never reach the sandbox)'),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .meta({
    id: 'Instance',
    examples: [
      {
        id: 'inst_0123456789abcdef',
        name: 'demo',
        image: 'default',
        status: 'running',
        env: { GREETING: 'hello' },
        limits: { memory_mb: 1024, pids: 512, cpu_percent: 100, disk_mb: null },
        metadata: {},
        max_checkpoints: null,
        idle_timeout_s: null,
        network: { address: '10.88.0.2', egress: 'allow', allow: [], deny: [], sent_bytes: 0, received_bytes: 0 },
        head_checkpoint_id: null,
        source_instance_id: null,
        source_checkpoint_id: null,
        warm_fork: false,
        error: null,
        node: 'node-3f2a9c1e7b4d',
        user_namespace: true,
        volumes: [{ name: 'workspace', path: '/workspace', read_only: false }],
        secrets: [{ name: 'OPENAI_API_KEY', env: 'OPENAI_API_KEY', hosts: ['api.openai.com'] }],
        created_at: '2026-11-22T08:00:00.000Z',
        updated_at: '2026-11-22T08:00:00.000Z',
      },
    ],
  });

export const InstancePage = z
  .object({ items: z.array(Instance), next_cursor: z.string().nullable().describe('pass as `cursor` for the next page; null on the last') })
  .meta({ id: 'InstancePage' });

export const InstanceUsage = z
  .object({
    at: z.string().describe('when it was read'),
    cpu_count: z.number().int().describe('CPUs its limit allows'),
    cpu_used_percent: z.number().describe('of those CPUs, over the 250 ms the reading takes'),
    memory_bytes: z.number().int(),
    memory_limit_bytes: z.number().int(),
    disk_bytes: z.number().int().describe('what it wrote on top of its image and checkpoints'),
    disk_total_bytes: z.number().int().describe('its disk limit, or with none what it wrote and the room left on the node'),
  })
  .meta({ id: 'InstanceUsage', examples: [{ at: '2026-11-22T08:00:00.000Z', cpu_count: 1, cpu_used_percent: 12.5, memory_bytes: 41943040, memory_limit_bytes: 1073741824, disk_bytes: 5242880, disk_total_bytes: 53687091200 }] });
