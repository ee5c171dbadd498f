import { createHash, randomBytes } from 'node:crypto';
import { posix } from 'node:path';
import type { Readable } from 'node:stream';
import type { Logger } from 'pino';
import { IMAGE_NAME } from '../../seam/runtime.js';
import type { Store } from '../../store/index.js';
import { cacheHolder, type ImageConfig } from '../../store/images.js';
import { BuildStepError, DockerfileError, InvalidRequestError } from '../errors.js';
import type { ExecutionService } from '../executions.js';
import type { FileService } from '../files.js';
import type { ImageCatalog, ImageView, ResolvedImage } from '../images.js';
import type { InstanceService } from '../instances.js';
import { BuildContext, type ContextBounds } from './context.js';
import { parseDockerfile } from './dockerfile.js';
import { manifestPlan, type ImageManifest } from './manifest.js';
import type { BuildPlan, BuildStep } from './steps.js';
import { failpoint } from '../../lib/failpoints.js';
import { MAX_OWN_MOUNTS } from '../../lib/volume-path.js';
import { AS_ROOT } from '../users.js';

/** One line of a build's log: a step starting, cached or done, or what its command printed. */
export interface BuildLogLine {
  step: number;
  total: number;
  type: 'step' | 'cached' | 'output' | 'done';
  message: string;
}

export interface BuildRequest {
  name: string;
  plan: BuildPlan;
  context?: BuildContext | undefined;
  /** Memory of the sandbox the steps run in (default: the instances' default). */
  memoryMb?: number | undefined;
  /** Aborted when the one who asked is gone: the step running is killed and nothing is kept
   * but the steps already cached. */
  signal?: AbortSignal | undefined;
}

export interface DockerfileBuild {
  name: string;
  /** The Dockerfile's text; or its path in the context (default: Dockerfile). */
  dockerfile?: string | undefined;
  dockerfilePath?: string | undefined;
  /** A tar (gzip or not) of the build context. */
  contextTar?: Readable | undefined;
  /** Or a directory of the server's own (a bundled image's). */
  contextDir?: string | undefined;
  buildArgs?: Record<string, string> | undefined;
  memoryMb?: number | undefined;
  signal?: AbortSignal | undefined;
}


/** Resolves a FROM that is not an image: a template's files. */
export type FromResolver = (owner: string, name: string) => Promise<ResolvedImage | undefined>;

const STEP_TIMEOUT_MS = 30 * 60_000;
const STEP_KILL_MARGIN_MS = 30_000;
const OUTPUT_TAIL = 8192;
/** The longest line of a step's output the log carries whole. */
const MAX_LOG_LINE = 16 << 10;
/** Build sandboxes belong to an owner no token has: no one lists, execs in or deletes them. */
export const buildOwner = (owner: string) => `~build:${owner}`;

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
const sha = (...parts: string[]) => createHash('sha256').update(parts.join('\0')).digest('hex');

/** The sandbox a build runs its steps in, and the layers it stands on. */
interface Builder {
  id: string;
  layers: string[];
  running: boolean;
}

/**
 * Builds images on the engine itself: every step that changes files runs in a sandbox on the
 * layers so far, and what it wrote is frozen into a new layer. Each step's layers are cached by
 * a hash of the parent's key and the step (with the contents of what it copies), so an
 * unchanged build makes nothing, and a change rebuilds from the changed step on.
 */
export class BuildService {
  constructor(
    private readonly store: Store,
    private readonly catalog: ImageCatalog,
    private readonly instances: InstanceService,
    private readonly executions: ExecutionService,
    private readonly files: FileService,
    private readonly fromTemplate: FromResolver,
    private readonly contextsDir: string,
    private readonly contextBounds: ContextBounds,
    private readonly log: Logger,
  ) {}

  /**
   * Forgets cached steps not used since `before` (the owner's, or everyone's): their layers go
   * unless an image, an instance or a checkpoint stands on them. Answers how many went.
   */
  async prune(before: Date, owner?: string): Promise<number> {
    const stale = await this.store.images.staleCache(before.toISOString(), owner);
    for (const { owner: o, key } of stale) {
      await this.store.transaction(async (tx) => {
        await tx.layers.dropHolder(cacheHolder(o, key));
        await tx.images.dropCache(o, key);
      });
    }
    if (stale.length) await this.instances.collectLayers();
    return stale.length;
  }

