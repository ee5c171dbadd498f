import { createHash } from 'node:crypto';
import { posix } from 'node:path';
import { z } from 'zod';
import { DockerfileError } from '../errors.js';
import type { BuildPlan, BuildStep } from './steps.js';

/** The OpenComputer SDK's `Image` builder manifest (what `Image.toJSON()` sends). */
export const ImageManifest = z.object({
  base: z.string().min(1).max(128),
  steps: z
    .array(
      z.discriminatedUnion('type', [
        z.object({ type: z.literal('apt_install'), args: z.object({ packages: z.array(z.string().min(1).max(256)).min(1).max(1000) }) }),
        z.object({ type: z.literal('pip_install'), args: z.object({ packages: z.array(z.string().min(1).max(256)).min(1).max(1000) }) }),
        z.object({ type: z.literal('run'), args: z.object({ commands: z.array(z.string().min(1).max(65536)).min(1).max(1000) }) }),
        z.object({ type: z.literal('env'), args: z.object({ vars: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()) }) }),
        z.object({ type: z.literal('workdir'), args: z.object({ path: z.string().startsWith('/').max(4096) }) }),
        z.object({ type: z.literal('add_file'), args: z.object({ path: z.string().startsWith('/').max(4096), content: z.string(), encoding: z.literal('base64').optional() }) }),
        z.object({
          type: z.literal('add_dir'),
          args: z.object({ path: z.string().startsWith('/').max(4096), files: z.array(z.object({ relativePath: z.string().min(1).max(4096), content: z.string() })).max(100_000) }),
        }),
      ]),
    )
    .max(1000),
  builderMemoryMB: z.number().int().positive().optional(),
});
export type ImageManifest = z.infer<typeof ImageManifest>;

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/** The manifest as a build plan: the same steps a Dockerfile would have, cached the same way. */
export function manifestPlan(m: ImageManifest, baseImage: string): BuildPlan {
  const steps: BuildStep[] = [];
  const run = (text: string, script: string) => steps.push({ kind: 'run', line: null, text, argv: ['/bin/sh', '-c', script], env: {} });
  for (const s of m.steps) {
    switch (s.type) {
      case 'apt_install': {
        const pkgs = s.args.packages.map(quote).join(' ');
        run(`apt_install ${s.args.packages.join(' ')}`, `apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ${pkgs} && rm -rf /var/lib/apt/lists/*`);
        break;
      }
      case 'pip_install':
        run(`pip_install ${s.args.packages.join(' ')}`, `python3 -m pip install --no-cache-dir --break-system-packages ${s.args.packages.map(quote).join(' ')}`);
        break;
      case 'run':
        for (const c of s.args.commands) run(`run ${c}`, c);
        break;
      case 'env': {
        const vars = s.args.vars;
        steps.push({ kind: 'config', line: null, text: `env ${JSON.stringify(vars)}`, apply: (c) => ({ ...c, env: { ...c.env, ...vars } }) });
        break;
      }
      case 'workdir':
        steps.push({ kind: 'workdir', line: null, text: `workdir ${s.args.path}`, path: s.args.path });
        break;
      case 'add_file': {
        const content = Buffer.from(s.args.content, 'base64');
        steps.push({ kind: 'write', line: null, text: `add_file ${s.args.path} ${hashOf(content)}`, files: [{ path: s.args.path, content }] });
        break;
      }
      case 'add_dir': {
        const files = s.args.files.map((f) => {
          const rel = posix.normalize(f.relativePath);
          if (rel.startsWith('../') || rel === '..' || rel.startsWith('/')) throw new DockerfileError(`add_dir: ${f.relativePath} is not inside ${s.args.path}`, null);
          return { path: posix.join(s.args.path, rel), content: Buffer.from(f.content, 'base64') };
        });
        steps.push({ kind: 'write', line: null, text: `add_dir ${s.args.path} ${hashOf(Buffer.concat(files.flatMap((f) => [Buffer.from(`${f.path}\0`), f.content])))}`, files });
        break;
      }
    }
  }
  return { from: baseImage, fromLine: null, steps };
}

function hashOf(b: Buffer): string {
  return createHash('sha256').update(b).digest('hex').slice(0, 16);
}
