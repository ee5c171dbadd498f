import type { Logger } from 'pino';
import { IMAGE_NAME } from '../seam/runtime.js';
import type { Store } from '../store/index.js';
import type { InstanceRecord } from '../store/instances.js';
import { templateOwner, type TemplateRecord } from '../store/templates.js';
import type { CheckpointService } from './checkpoints.js';
import type { CommandService } from './commands.js';
import type { ExecutionService } from './executions.js';
import { ConflictError, ForkpointError, InvalidRequestError, NotFoundError, UnavailableError } from './errors.js';
import type { ImageCatalog, ResolvedImage } from './images.js';
import type { CreateInstance, InstanceService } from './instances.js';

export interface CreateTemplate {
  name: string;
  fromImage?: string | undefined;
  fromCheckpoint?: string | undefined;
  /** Started in the background before the template's checkpoint: it is running in every
   * instance made from the template. */
  startCommand?: string | undefined;
  /** Run until it exits 0 (or the deadline) before the checkpoint: the start command is ready. */
  readyCommand?: string | undefined;
  readyTimeoutS?: number | undefined;
}

const READY_POLL_MS = 100;

/**
 * Templates: a memory checkpoint of a hidden instance, made from an image or a checkpoint with
 * a start command running. An instance made from a template is restored from it, so what was
 * running (a server, a language server, a kernel) is up from its first call, in a fork's time.
 */
export class TemplateService {
  constructor(
    private readonly store: Store,
    private readonly instances: InstanceService,
    private readonly checkpoints: CheckpointService,
    private readonly commands: CommandService,
    private readonly executions: ExecutionService,
    private readonly catalog: ImageCatalog,
    private readonly log: Logger,
  ) {}

  async get(owner: string, name: string): Promise<TemplateRecord> {
    const t = await this.store.templates.get(owner, name);
    if (!t) throw new NotFoundError('template', name);
    return t;
  }

  list(owner: string): Promise<TemplateRecord[]> {
    return this.store.templates.list(owner);
  }

  /** The files a template stands on, for a build FROM it. */
  async filesOf(owner: string, name: string): Promise<ResolvedImage | undefined> {
    const t = await this.store.templates.get(owner, name);
    if (!t || t.status !== 'ready' || !t.checkpointId) return undefined;
    const c = await this.store.checkpoints.get(t.checkpointId);
    const inst = t.instanceId ? await this.store.instances.get(t.instanceId) : undefined;
    if (!c || !inst || c.baseLayer) return undefined;
    return { ref: null, base: c.image, layers: c.layers, config: { ...this.catalog.emptyConfig, env: inst.env, workdir: inst.workdir, user: inst.defaultUser, volumes: inst.imageVolumes }, key: `template:${c.id}` };
  }

  async create(owner: string, input: CreateTemplate): Promise<TemplateRecord> {
    if (!IMAGE_NAME.test(input.name)) throw new InvalidRequestError('a template name is 1-63 lowercase letters, digits, dots, dashes or underscores', { name: input.name });
    if (!input.fromImage === !input.fromCheckpoint) throw new InvalidRequestError('give one of from_image and from_checkpoint');
    if (await this.store.templates.get(owner, input.name)) throw new ConflictError(`template ${input.name} exists`, { template: input.name });
    const hidden = templateOwner(owner);
    // Checked before anything is made: a bad source is a 400 with nothing to clean up.
    const image = input.fromImage ? await this.catalog.resolve(owner, input.fromImage) : undefined;
    const source = input.fromCheckpoint ? await this.checkpoints.find(owner, input.fromCheckpoint) : undefined;
    const t: TemplateRecord = {
      owner,
      name: input.name,
      instanceId: null,
      checkpointId: null,
      source: image ? `image:${input.fromImage}` : `checkpoint:${input.fromCheckpoint}`,
      startCommand: input.startCommand ?? (image?.config.cmd || image?.config.entrypoint ? [...(image.config.entrypoint ?? []), ...(image.config.cmd ?? [])].join(' ') : null),
      status: 'building',
      error: null,
      createdAt: new Date().toISOString(),
    };
    await this.store.templates.insert(t);
    let inst: InstanceRecord | undefined;
    try {
      inst = image
        ? await this.instances.create(hidden, { name: `template-${input.name.replace(/[^a-z0-9-]/g, '-')}`.slice(0, 63).replace(/-+$/, '') }, image)
        : (await this.checkpoints.fork(owner, source!.instanceId, { checkpointId: source!.id }, { owner: hidden, create: {} }))[0]!;
      await this.store.templates.update(owner, input.name, { instanceId: inst.id });
      const start = input.startCommand ? ['/bin/sh', '-c', input.startCommand] : [...(image?.config.entrypoint ?? []), ...(image?.config.cmd ?? [])];
      if (start.length > 0) await this.executions.start(hidden, inst.id, { kind: 'exec', argv: start, detached: true });
      if (input.readyCommand) await this.waitReady(hidden, inst.id, input.readyCommand, (input.readyTimeoutS ?? 60) * 1000);
      const { checkpoint, done } = await this.checkpoints.create(hidden, inst.id, { label: `template ${input.name}`, memory: true });
      await done;
      const c = (await this.store.checkpoints.get(checkpoint.id))!;
      if (c.status !== 'ready') throw new UnavailableError(`the template's checkpoint failed: ${c.error ?? 'no reason given'}`);
      // Its memory is in the checkpoint: the hidden instance need not run, and holds no RAM.
      await this.instances.stop(hidden, inst.id);
      return this.store.templates.update(owner, input.name, { checkpointId: c.id, status: 'ready' });
    } catch (err) {
      // Nothing of a failed template stays: no record, no hidden instance.
      if (inst) await this.instances.delete(hidden, inst.id, (id) => this.checkpoints.deleteAllOf(id)).catch((e: unknown) => this.log.warn({ err: e }, 'could not remove a failed template\'s instance'));
      await this.store.templates.delete(owner, input.name);
      throw err instanceof ForkpointError ? err : this.instances.engineFailure(err);
    }
  }

