import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { AS_ROOT } from '../../core/users.js';
import { NotFoundError } from '../../core/errors.js';
import type { CreateInstance } from '../../core/instances.js';
import type { EgressPolicy } from '../../lib/egress-policy.js';
import type { ExpiryAction, InstanceRecord } from '../../store/instances.js';
import type { TemplateRecord } from '../../store/templates.js';
import { E2B_HOME, ENVD_VERSION } from './caller.js';

/** E2B's API: camelCase as its spec has it (`allow_internet_access` is its one snake). */
const Metadata = z.record(z.string().max(256), z.string().max(4096));
const NewSandbox = z
  .object({
    templateID: z.string().min(1).max(128),
    timeout: z.number().int().min(0).max(30 * 86400).optional(),
    autoPause: z.boolean().optional(),
    autoPauseMemory: z.boolean().optional(),
    metadata: Metadata.optional(),
    envVars: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()).optional(),
    allow_internet_access: z.boolean().optional(),
    network: z.object({ allowOut: z.array(z.string()).optional(), denyOut: z.array(z.string()).optional() }).passthrough().optional(),
    // E2B's volume mounts, by the volume's name: forkpoint's volumes (POST /volumes).
    volumeMounts: z.array(z.object({ name: z.string().min(1).max(63), path: z.string().min(1).max(255) })).max(16).optional(),
  })
  .passthrough();
const IdParams = z.object({ sandboxID: z.string().min(1).max(64) });
const MetricsRange = z.object({ start: z.coerce.number().int().min(0).optional(), end: z.coerce.number().int().min(0).optional() });
/** E2B's metrics come in 5-second buckets, its range in whole seconds. */
const METRICS_SLACK_S = 5;
/** E2B's network update: it replaces the whole egress configuration. Its proxy and per-domain
 * transform rules are not served here. */
const NetworkUpdate = z
  .object({
    allow_internet_access: z.boolean().optional(),
    allowOut: z.array(z.string().max(256)).max(1000).optional(),
    denyOut: z.array(z.string().max(256)).max(1000).optional(),
    egressProxy: z.unknown().optional(),
    rules: z.unknown().optional(),
  })
  .passthrough();

/** E2B's egress settings as forkpoint's policy: no internet (or a deny of 0.0.0.0/0) is a
 * default of deny with `allowOut` let through; otherwise a default of allow with `denyOut` kept
 * out, and `allowOut` winning over it. */
function egressOf(internet: boolean | undefined, allowOut: string[] | undefined, denyOut: string[] | undefined): EgressPolicy {
  return internet === false || denyOut?.includes('0.0.0.0/0')
    ? { egress: 'deny', allow: allowOut ?? [], deny: [] }
    : { egress: 'allow', allow: allowOut ?? [], deny: denyOut ?? [] };
}
const Timeout = z.object({ timeout: z.number().int().min(0).max(30 * 86400) });
const ListQuery = z.object({
  metadata: z.string().max(4096).optional(),
  state: z.string().max(64).optional(),
  /** By start time; newest first unless `asc`. */
  order: z.enum(['asc', 'desc']).optional(),
  startedAfter: z.string().datetime({ offset: true }).optional(),
  /** A template's id or alias. */
  template: z.string().max(128).optional(),
  limit: z.coerce.number().int().min(1).max(1000).default(100),
  nextToken: z.string().max(128).optional(),
});
const DEFAULT_TIMEOUT_S = 15;
/** Where a sandbox's own processes find its variables (images/code-interpreter/kernel.py reads it). */
const SANDBOX_ENVS = '/run/e2b/envs.json';
const hidden = { hide: true };

/** E2B's error: `{code, message}`, the code being the HTTP status. */
export function e2bError(reply: FastifyReply, status: number, message: string): FastifyReply {
  return reply.code(status).send({ code: status, message });
}

/**
 * E2B's control plane (`/sandboxes`, `/v2/sandboxes`, snapshots), so that the published `e2b`
 * SDK runs against forkpoint with `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY` only. A
 * sandbox is an instance; its timeout an instance lifetime; pause is hibernate (memory kept);
 * a snapshot is a template (a memory checkpoint).
 */
