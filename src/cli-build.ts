import { spawn } from 'node:child_process';
import { request } from 'undici';
import { ownedOutput } from './core/build/context.js';

export interface ServerBuild {
  url: string;
  token: string;
  name: string;
  context: string;
  dockerfile: string;
  buildArgs: Record<string, string>;
}

/** Sends a build context to the server as a tar and prints its build log as it comes; answers
 * the exit code (0: built). */
export async function buildOnServer(b: ServerBuild): Promise<number> {
  const tar = ownedOutput(spawn('tar', ['-c', '-f', '-', '-C', b.context, '.'], { stdio: ['ignore', 'pipe', 'inherit'] }));
  const q = new URLSearchParams({ dockerfile: b.dockerfile });
  if (Object.keys(b.buildArgs).length) q.set('build_args', JSON.stringify(b.buildArgs));
  const res = await request(`${b.url.replace(/\/+$/, '')}/images/${encodeURIComponent(b.name)}/build?${q}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${b.token}`, 'content-type': 'application/x-tar', accept: 'text/event-stream' },
    body: tar,
  });
  if (res.statusCode !== 200) {
    process.stderr.write(`forkpoint: the server answered ${res.statusCode}: ${await res.body.text()}\n`);
    return 1;
  }
  let buffer = '';
  let code = 1;
  for await (const chunk of res.body) {
    buffer += (chunk as Buffer).toString('utf8');
    let end: number;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = /^event: (.*)$/m.exec(block)?.[1];
      const data = /^data: (.*)$/m.exec(block)?.[1];
      if (!event || !data) continue;
      const d = JSON.parse(data) as { message?: string; error?: string; details?: { output?: string } | null; name?: string };
      if (event === 'build_log') process.stdout.write(`${d.message ?? ''}\n`);
      else if (event === 'result') {
        process.stdout.write(`built ${d.name}\n`);
        code = 0;
      } else if (event === 'error') {
        if (d.details?.output) process.stderr.write(d.details.output.endsWith('\n') ? d.details.output : `${d.details.output}\n`);
        process.stderr.write(`forkpoint: ${d.error}\n`);
      }
    }
  }
  return code;
}
