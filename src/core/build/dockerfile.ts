import { posix } from 'node:path';
import { DockerfileParser, type Instruction } from 'dockerfile-ast';
import { volumePathProblem } from '../../lib/volume-path.js';
import { DockerfileError } from '../errors.js';
import type { ImageConfig } from '../../store/images.js';
import type { BuildPlan, BuildStep } from './steps.js';

const MAX_DOCKERFILE_BYTES = 1 << 20;

/** $VAR, ${VAR}, ${VAR:-default} and ${VAR:+alternative}, as Docker expands them outside RUN. */
export function expand(text: string, vars: Record<string, string>): string {
  return text.replace(/\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)/g, (m, braced: string | undefined, op: string | undefined, word: string | undefined, bare: string | undefined) => {
    if (m === '\\$') return '$';
    const name = (braced ?? bare)!;
    const value = vars[name];
    if (op === '-') return value ? value : (word ?? '');
    if (op === '+') return value ? (word ?? '') : '';
    return value ?? '';
  });
}

/** A JSON array of strings (the exec form), or undefined when the text is not one. */
function execForm(text: string, line: number): string[] | undefined {
  const t = text.trim();
  if (!t.startsWith('[')) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(t);
  } catch {
    return undefined; // Docker runs a malformed JSON array as a shell command, and so do we
  }
  if (!Array.isArray(parsed) || parsed.length === 0 || !parsed.every((a) => typeof a === 'string')) {
    throw new DockerfileError('the exec form is a JSON array of strings, not empty', line);
  }
  return parsed as string[];
}

const shellOrExec = (text: string, line: number): string[] => execForm(text, line) ?? ['/bin/sh', '-c', text];

/** Parses a Dockerfile into a build plan. One stage (`FROM` once); every instruction Docker
 * has that a sandbox cannot honour is refused with its line rather than ignored. */