export const e2bControlRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const aliases: Record<string, string> = {
      // E2B's `base` has curl, python3, git, procps, sudo and the like: the Debian image.
      base: 'debian',
      'code-interpreter-v1': 'code-interpreter',
      ...(JSON.parse(fp.config.e2bTemplates) as Record<string, string>),
    };

    /** The sandbox as E2B answers it, with its access token made for the API token that asked
     * (revoking that token revokes it). */
    const sandbox = (r: InstanceRecord, by: FastifyRequest) => ({
      templateID: r.imageRef ?? r.image,
      sandboxID: r.id,
      alias: r.imageRef ?? r.image,
      clientID: 'forkpoint',
      envdVersion: ENVD_VERSION,
      envdAccessToken: by.credential?.kind === 'owner' ? fp.credentials.accessTokenFor(by.credential, r.id) : null,
      trafficAccessToken: by.credential?.kind === 'owner' ? fp.credentials.trafficTokenFor(by.credential, r.id) : null,
      domain: null,
    });
    const detail = (r: InstanceRecord, by: FastifyRequest) => ({
      ...sandbox(r, by),
      startedAt: r.createdAt,
      endAt: r.expiresAt ?? new Date(Date.parse(r.createdAt) + 86400_000 * 365).toISOString(),
      cpuCount: Math.max(1, Math.round(r.limits.cpuPercent / 100)),
      memoryMB: r.limits.memoryMb,
      diskSizeMB: r.limits.diskMb ?? 0,
      metadata: r.metadata,
      // E2B has no stopped sandboxes: a files-only pause (or a stop on another face) is a pause.
      state: r.status === 'hibernated' || r.status === 'stopped' ? 'paused' : 'running',
      volumeMounts: r.volumes.flatMap((v) => (v.name === null ? [] : [{ name: v.name, path: v.path }])),
    });
    /** What a new sandbox's timeout ends in: with `autoPause`, a pause (files only when
     * `autoPauseMemory` is false, as `onTimeout: {action: 'pause', keepMemory: false}` says);
     * else its deletion. */
    const onTimeout = (b: { autoPause?: boolean | undefined; autoPauseMemory?: boolean | undefined }): ExpiryAction =>
      b.autoPause ? (b.autoPauseMemory === false ? 'stop' : 'hibernate') : 'delete';
    /** The sandbox's lifetime: `seconds` (or the default) from now, ending as `action` says (a
     * sandbox that never asked for one is deleted). */
    const lifetime = async (owner: string, id: string, seconds: number | undefined, action: ExpiryAction | null) =>
      await fp.instances.setExpiry(owner, id, new Date(Date.now() + (seconds ?? DEFAULT_TIMEOUT_S) * 1000), action ?? 'delete');
    /** E2B's commands start in its user's home: made once, for any image. */
    const home = async (owner: string, id: string) => {
      await fp.commands.exec(owner, id, { command: ['mkdir', '-p', E2B_HOME], user: AS_ROOT });
    };

    const create = async (owner: string, b: z.infer<typeof NewSandbox>): Promise<InstanceRecord> => {
      const name = aliases[b.templateID] ?? b.templateID;
      const input: CreateInstance = {
        env: b.envVars,
        metadata: b.metadata,
        egress: egressOf(b.allow_internet_access, b.network?.allowOut, b.network?.denyOut),
        volumes: b.volumeMounts?.map((m) => ({ name: m.name, path: m.path })),
      };
      // A template forkpoint ships is made for the owner the first time one is asked for.
      if (fp.bundled.has(name)) await fp.bundled.ensure(owner, name);
      const isTemplate = (await fp.templates.list(owner)).some((t) => t.name === name);
      let rec: InstanceRecord;
      try {
        rec = isTemplate ? await fp.templates.instantiate(owner, name, input) : await fp.instances.create(owner, { ...input, image: name });
      } catch (err) {
        if ((err as { code?: string }).code === 'INVALID_REQUEST' && /unknown image/.test((err as Error).message)) throw new NotFoundError('template', b.templateID);
        throw err;
      }
      await home(owner, rec.id);
      // The sandbox's variables where a process started before them (a template's code
      // interpreter, restored from its checkpoint) reads them, as E2B's reads envd's /envs.
      if (Object.keys(rec.env).length) await fp.files.write(owner, rec.id, SANDBOX_ENVS, Buffer.from(JSON.stringify(rec.env)), 0o600);
      return lifetime(owner, rec.id, b.timeout, onTimeout(b));
    };

    for (const path of ['/sandboxes', '/v2/sandboxes']) {
      app.post(path, { config: { placement: 'new' }, schema: { ...hidden, body: NewSandbox } }, async (req, reply) => reply.code(201).send(sandbox(await create(req.owner, req.body), req)));
    }

    app.get('/sandboxes', { schema: { ...hidden, querystring: ListQuery } }, async (req) => (await listed(req, req.query)).items.filter((r) => r.state === 'running'));

    app.get('/v2/sandboxes', { schema: { ...hidden, querystring: ListQuery } }, async (req, reply) => {
      const page = await listed(req, req.query);
      if (page.next) reply.header('x-next-token', page.next);
      return page.items;
    });

    /** The owner's instances as E2B lists them, filtered by metadata (`k=v&k2=v2`), state,
     * start time and template, newest first unless `order=asc`, a page at a time (the token is
     * the last id of the previous page). */
    async function listed(req: FastifyRequest, q: z.infer<typeof ListQuery>) {
      const owner = req.owner;
      const want = new URLSearchParams(q.metadata ?? '');
      const states = q.state ? q.state.split(',') : ['running', 'paused'];
      const after = q.startedAfter ? Date.parse(q.startedAfter) : undefined;
      const templates = q.template ? new Set([q.template, aliases[q.template] ?? q.template]) : undefined;
      const all = [] as ReturnType<typeof detail>[];
      let cursor: string | undefined;
      do {
        const page = await fp.instances.list(owner, 500, cursor);
        for (const r of page.items) {
          if (r.status !== 'running' && r.status !== 'hibernated' && r.status !== 'stopped') continue;
          if ([...want].some(([k, v]) => r.metadata[k] !== v)) continue;
          const d = detail(r, req);
          if (!states.includes(d.state)) continue;
          if (after !== undefined && Date.parse(d.startedAt) < after) continue;
          if (templates && !templates.has(d.templateID)) continue;
          all.push(d);
        }
        cursor = page.nextCursor ?? undefined;
      } while (cursor);
      all.sort((a, b) => (Date.parse(b.startedAt) - Date.parse(a.startedAt)) * (q.order === 'asc' ? -1 : 1));
      const start = q.nextToken ? all.findIndex((d) => d.sandboxID === q.nextToken) + 1 : 0;
      const items = all.slice(start, start + q.limit);
      return { items, next: start + q.limit < all.length ? items.at(-1)?.sandboxID : undefined };
    }

    app.get('/sandboxes/:sandboxID', { schema: { ...hidden, params: IdParams } }, async (req) => detail(await fp.instances.get(req.owner, req.params.sandboxID), req));

    app.delete('/sandboxes/:sandboxID', { schema: { ...hidden, params: IdParams } }, async (req, reply) => {
      await fp.deleteInstance(req.owner, req.params.sandboxID);
      return reply.code(204).send();
    });

    app.post('/sandboxes/:sandboxID/timeout', { schema: { ...hidden, params: IdParams, body: Timeout } }, async (req, reply) => {
      const r = await fp.instances.get(req.owner, req.params.sandboxID);
      await lifetime(req.owner, r.id, req.body.timeout, r.onExpiry);
      return reply.code(204).send();
    });

    app.post('/sandboxes/:sandboxID/pause', { schema: { ...hidden, params: IdParams, body: z.object({ memory: z.boolean().optional() }).passthrough().optional() } }, async (req, reply) => {
      const r = await fp.instances.get(req.owner, req.params.sandboxID);
      if (r.status === 'hibernated' || r.status === 'stopped') return e2bError(reply, 409, `sandbox ${r.id} is already paused`);
      // `keepMemory: false`: a files-only pause, the sandbox stopped; resuming boots it on its files.
      if (req.body?.memory === false) await fp.instances.stop(req.owner, r.id);
      else await fp.instances.hibernate(req.owner, r.id);
      await fp.instances.setExpiry(req.owner, r.id, null);
      return reply.code(204).send();
    });

    /** A paused sandbox, woken, lives `timeout` (or the default) from now. E2B's connect never
     * shortens a running one's life (its SDK says so): it lives to the later of its end and
     * `timeout` from now, and one that never ends (made on another face) still does not. */
    const resume = async (req: FastifyRequest, id: string, timeout: number | undefined, reply: FastifyReply) => {
      const owner = req.owner;
      const before = await fp.instances.get(owner, id);
      const woken = before.status === 'hibernated' || before.status === 'stopped';
      let r = before.status === 'hibernated' ? await fp.instances.wake(owner, id) : before.status === 'stopped' ? await fp.instances.start(owner, id) : before;
      const longer = timeout !== undefined && before.expiresAt !== null && Date.now() + timeout * 1000 > Date.parse(before.expiresAt);
      if (woken || longer) r = await lifetime(owner, id, timeout, before.onExpiry);
      return reply.code(woken ? 201 : 200).send(sandbox(r, req));
    };
    for (const path of ['/sandboxes/:sandboxID/connect', '/v2/sandboxes/:sandboxID/connect']) {
      app.post(path, { schema: { ...hidden, params: IdParams, body: Timeout.partial().passthrough().optional() } }, async (req, reply) => resume(req, req.params.sandboxID, req.body?.timeout, reply));
    }
    app.post('/sandboxes/:sandboxID/resume', { schema: { ...hidden, params: IdParams, body: Timeout.partial().passthrough() } }, async (req, reply) => resume(req, req.params.sandboxID, req.body?.timeout, reply));

    app.post('/sandboxes/:sandboxID/snapshots', { schema: { ...hidden, params: IdParams, body: z.object({ name: z.string().max(63).optional() }).passthrough().optional() } }, async (req, reply) => {
      const id = req.params.sandboxID;
      await fp.instances.get(req.owner, id);
      const made = await fp.checkpoints.create(req.owner, id, { label: 'e2b snapshot', memory: true, retention: { mode: 'delete_oldest' } });
      await made.done;
      const c = await fp.checkpoints.get(req.owner, id, made.checkpoint.id);
      // The engine could not make it (the sandbox runs on as it was): a 503 to try again, not a
      // server error.
      if (c.status !== 'ready') return e2bError(reply, 503, `the snapshot failed: ${c.error ?? 'no reason given'}`);
      const name = req.body?.name ?? `snap-${c.id.replace(/^ckpt_/, '')}`;
      const t = await fp.templates.create(req.owner, { name, fromCheckpoint: c.id });
      return reply.code(201).send({ snapshotID: t.name, names: [t.name] });
    });

    const SnapshotQuery = z.object({
      sandboxID: z.string().max(128).optional(),
      name: z.string().max(128).optional(),
      limit: z.coerce.number().int().min(1).max(1000).default(100),
      nextToken: z.string().max(128).optional(),
    }).passthrough();
    /** The sandbox a snapshot was taken of: its checkpoint's, while that checkpoint is kept. */
    const sandboxOf = async (owner: string, t: TemplateRecord) => {
      const checkpointId = t.source.startsWith('checkpoint:') ? t.source.slice('checkpoint:'.length) : undefined;
      return checkpointId ? (await fp.checkpoints.find(owner, checkpointId).catch(() => undefined))?.instanceId : undefined;
    };
    app.get('/snapshots', { schema: { ...hidden, querystring: SnapshotQuery } }, async (req, reply) => {
      const q = req.query;
      let snaps = (await fp.templates.list(req.owner)).filter((t) => t.status === 'ready' && (q.name === undefined || t.name === q.name));
      if (q.sandboxID !== undefined) {
        const of = await Promise.all(snaps.map((t) => sandboxOf(req.owner, t)));
        snaps = snaps.filter((_, i) => of[i] === q.sandboxID);
      }
      const start = q.nextToken ? snaps.findIndex((t) => t.name === q.nextToken) + 1 : 0;
      const page = snaps.slice(start, start + q.limit);
      if (start + q.limit < snaps.length && page.length) reply.header('x-next-token', page.at(-1)!.name);
      return page.map((t) => ({ snapshotID: t.name, names: [t.name] }));
    });

    app.post('/sandboxes/:sandboxID/fork', { schema: { ...hidden, params: IdParams, body: z.object({ timeout: z.number().int().min(0).optional(), count: z.number().int().min(1).max(100).optional() }).optional() } }, async (req, reply) => {
      const forks = await fp.checkpoints.fork(req.owner, req.params.sandboxID, { count: req.body?.count ?? 1 });
      const lived = await Promise.all(forks.map((f) => lifetime(req.owner, f.id, req.body?.timeout, 'delete')));
      return reply.code(201).send(lived.map((r) => ({ sandbox: sandbox(r, req) })));
    });

    app.put('/sandboxes/:sandboxID/network', { schema: { ...hidden, params: IdParams, body: NetworkUpdate } }, async (req, reply) => {
      const b = req.body;
      if (b.egressProxy != null || b.rules !== undefined) return e2bError(reply, 400, 'egress proxies and transform rules are not supported by forkpoint');
      await fp.instances.setEgress(req.owner, req.params.sandboxID, egressOf(b.allow_internet_access, b.allowOut, b.denyOut));
      return reply.code(204).send();
    });

    // One reading, now (E2B keeps a series), if now is in the range asked (unix seconds, E2B's
    // buckets' slack either side); none while the sandbox does not run.
    app.get('/sandboxes/:sandboxID/metrics', { schema: { ...hidden, params: IdParams, querystring: MetricsRange } }, async (req) => {
      const u = await fp.instances.usage(req.owner, req.params.sandboxID);
      if (!u) return [];
      const at = u.at.getTime() / 1000;
      const { start, end } = req.query;
      if ((start !== undefined && at < start - METRICS_SLACK_S) || (end !== undefined && at > end + METRICS_SLACK_S)) return [];
      return [{
        timestamp: u.at.toISOString(),
        timestampUnix: Math.floor(u.at.getTime() / 1000),
        cpuCount: u.cpuCount,
        cpuUsedPct: Math.round(u.cpuUsedPercent * 100) / 100,
        memUsed: u.memoryBytes,
        memTotal: u.memoryLimitBytes,
        memCache: 0,
        diskUsed: u.diskBytes,
        diskTotal: u.diskTotalBytes,
      }];
    });
  };