  /** After a restart: the sandboxes of builds the stop cut short go (their finished steps
   * stay in the cache). */
  async recover(): Promise<void> {
    for (const rec of await this.store.instances.all()) {
      if (rec.owner.startsWith(buildOwner('')) && this.instances.isLocal(rec)) await this.instances.discard(rec.id);
    }
  }

  /**
   * Builds an OpenComputer image manifest as an image named by its cache key (the SDK's own:
   * the hash of its base and steps): the same manifest again is that image, built nothing.
   */
  async buildManifest(owner: string, manifest: ImageManifest, baseImage: string, onLog?: (l: BuildLogLine) => void, signal?: AbortSignal): Promise<{ image: ImageView; cached: boolean }> {
    const key = createHash('sha256').update(JSON.stringify({ base: manifest.base, steps: manifest.steps })).digest('hex');
    const name = `oc-${key.slice(0, 40)}`;
    if (await this.store.images.get(owner, name)) {
      onLog?.({ step: 0, total: 0, type: 'cached', message: `image ${name} is cached` });
      return { image: await this.catalog.get(owner, name), cached: true };
    }
    const base = manifest.base === 'base' ? baseImage : manifest.base;
    const image = await this.build(owner, { name, plan: manifestPlan(manifest, base), memoryMb: manifest.builderMemoryMB, signal }, onLog);
    return { image, cached: false };
  }

  /** Builds a Dockerfile: given as text (no context), or found in a context tar the client
   * sent (its `.dockerignore` applied to COPY). The context is gone when the build ends. */
  async buildDockerfile(owner: string, req: DockerfileBuild, onLog?: (l: BuildLogLine) => void): Promise<ImageView> {
    const context = req.contextTar ? await BuildContext.unpack(req.contextTar, this.contextsDir, this.contextBounds) : req.contextDir ? new BuildContext(req.contextDir) : undefined;
    try {
      const text = req.dockerfile ?? (await context!.readFile(req.dockerfilePath ?? 'Dockerfile', 1 << 20)).toString('utf8');
      const plan = parseDockerfile(text, req.buildArgs);
      return await this.build(owner, { name: req.name, plan, context, memoryMb: req.memoryMb, signal: req.signal }, onLog);
    } finally {
      if (req.contextTar) await context?.dispose();
    }
  }

  async build(owner: string, req: BuildRequest, onLog: (l: BuildLogLine) => void = () => {}): Promise<ImageView> {
    if (!IMAGE_NAME.test(req.name)) throw new InvalidRequestError('an image name is 1-63 lowercase letters, digits, dots, dashes or underscores', { name: req.name });
    if (this.catalog.isSystem(req.name)) throw new InvalidRequestError(`${req.name} is a system image; build under another name`, { name: req.name });
    const { plan } = req;
    const total = plan.steps.length;
    let from: ResolvedImage;
    try {
      from = (await this.fromTemplate(owner, plan.from)) ?? (await this.catalog.resolve(owner, plan.from));
    } catch {
      throw new DockerfileError(`FROM ${plan.from}: no such image or template`, plan.fromLine);
    }
    let state = { layers: from.layers, config: from.config, key: sha(owner, from.key) };
    let builder: Builder | undefined;
    const started = performance.now();
    try {
      for (const [i, step] of plan.steps.entries()) {
        stopIfCancelled(req.signal, step);
        const n = i + 1;
        onLog({ step: n, total, type: 'step', message: `Step ${n}/${total} : ${step.text}` });
        const roots = step.kind === 'copy' ? await this.roots(step, req.context) : [];
        const key = sha(state.key, step.text, step.kind === 'copy' ? await req.context!.hash(roots.flat()) : '');
        if (step.kind === 'config') {
          state = { ...state, config: step.apply(state.config), key };
          continue;
        }
        const config =
          step.kind === 'workdir' ? { ...state.config, workdir: posix.resolve(state.config.workdir ?? '/', step.path) }
          : step.kind === 'volume' ? { ...state.config, volumes: [...new Set([...(state.config.volumes ?? []), ...step.paths])].slice(0, MAX_OWN_MOUNTS) }
          : state.config;
        const hit = await this.store.images.cached(owner, key);
        if (hit) {
          onLog({ step: n, total, type: 'cached', message: ' ---> cached' });
          state = { layers: hit.layers, config, key };
          continue;
        }
        builder = await this.builderOn(owner, builder, from, state.layers, req.memoryMb);
        await this.runStep(owner, builder, step, state.config, roots, req.context, (message) => onLog({ step: n, total, type: 'output', message }), req.signal);
        failpoint('build.step-ran');
        builder.layers = await this.instances.commit(builder.id);
        builder.running = false;
        const layers = builder.layers;
        await this.store.transaction(async (tx) => {
          await tx.images.cache(owner, key, layers, config);
          await tx.layers.setRefs(cacheHolder(owner, key), layers);
        });
        state = { layers: builder.layers, config, key };
      }
      if (req.signal?.aborted) throw new BuildStepError(`the build was cancelled before its image was recorded: ${String(req.signal.reason)}`, { line: null, step: '', exit_code: null, output: '' });
      await this.catalog.put({ owner, name: req.name, base: from.base, layers: state.layers, config: state.config, buildKey: state.key, createdAt: new Date().toISOString() });
      this.log.info({ owner, image: req.name, steps: total, ms: Math.round(performance.now() - started) }, 'image built');
      onLog({ step: total, total, type: 'done', message: `Built ${req.name} in ${Math.round(performance.now() - started)} ms` });
      return this.catalog.get(owner, req.name);
    } finally {
      if (builder) await this.instances.discard(builder.id);
    }
  }