export function parseDockerfile(source: string, buildArgs: Record<string, string> = {}): BuildPlan {
  if (Buffer.byteLength(source) > MAX_DOCKERFILE_BYTES) throw new DockerfileError('the Dockerfile is larger than 1 MiB', null);
  const instructions = DockerfileParser.parse(source).getInstructions();
  const args: Record<string, string> = {};
  const env: Record<string, string> = {};
  const vars = () => ({ ...args, ...env });
  let from: { image: string; line: number } | undefined;
  const steps: BuildStep[] = [];
  for (const ins of instructions) {
    const line = ins.getRange().start.line + 1;
    const keyword = ins.getKeyword().toUpperCase();
    const raw = (ins.getArgumentsContent() ?? '').trim();
    const text = `${keyword} ${raw}`;
    const flags = flagsOf(ins, line);
    const allowFlags = (...names: string[]) => {
      const bad = Object.keys(flags).find((f) => !names.includes(f));
      if (bad) throw new DockerfileError(`${keyword} --${bad} is not supported`, line);
    };
    if (!raw && keyword !== 'RUN') throw new DockerfileError(`${keyword} needs arguments`, line);
    if (keyword === 'ARG') {
      for (const p of properties(ins)) args[p.name] = buildArgs[p.name] ?? p.value ?? '';
      continue;
    }
    if (!from) {
      if (keyword !== 'FROM') throw new DockerfileError(`the first instruction (after ARG) must be FROM, not ${keyword}`, line);
      allowFlags();
      const [image, as, stage] = expand(raw, args).split(/\s+/);
      if (as && (as.toUpperCase() !== 'AS' || !stage)) throw new DockerfileError('FROM takes an image, and optionally AS name', line);
      from = { image: image!, line };
      continue;
    }
    switch (keyword) {
      case 'FROM':
        throw new DockerfileError('multi-stage builds (a second FROM) are not supported', line);
      case 'RUN': {
        allowFlags();
        if (!raw) throw new DockerfileError('RUN needs a command', line);
        steps.push({ kind: 'run', line, text, argv: shellOrExec(raw, line), env: { ...args } });
        break;
      }
      case 'COPY':
      case 'ADD': {
        allowFlags('chown');
        const parts = (execForm(raw, line) ?? raw.split(/\s+/)).map((p) => expand(p, vars()));
        if (parts.length < 2) throw new DockerfileError(`${keyword} needs a source and a destination`, line);
        const dest = parts.pop()!;
        const chown = flags.chown ? expand(flags.chown, vars()) : null;
        const urls = parts.filter((p) => /^https?:\/\//.test(p));
        if (urls.length > 0) {
          if (keyword === 'COPY') throw new DockerfileError('COPY takes files of the build context; ADD fetches URLs', line);
          if (parts.length > 1) throw new DockerfileError('ADD with a URL takes one source', line);
          steps.push({ kind: 'download', line, text: `${keyword} ${parts[0]} ${dest}`, url: parts[0]!, dest, chown });
          break;
        }
        if (parts.length > 1 && !dest.endsWith('/')) throw new DockerfileError(`with several sources, the destination must be a directory (end it with /)`, line);
        for (const p of parts) {
          const n = posix.normalize(p);
          if (n.startsWith('../') || n === '..') throw new DockerfileError(`${p} is outside the build context`, line);
        }
        steps.push({ kind: 'copy', line, text: `${keyword} ${flags.chown ? `--chown=${chown} ` : ''}${parts.join(' ')} ${dest}`, sources: parts, dest, chown, unpack: keyword === 'ADD' });
        break;
      }
      case 'ENV': {
        const set: Record<string, string> = {};
        for (const p of properties(ins)) set[p.name] = expand(p.value ?? '', vars());
        Object.assign(env, set);
        steps.push({ kind: 'config', line, text: `ENV ${Object.entries(set).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(' ')}`, apply: (c) => ({ ...c, env: { ...c.env, ...set } }) });
        break;
      }
      case 'WORKDIR': {
        const path = expand(raw, vars());
        steps.push({ kind: 'workdir', line, text: `WORKDIR ${path}`, path });
        break;
      }
      case 'USER': {
        const user = expand(raw, vars());
        steps.push({ kind: 'config', line, text: `USER ${user}`, apply: (c) => ({ ...c, user }) });
        break;
      }
      case 'LABEL': {
        const set: Record<string, string> = {};
        for (const p of properties(ins)) set[p.name] = expand(p.value ?? '', vars());
        steps.push({ kind: 'config', line, text, apply: (c) => ({ ...c, labels: { ...c.labels, ...set } }) });
        break;
      }
      case 'EXPOSE': {
        const ports = expand(raw, vars())
          .split(/\s+/)
          .map((p) => {
            const m = /^(\d{1,5})(\/(tcp|udp))?$/i.exec(p);
            const n = m ? Number(m[1]) : NaN;
            if (!(n >= 1 && n <= 65535)) throw new DockerfileError(`EXPOSE ${p} is not a port`, line);
            return n;
          });
        steps.push({ kind: 'config', line, text, apply: (c) => ({ ...c, exposedPorts: [...new Set([...c.exposedPorts, ...ports])] }) });
        break;
      }
      case 'CMD':
      case 'ENTRYPOINT': {
        const argv = shellOrExec(raw, line);
        const field: keyof ImageConfig = keyword === 'CMD' ? 'cmd' : 'entrypoint';
        steps.push({ kind: 'config', line, text, apply: (c) => ({ ...c, [field]: argv }) });
        break;
      }
      case 'VOLUME': {
        const paths = (execForm(raw, line) ?? raw.split(/\s+/).filter(Boolean)).map((p) => expand(p, vars()).replace(/(.)\/+$/, '$1'));
        if (!paths.length) throw new DockerfileError('VOLUME needs a path', line);
        for (const path of paths) {
          const problem = volumePathProblem(path);
          if (problem) throw new DockerfileError(`VOLUME ${path}: ${problem}`, line);
        }
        steps.push({ kind: 'volume', line, text: `VOLUME ${paths.join(' ')}`, paths });
        break;
      }
      case 'SHELL':
      case 'STOPSIGNAL':
      case 'HEALTHCHECK':
      case 'ONBUILD':
      case 'MAINTAINER':
        throw new DockerfileError(`${keyword} is not supported`, line);
      default:
        throw new DockerfileError(`unknown instruction ${keyword}`, line);
    }
  }
  if (!from) throw new DockerfileError('the Dockerfile has no FROM', null);
  return { from: from.image, fromLine: from.line, steps };
}

function flagsOf(ins: Instruction, line: number): Record<string, string> {
  const out: Record<string, string> = {};
  const withFlags = ins as Instruction & { getFlags?: () => { getName(): string; getValue(): string | null }[] };
  for (const f of withFlags.getFlags?.() ?? []) {
    const value = f.getValue();
    if (value === null) throw new DockerfileError(`--${f.getName()} needs a value`, line);
    out[f.getName()] = value;
  }
  return out;
}

function properties(ins: Instruction): { name: string; value: string | null }[] {
  const withProps = ins as Instruction & { getProperties?: () => { getName(): string; getValue(): string | null }[] };
  return (withProps.getProperties?.() ?? []).map((p) => ({ name: p.getName(), value: p.getValue() }));
}
