import { z } from 'zod';

/** Images and templates on the Firecase-style face. */

export const ImageName = z.string().min(1).max(63).describe('an image name');
export const ImageNameParams = z.object({ name: ImageName });
/** An image as it may be asked for: a name, or a registry reference (`python:3.12-slim`; a `/` in
 * it sent as `%2F`). */
export const ImageRefParams = z.object({ name: z.string().min(1).max(512).describe('an image name or a registry reference (URL-encoded)') });

export const ImageConfig = z
  .object({
    env: z.record(z.string(), z.string()),
    workdir: z.string().nullable(),
    user: z.string().nullable(),
    cmd: z.array(z.string()).nullable(),
    entrypoint: z.array(z.string()).nullable(),
    labels: z.record(z.string(), z.string()),
    exposed_ports: z.array(z.number().int()),
    volumes: z.array(z.string()).describe('its VOLUMEs: paths of an instance\'s own disk, each a mount point of its own in the sandbox'),
  })
  .meta({ id: 'ImageConfig', description: 'What instances made from the image get: its environment, working directory and user (its commands\' default); its CMD/ENTRYPOINT as a template\'s start command.' });

export const Image = z
  .object({
    name: z.string(),
    kind: z.enum(['system', 'built', 'pulled']).describe('`system`: a rootfs every owner shares (set-up\'s, imported on the host); `built`: yours, layers on a system image; `pulled`: yours, from a registry'),
    base: z.string().nullable().describe('for a built image: the system image under its layers (null when its layers are all there is: built FROM a pulled image); for a pulled one: its manifest\'s digest'),
    layers: z.number().int(),
    config: ImageConfig,
    created_at: z.string(),
  })
  .meta({ id: 'Image', examples: [{ name: 'my-app', kind: 'built', base: 'debian', layers: 3, config: { env: { NODE_ENV: 'production' }, workdir: '/app', user: null, cmd: ['node', 'server.js'], entrypoint: null, labels: {}, exposed_ports: [3000], volumes: [] }, created_at: '2026-11-22T08:00:00.000Z' }] });

export const ImageList = z.object({ images: z.array(Image) }).meta({ id: 'ImageList' });

export const PullImageRequest = z
  .object({
    reference: z.string().min(1).max(512).describe('`[registry/]repository[:tag][@sha256:digest]`, as Docker takes it (Docker Hub when no registry is named)'),
    username: z.string().min(1).max(1024).optional().describe('for a registry that needs credentials: used for this pull, kept nowhere'),
    password: z.string().min(1).max(8192).optional(),
  })
  .strict()
  .refine((r) => (r.username === undefined) === (r.password === undefined), 'username and password go together')
  .meta({ id: 'PullImageRequest', examples: [{ reference: 'python:3.12-slim' }, { reference: 'registry.example/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', username: 'ci', password: 'secret' }] });

export const PulledImage = z
  .object({
    image: Image,
    digest: z.string().describe('the manifest\'s digest for this host\'s platform'),
    fetched_bytes: z.number().int().describe('what this pull fetched from the registry: 0 when every layer was here already'),
  })
  .meta({ id: 'PulledImage' });

export const BuildImageRequest = z
  .object({
    name: ImageName,
    dockerfile: z.string().min(1).max(1 << 20).describe('the Dockerfile\'s text (COPY needs a context: send one to /images/{name}/build)'),
    build_args: z.record(z.string(), z.string()).optional().describe('values for ARG'),
    memory_mb: z.number().int().min(64).max(256 * 1024).optional().describe('memory of the sandbox the steps run in'),
  })
  .strict()
  .meta({ id: 'BuildImageRequest', examples: [{ name: 'tools', dockerfile: 'FROM debian\nRUN apt-get update && apt-get install -y jq\nWORKDIR /work\n' }] });

export const BuildContextQuery = z
  .object({
    dockerfile: z.string().max(4096).optional().describe('the Dockerfile\'s path in the context; default Dockerfile'),
    build_args: z.string().max(65536).optional().describe('values for ARG, as a JSON object'),
    memory_mb: z.coerce.number().int().min(64).max(256 * 1024).optional().describe('memory of the sandbox the steps run in'),
  });

export const Template = z
  .object({
    name: z.string(),
    status: z.enum(['building', 'ready', 'failed']),
    source: z.string().describe('`image:<name>` or `checkpoint:<id>`'),
    start_command: z.string().nullable(),
    error: z.string().nullable(),
    created_at: z.string(),
  })
  .meta({ id: 'Template', examples: [{ name: 'web', status: 'ready', source: 'image:my-app', start_command: 'node server.js', error: null, created_at: '2026-11-22T08:00:00.000Z' }] });

export const TemplateList = z.object({ templates: z.array(Template) }).meta({ id: 'TemplateList' });

export const CreateTemplateRequest = z
  .object({
    name: ImageName,
    from_image: z.string().max(512).optional().describe('an image (system, built, or a registry reference, pulled) to boot'),
    from_checkpoint: z.string().max(64).optional().describe('or a checkpoint of yours to restore'),
    start_command: z.string().max(65536).optional().describe('started in the background before the template\'s checkpoint: running in every instance made from it; default: the image\'s CMD'),
    ready_command: z.string().max(65536).optional().describe('run until it exits 0 before the checkpoint (say, `curl -sf localhost:8080`)'),
    ready_timeout_s: z.number().int().min(1).max(3600).optional().describe('default 60'),
  })
  .strict()
  .meta({ id: 'CreateTemplateRequest', examples: [{ name: 'web', from_image: 'my-app', start_command: 'node server.js', ready_command: 'curl -sf localhost:3000' }] });

export const RegistryParams = z.object({ registry: z.string().min(1).max(255).describe('the registry: host or host:port (docker.io for Docker Hub)') });

export const RegistryLoginRequest = z
  .object({
    username: z.string().min(1).max(1024),
    password: z.string().min(1).max(8192).describe('kept sealed (AES-256-GCM, the key outside the store); never shown back'),
  })
  .strict()
  .meta({ id: 'RegistryLoginRequest', examples: [{ username: 'ci', password: 'a-registry-token' }] });

export const RegistryLogin = z
  .object({ registry: z.string(), username: z.string(), created_at: z.string() })
  .meta({ id: 'RegistryLogin', examples: [{ registry: 'ghcr.io', username: 'ci', created_at: '2026-11-26T08:00:00.000Z' }] });

export const RegistryLoginList = z.object({ items: z.array(RegistryLogin) }).meta({ id: 'RegistryLoginList' });