  /** The build sandbox on the given layers: the one there is if it stands on them (started if
   * needed), else a new one. */
  private async builderOn(owner: string, cur: Builder | undefined, from: ResolvedImage, layers: string[], memoryMb: number | undefined): Promise<Builder> {
    if (cur && cur.layers.join() === layers.join()) {
      if (!cur.running) await this.instances.start(buildOwner(owner), cur.id);
      cur.running = true;
      return cur;
    }
    if (cur) await this.instances.discard(cur.id);
    const image: ResolvedImage = { ...from, layers };
    const rec = await this.instances.create(buildOwner(owner), { ...(memoryMb ? { limits: { memoryMb } } : {}) }, image);
    return { id: rec.id, layers, running: true };
  }

  private async roots(step: Extract<BuildStep, { kind: 'copy' }>, context: BuildContext | undefined) {
    if (!context) throw new DockerfileError(`${step.text.split(' ')[0]} needs a build context, and this build has none`, step.line);
    return Promise.all(step.sources.map((s) => context.match(s, step.line)));
  }

  private async runStep(
    owner: string,
    b: Builder,
    step: BuildStep,
    config: ImageConfig,
    roots: Awaited<ReturnType<BuildContext['match']>>[],
    context: BuildContext | undefined,
    print: (line: string) => void,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    const cwd = config.workdir ?? '/';
    switch (step.kind) {
      case 'run':
        return this.command(owner, b, step, asUser(config.user, step.argv), { ...config.env, ...step.env }, cwd, print, signal);
      case 'workdir':
        return this.command(owner, b, step, ['mkdir', '-p', posix.resolve(cwd, step.path)], config.env, cwd, print, signal);
      case 'volume':
        return this.command(owner, b, step, ['mkdir', '-p', '--', ...step.paths], config.env, '/', print, signal);
      case 'download': {
        const dest = posix.resolve(cwd, step.dest.endsWith('/') ? step.dest + (posix.basename(new URL(step.url).pathname) || 'index.html') : step.dest);
        const script = `mkdir -p ${quote(posix.dirname(dest))} && (curl -fsSL -o ${quote(dest)} ${quote(step.url)} || wget -q -O ${quote(dest)} ${quote(step.url)})${step.chown ? ` && chown ${quote(step.chown)} ${quote(dest)}` : ''}`;
        return this.command(owner, b, step, ['/bin/sh', '-c', script], config.env, cwd, print, signal);
      }
      case 'write': {
        const dirs = [...new Set(step.files.map((f) => posix.dirname(f.path)))];
        await this.command(owner, b, step, ['mkdir', '-p', ...dirs], config.env, cwd, print, signal);
        for (const f of step.files) await this.files.write(buildOwner(owner), b.id, f.path, f.content);
        return;
      }
      case 'copy': {
        for (const root of roots.flat()) {
          const archive = `/tmp/.fp-copy-${randomBytes(6).toString('hex')}`;
          const isArchive = step.unpack && root.type === 'file' && /\.(tar|tar\.gz|tgz|tar\.xz|txz|tar\.bz2|tbz2)$/.test(root.rel);
          await this.upload(owner, b, archive, isArchive ? context!.raw(root) : await context!.pack(root));
          const dest = posix.resolve(cwd, step.dest) + (step.dest.endsWith('/') ? '/' : '');
          const chown = (path: string) => (step.chown ? ` && chown -R ${quote(step.chown)} ${path}` : '');
          let script: string;
          if (isArchive || root.type === 'dir') {
            script = `mkdir -p ${quote(dest)} && tar -x${isArchive ? '' : 'o'}f ${archive} -C ${quote(dest)}${chown(quote(dest))}`;
          } else {
            const name = posix.basename(root.rel);
            const target = dest.endsWith('/') ? dest + name : dest;
            script = `t=$(mktemp -d) && tar -xof ${archive} -C "$t" && mkdir -p ${quote(posix.dirname(target))} && mv -f "$t"/${quote(name)} ${quote(target)}${chown(quote(target))}; r=$?; rm -rf "$t"; exit $r`;
          }
          try {
            await this.command(owner, b, step, ['/bin/sh', '-c', script], config.env, '/', print, signal);
          } finally {
            await this.files.remove(buildOwner(owner), b.id, archive).catch(() => {});
          }
        }
        return;
      }
      case 'config':
        return;
    }
  }

