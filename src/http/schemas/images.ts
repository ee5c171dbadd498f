import { z } from 'zod';

/** Images and templates on the Firecase-style face. */

export const ImageName = z.string().min(1).max(63).describe('an image name');
export const ImageNameParams = z.object({ name: ImageName });

export const ImageConfig = z
  .object({
    env: z.record(z.string(), z.string()),
    workdir: z.string().nullable(),
    user: z.string().nullable(),
    cmd: z.array(z.string()).nullable(),
    entrypoint: z.array(z.string()).nullable(),
    labels: z.record(z.string(), z.string()),
    exposed_ports: z.array(z.number().int()),
  })
  .meta({ id: 'ImageConfig', description: 'What instances made from the image get: its environment and working directory; its CMD/ENTRYPOINT as a template\'s start command.' });

export const Image = z
  .object({
    name: z.string(),
    kind: z.enum(['system', 'built']).describe('`system`: a rootfs every owner shares (set-up\'s, imported on the host); `built`: yours, layers on a system image'),
    base: z.string().nullable().describe('for a built image: the system image under its layers'),
    layers: z.number().int(),
    config: ImageConfig,
    created_at: z.string(),
  })
  .meta({ id: 'Image', examples: [{ name: 'my-app', kind: 'built', base: 'debian', layers: 3, config: { env: { NODE_ENV: 'production' }, workdir: '/app', user: null, cmd: ['node', 'server.js'], entrypoint: null, labels: {}, exposed_ports: [3000] }, created_at: '2026-11-22T08:00:00.000Z' }] });

export const ImageList = z.object({ images: z.array(Image) }).meta({ id: 'ImageList' });

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
    from_image: z.string().max(63).optional().describe('an image (system or built) to boot'),
    from_checkpoint: z.string().max(64).optional().describe('or a checkpoint of yours to restore'),
    start_command: z.string().max(65536).optional().describe('started in the background before the template\'s checkpoint: running in every instance made from it; default: the image\'s CMD'),
    ready_command: z.string().max(65536).optional().describe('run until it exits 0 before the checkpoint (say, `curl -sf localhost:8080`)'),
    ready_timeout_s: z.number().int().min(1).max(3600).optional().describe('default 60'),
  })
  .strict()
  .meta({ id: 'CreateTemplateRequest', examples: [{ name: 'web', from_image: 'my-app', start_command: 'node server.js', ready_command: 'curl -sf localhost:3000' }] });