  private async waitReady(owner: string, id: string, command: string, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const r = await this.commands.exec(owner, id, { command, timeoutMs: Math.max(1000, deadline - Date.now()) });
      if (r.exitCode === 0) return;
      if (Date.now() >= deadline) {
        throw new ConflictError(`the ready command did not succeed within ${Math.round(timeoutMs / 1000)} s (last exit code ${r.exitCode})`, { ready_command: command });
      }
      await new Promise((res) => setTimeout(res, READY_POLL_MS));
    }
  }

  /** After a restart: a template the stop caught being made is dropped, with its instance. */
  async recover(): Promise<void> {
    for (const t of await this.store.templates.all()) {
      if (t.status !== 'building') continue;
      const inst = t.instanceId ? await this.store.instances.get(t.instanceId) : undefined;
      if (inst && !this.instances.isLocal(inst)) continue; // being made on another node
      if (t.instanceId && inst) {
        await this.instances.delete(templateOwner(t.owner), t.instanceId, (id) => this.checkpoints.deleteAllOf(id)).catch((err: unknown) => this.log.warn({ err }, 'could not remove a cut-short template\'s instance'));
      }
      await this.store.templates.delete(t.owner, t.name);
    }
  }

  /** A new instance restored from the template's checkpoint: what ran then runs now. */
  async instantiate(owner: string, name: string, input: CreateInstance): Promise<InstanceRecord> {
    const t = await this.get(owner, name);
    if (t.status !== 'ready' || !t.instanceId || !t.checkpointId) throw new ConflictError(`template ${name} is ${t.status}`, { template: name });
    // Its memory image fixes the mounts it is restored with: none can be added.
    if (input.volumes?.length) throw new InvalidRequestError('an instance made from a template mounts no volumes (the template\'s memory image fixes its mounts); make it from an image to mount them', { template: name });
    // Its processes were started without the placeholders and trust no CA of the instance's.
    if (input.secrets?.length) throw new InvalidRequestError('an instance made from a template uses no secrets (its processes run already, without them); make it from an image to use them', { template: name });
    const [rec] = await this.checkpoints.fork(templateOwner(owner), t.instanceId, { checkpointId: t.checkpointId }, { owner, create: input, warm: true });
    return this.store.instances.update(rec!.id, { imageRef: name });
  }

  async delete(owner: string, name: string): Promise<void> {
    const t = await this.get(owner, name);
    if (t.status === 'building') throw new ConflictError(`template ${name} is being made`, { template: name });
    if (t.instanceId && (await this.store.instances.get(t.instanceId))) {
      await this.instances.delete(templateOwner(owner), t.instanceId, (id) => this.checkpoints.deleteAllOf(id));
    }
    await this.store.templates.delete(owner, name);
  }
}