  private async upload(owner: string, b: Builder, path: string, data: Readable): Promise<void> {
    await this.files.writeStream(buildOwner(owner), b.id, path, data as AsyncIterable<Buffer>);
  }

  /** Runs a step's command, its output printed line by line as it comes; fails with the line
   * and the end of the output unless it exits 0. */
  private async command(owner: string, b: Builder, step: BuildStep, argv: string[], env: Record<string, string>, cwd: string, print: (line: string) => void, signal: AbortSignal | undefined): Promise<void> {
    const o = buildOwner(owner);
    let tail = '';
    let partial = '';
    const emit = (text: string) => {
      tail = (tail + text).slice(-OUTPUT_TAIL);
      partial += text;
      const lines = partial.split('\n');
      partial = lines.pop()!;
      // A step that never prints a newline is logged in pieces, not kept whole in memory.
      while (partial.length > MAX_LOG_LINE) {
        lines.push(partial.slice(0, MAX_LOG_LINE));
        partial = partial.slice(MAX_LOG_LINE);
      }
      for (const l of lines) print(l);
    };
    const decoder = new TextDecoder();
    // The output is heard from the start on: all of it reaches the log, however fast it comes.
    // As root: the step's USER is asUser's to take (the builder's image may name another).
    const state = await this.executions.start(o, b.id, { kind: 'exec', argv, env, cwd, user: AS_ROOT, timeoutMs: STEP_TIMEOUT_MS, onOutput: (_stream, data) => emit(decoder.decode(data, { stream: true })) });
    // The step's own timeout kills it; the margin is for the kill to be seen.
    const deadline = AbortSignal.timeout(STEP_TIMEOUT_MS + STEP_KILL_MARGIN_MS);
    const final = await this.executions.wait(o, b.id, state.record.id, signal ? AbortSignal.any([deadline, signal]) : deadline).catch(() => undefined);
    if (signal?.aborted && (!final || final.running)) {
      // Its whole process group: the builder goes with the build (build's finally).
      await this.executions.signal(o, b.id, state.record.id, 9).catch(() => {});
      stopIfCancelled(signal, step);
    }
    emit(decoder.decode());
    if (partial) print(partial);
    const code = final && !final.running ? final.exitCode : null;
    if (code === 0) return;
    const why = final?.timedOut ? 'timed out' : code === null ? 'ended without an exit (the sandbox was lost)' : `exited with code ${code}`;
    throw new BuildStepError(`${step.line ? `line ${step.line}: ` : ''}${step.text.slice(0, 200)}: ${why}`, { line: step.line, step: step.text, exit_code: code, output: tail });
  }
}

/** A build whose asker is gone stops at its next step (or in the one running, killed). */
function stopIfCancelled(signal: AbortSignal | undefined, step: BuildStep): void {
  if (!signal?.aborted) return;
  const why = signal.reason instanceof Error ? signal.reason.message : String(signal.reason ?? 'aborted');
  throw new BuildStepError(`${step.line ? `line ${step.line}: ` : ''}${step.text.slice(0, 200)}: cancelled (${why})`, { line: step.line, step: step.text, exit_code: null, output: '' });
}

/** argv run as the image's USER (name or uid[:gid]); root needs nothing. */
function asUser(user: string | null, argv: string[]): string[] {
  if (!user || user === 'root' || user === '0' || user === '0:0') return argv;
  const [u, g] = user.split(':');
  const numeric = /^\d+$/.test(u!);
  return ['setpriv', `--reuid=${u}`, `--regid=${g ?? u}`, numeric ? '--clear-groups' : '--init-groups', '--', ...argv];
}

