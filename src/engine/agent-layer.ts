import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, copyFile, mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { run } from './run.js';

/** The shell session's rc file: prompts off, and two functions the engine drives the shell
 * with. A command is sourced in the shell itself (so `cd` and `export` persist) with its
 * stdio on files, and its end is told by a marker on the terminal. */
export const SHELL_RC = `PS1=''
PS2=''
unset PROMPT_COMMAND
HISTFILE=/dev/null
__fp_done() { printf '\\036FP:%s:%s\\036\\n' "$1" "$2"; }
__fp_run() { . "/.fp/run/$1.cmd" <"/.fp/run/$1.in" >"/.fp/run/$1.out" 2>"/.fp/run/$1.err"; __fp_done "$1" "$?"; }
`;

/** A lower layer holding the agent, named by its content: a layer is immutable once a
 * checkpoint maps files from it, so a new agent build is a new layer. It sits under every
 * image, and also supplies the mount points and the /dev the sandbox needs. */
export async function ensureAgentLayer(agentsDir: string, agentBinary: string): Promise<string> {
  const binary = await readFile(agentBinary);
  const id = createHash('sha256').update(binary).update(SHELL_RC).digest('hex').slice(0, 16);
  const dir = join(agentsDir, id);
  if (existsSync(join(dir, '.fp', 'agent'))) return id;
  const tmp = `${dir}.tmp-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  for (const d of ['.fp/run', '.fp/empty', 'proc', 'dev', 'tmp']) await mkdir(join(tmp, d), { recursive: true });
  const dev = await run(agentBinary, ['mkdev', join(tmp, 'dev')]);
  if (dev.code !== 0) throw new Error(`agent layer /dev: ${dev.stderr.trim()}`);
  await chmod(join(tmp, 'tmp'), 0o1777);
  await chmod(join(tmp, '.fp'), 0o700);
  await copyFile(agentBinary, join(tmp, '.fp', 'agent'));
  await chmod(join(tmp, '.fp', 'agent'), 0o755);
  await writeFile(join(tmp, '.fp', 'shellrc'), SHELL_RC, { mode: 0o644 });
  await mkdir(agentsDir, { recursive: true });
  await rename(tmp, dir).catch(async (err: NodeJS.ErrnoException) => {
    await rm(tmp, { recursive: true, force: true });
    if (err.code !== 'ENOTEMPTY' && err.code !== 'EEXIST') throw err;
  });
  return id;
}
