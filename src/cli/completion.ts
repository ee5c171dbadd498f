import type { Command } from 'commander';
import { CliError } from './api.js';

/** A completion script for the shell: the command names, and each command's options. */
export function completion(program: Command, shell: string): void {
  const commands = program.commands.map((c) => ({ name: c.name(), options: c.options.map((o) => o.long).filter((l): l is string => !!l), subcommands: c.commands.map((s) => s.name()) }));
  const names = commands.map((c) => c.name).join(' ');
  if (shell === 'bash') {
    const cases = commands.map((c) => `    ${c.name}) opts="${[...c.subcommands, ...c.options, '--help'].join(' ')}" ;;`).join('\n');
    process.stdout.write(`# forkpoint completion for bash: source <(forkpoint completion bash)
_forkpoint() {
  local cur=\${COMP_WORDS[COMP_CWORD]} opts
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "${names} --help --version --url --token --json" -- "$cur"))
    return
  fi
  case \${COMP_WORDS[1]} in
${cases}
    *) opts="" ;;
  esac
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o default -F _forkpoint forkpoint
`);
    return;
  }
  if (shell === 'zsh') {
    const lines = commands.map((c) => `    '${c.name}:${(program.commands.find((x) => x.name() === c.name)?.description() ?? '').replace(/'/g, '').replace(/:/g, '\\:').slice(0, 70)}'`).join('\n');
    process.stdout.write(`#compdef forkpoint
# forkpoint completion for zsh: source <(forkpoint completion zsh)
_forkpoint() {
  local -a commands
  commands=(
${lines}
  )
  if (( CURRENT == 2 )); then
    _describe 'command' commands
  else
    _files
  fi
}
compdef _forkpoint forkpoint
`);
    return;
  }
  if (shell === 'fish') {
    const lines = commands.flatMap((c) => [
      `complete -c forkpoint -n '__fish_use_subcommand' -a ${c.name} -d '${(program.commands.find((x) => x.name() === c.name)?.description() ?? '').replace(/'/g, '').slice(0, 70)}'`,
      ...c.options.map((o) => `complete -c forkpoint -n '__fish_seen_subcommand_from ${c.name}' -l ${o.replace(/^--/, '')}`),
    ]);
    process.stdout.write(`# forkpoint completion for fish: forkpoint completion fish | source\n${lines.join('\n')}\n`);
    return;
  }
  throw new CliError(`completion: bash, zsh or fish, not ${shell}`, 'USAGE', 2);
}
