#!/usr/bin/env node
import { Command, Option } from 'commander';
import { VERSION } from './version.js';

/**
 * The forkpoint command. Its client commands talk to a server by URL and token; its server
 * commands run one or act on its data. Nothing is loaded before the arguments are parsed but
 * commander: each action imports what it needs, so `--help` and the first byte of a client
 * command do not wait for the server's modules.
 */

interface GlobalFlags {
  config?: string;
  dataDir?: string;
  url?: string;
  token?: string;
  json?: boolean;
}

const program = new Command()
  .name('forkpoint')
  .description('Self-hosted sandboxes with instant checkpoints, rollback and fork')
  .version(VERSION)
  .option('--url <url>', 'the server (also FORKPOINT_URL; else `forkpoint login`\'s, else http://127.0.0.1:7878)')
  .option('--token <token>', 'an API token (also FORKPOINT_TOKEN; else `forkpoint login`\'s, else a local server\'s first token)')
  .option('--json', 'print JSON (for scripts) instead of tables')
  .option('-c, --config <file>', 'the server\'s JSON config file (also FORKPOINT_CONFIG)')
  .option('-d, --data-dir <dir>', 'the server\'s data directory (also FORKPOINT_DATA_DIR)')
  .showHelpAfterError('(forkpoint --help lists the commands)')
  // Usage errors end with 2 (--help and --version with 0); set before the commands, which
  // inherit it.
  .exitOverride((err) => process.exit(err.exitCode === 0 ? 0 : 2));

/** The global flags with a command's own (`--json` may come after the command too). */
const flags = <T extends object>(o: T): GlobalFlags & T => ({ ...program.opts<GlobalFlags>(), ...o });
const client = () => import('./cli/client.js');
const server = () => import('./cli/server.js');
const withJson = (c: Command) => c.option('--json', 'print JSON instead of a table');

// ---- the client ---------------------------------------------------------------------------

program.commandsGroup('Sandboxes:');
withJson(program.command('ls').alias('list').description('List instances')).action(async (o: object) => (await client()).ls(flags(o)));

withJson(
  program
    .command('create')
    .description('Create an instance; prints its id')
    .option('-n, --name <name>', 'its name (also its hostname)')
    .option('-i, --image <image>', 'the image (default: the server\'s default image)')
    .option('--memory <mb>', 'memory limit, MiB')
    .option('--cpu <percent>', 'CPU limit, percent of one CPU')
    .option('--pids <n>', 'process limit')
    .option('--disk <mb>', 'disk limit, MiB')
    .option('-e, --env <NAME=VALUE...>', 'environment variables')
    .addOption(new Option('--egress <policy>', 'what it may reach outside').choices(['allow', 'deny']))
    .option('--allow <dest...>', 'hosts or CIDRs it may reach')
    .option('--deny <dest...>', 'hosts or CIDRs it may not reach')
    .option('-v, --volume <spec...>', 'mount a persistent volume: NAME:/PATH or NAME:/PATH:ro (forkpoint volume create)')
    .option('--secret <spec...>', 'a secret its requests to these hosts carry: NAME=HOST[,HOST...] (forkpoint secret set)'),
).action(async (o: object) => (await client()).create(flags(o)));

withJson(
  program
    .command('exec <id> [command...]')
    .description('Run a command and stream its output; exits with its status (forkpoint exec ID -- CMD ARGS...)')
    .option('-i, --interactive', 'send what is piped in to the command\'s stdin')
    .option('-u, --user <user>', 'run as this user of the sandbox (name or uid)')
    .option('-w, --cwd <dir>', 'working directory')
    .option('-e, --env <NAME=VALUE...>', 'environment variables')
    .option('-t, --timeout <seconds>', 'kill it after this long')
    .option('--detach', 'start it in the background and print its execution id (forkpoint logs, ps, kill; -d is the data directory)'),
).action(async (id: string, command: string[], o: object) => (await import('./cli/exec.js')).exec(id, command, flags(o)));
withJson(program.command('ps <id>').description('An instance\'s commands that run on (background, streamed, terminals), newest first')).action(async (id: string, o: object) => (await import('./cli/exec.js')).ps(id, flags(o)));
withJson(program.command('logs <id> <exec_id>').description('What a command printed (its last 256 KiB a stream); -f follows it to its end').option('-f, --follow', 'go on until it ends')).action(async (id: string, execId: string, o: object) => (await import('./cli/exec.js')).logs(id, execId, flags(o)));
withJson(program.command('kill <id> <exec_id>').description('Signal a command\'s whole process group').option('-s, --signal <signal>', 'a name (TERM, INT, ...) or number; KILL by default')).action(async (id: string, execId: string, o: object) => (await import('./cli/exec.js')).kill(id, execId, flags(o)));

program
  .command('shell <id>')
  .description('An interactive terminal in the instance (Ctrl-] detaches; --attach takes one up again)')
  .option('-a, --attach <pty>', 'a terminal already open (its id)')
  .option('-u, --user <user>', 'open it as this user of the sandbox')
  .option('--command <cmd>', 'run this instead of a shell')
  .action(async (id: string, o: object) => (await import('./cli/shell.js')).shell(id, flags(o)));

withJson(program.command('cp <src> <dst>').description('Copy files or directories in or out (ID:/path for the instance side)')).action(async (src: string, dst: string, o: object) => (await import('./cli/copy.js')).cp(src, dst, flags(o)));
withJson(program.command('rm <id...>').description('Delete instances')).action(async (ids: string[], o: object) => (await client()).rm(ids, flags(o)));
for (const action of ['hibernate', 'wake', 'stop', 'start'] as const) {
  const what = { hibernate: 'Hibernate an instance (memory to disk)', wake: 'Wake a hibernated instance', stop: 'Stop an instance (its disk kept)', start: 'Start a stopped instance' }[action];
  withJson(program.command(`${action} <id>`).description(what)).action(async (id: string, o: object) => (await client()).lifecycle(action, id, flags(o)));
}

program.commandsGroup('Checkpoints:');
withJson(
  program
    .command('checkpoint <id>')
    .description('Take a checkpoint and wait until it is ready (exit 1 if it fails)')
    .option('-l, --label <label>', 'a label')
    .option('--no-memory', 'files only (no processes)'),
).action(async (id: string, o: object) => (await client()).checkpoint(id, flags(o)));
withJson(program.command('checkpoints <id>').description('List an instance\'s checkpoints')).action(async (id: string, o: object) => (await client()).checkpoints(id, flags(o)));
withJson(program.command('rollback <id> <checkpoint>').description('Roll an instance back to a checkpoint, in place')).action(async (id: string, ck: string, o: object) => (await client()).rollback(id, ck, flags(o)));
withJson(
  program
    .command('fork <id> [checkpoint]')
    .description('Fork new instances from a checkpoint (or from now); prints their ids')
    .option('-n, --count <n>', 'how many', '1')
    .option('--name <name>', 'their name'),
).action(async (id: string, ck: string | undefined, o: object) => (await client()).fork(id, ck, flags(o)));
withJson(program.command('lineage <id>').description('The tree of an instance\'s checkpoints and forks')).action(async (id: string, o: object) => (await client()).lineage(id, flags(o)));
withJson(program.command('events <id>').description('An instance\'s events').option('-f, --follow', 'go on as they happen')).action(async (id: string, o: object) => (await client()).events(id, flags(o)));

program.commandsGroup('Ports, images, templates:');
withJson(program.command('ports <id>').description('An instance\'s port forwards')).action(async (id: string, o: object) => (await client()).ports(id, flags(o)));
withJson(program.command('preview <id> <port>').description('A signed link that opens a port in a browser').option('--ttl <seconds>', 'how long it lives')).action(async (id: string, port: string, o: object) => (await client()).preview(id, port, flags(o)));
withJson(program.command('images').description('The images the server has for you')).action(async (o: object) => (await client()).images(flags(o)));
/** `pull REF` (and `image pull REF`): a registry's image into the server. */
const pullCommand = (parent: Command, description: string) =>
  withJson(
    parent
      .command('pull <reference>')
      .description(description)
      .option('-u, --username <user>', 'for a registry that needs credentials')
      .option('--password-stdin', 'read the password from standard input'),
  ).action(async (ref: string, o: object) => (await client()).pull(ref, flags(o)));
pullCommand(program, 'Pull an image from a registry (python:3.12-slim, registry.example/team/app@sha256:...) into the server');
const registry = program.command('registry').description('Credentials for private registries, kept on the server for your pulls');
withJson(
  registry
    .command('login <registry>')
    .description('Keep credentials for a registry (host or host:port; docker.io for Docker Hub)')
    .requiredOption('-u, --username <user>', 'the user name')
    .requiredOption('--password-stdin', 'read the password from standard input'),
).action(async (host: string, o: object) => (await client()).registryLogin(host, flags(o)));
withJson(registry.command('logout <registry>').description('Forget the credentials for a registry')).action(async (host: string, o: object) => (await client()).registryLogout(host, flags(o)));
withJson(registry.command('ls').description('The registries you keep credentials for (never a password)')).action(async (o: object) => (await client()).registries(flags(o)));

const secret = program.command('secret').description('Secrets your instances\' requests carry to hosts you name; the sandbox sees a placeholder');
withJson(secret.command('set <name>').description('Keep a secret, its value read from stdin (or replace it)')).action(async (name: string, o: object) => (await client()).secretSet(name, flags(o)));
withJson(secret.command('ls').alias('list').description('Your secrets (never a value)')).action(async (o: object) => (await client()).secrets(flags(o)));
withJson(secret.command('rm <names...>').description('Delete secrets')).action(async (names: string[], o: object) => (await client()).secretRm(names, flags(o)));

const volume = program.command('volume').description('Persistent volumes: filesystems that outlive instances, mounted with create --volume');
withJson(volume.command('create <name>').description('Create a volume of --size MiB').requiredOption('-s, --size <mb>', 'what it may hold, MiB')).action(async (name: string, o: object) => (await client()).volumeCreate(name, flags(o)));
withJson(volume.command('ls').alias('list').description('Your volumes')).action(async (o: object) => (await client()).volumes(flags(o)));
withJson(volume.command('inspect <name>').description('A volume as JSON: size, use, node, the instances that mount it')).action(async (name: string, o: object) => (await client()).volumeInspect(name, flags(o)));
withJson(volume.command('rm <names...>').description('Delete volumes and their files (not while an instance mounts them)')).action(async (names: string[], o: object) => (await client()).volumeRm(names, flags(o)));
withJson(program.command('templates').description('Your templates')).action(async (o: object) => (await client()).templates(flags(o)));

program
  .command('mcp')
  .description('forkpoint\'s tools for an AI agent over MCP (stdio): sandboxes, commands, files, checkpoints, rollback, fork, and try_command (rolls back by itself if the command fails)')
  .action(async (o: object) => (await import('./cli/mcp.js')).mcp(flags(o)));
withJson(program.command('login').description('Check a server URL and token and keep them for later commands (mode 0600)')).action(async (o: object) => (await client()).login(flags(o)));
program
  .command('completion <shell>')
  .description('Print a completion script for bash, zsh or fish (e.g. source <(forkpoint completion bash))')
  .action(async (shell: string) => (await import('./cli/completion.js')).completion(program, shell));

// ---- the server ---------------------------------------------------------------------------

program.commandsGroup('Server:');
program
  .command('serve')
  .description('Start the API server (creates and prints a token on first start)')
  .option('-p, --port <port>', 'port (also FORKPOINT_PORT)')
  .option('-H, --host <host>', 'address to listen on (also FORKPOINT_HOST)')
  .option('-l, --log-level <level>', 'pino log level (also FORKPOINT_LOG_LEVEL)')
  .action(async (o: { port?: string; host?: string; logLevel?: string }) => (await server()).serve(flags({}), o));

const token = program.command('token').description('Manage API tokens (on the server\'s machine)');
token
  .command('create')
  .description('Create a token and print it (shown once)')
  .option('-o, --owner <owner>', 'the owner everything made with it belongs to', 'default')
  .option('-n, --name <name>', 'a name to recognise it by', 'cli')
  .option('--e2b', 'write it as E2B\'s SDKs expect a key (e2b_ and hex); it works on every face')
  .action(async (o: { owner: string; name: string; e2b?: boolean }) => (await server()).tokenCreate(flags({}), o));
withJson(token.command('list').description('List tokens (ids, owners, never secrets)')).action(async (o: { json?: boolean }) => (await server()).tokenList(flags({}), flags(o)));
token
  .command('revoke <id>')
  .description('Revoke a token by id')
  .action(async (id: string) => (await server()).tokenRevoke(flags({}), id));

program
  .command('drain')
  .description('Drain the server on this machine: it takes no new work and hands its instances over to the other nodes (each from a durable checkpoint of the moment, processes and all); prints what it handed over and kept')
  .option('--timeout <seconds>', 'how long to wait for the drain to answer (each handover takes a checkpoint and its upload)', '3600')
  .action(async (o: { timeout: string }) => (await server()).drain(flags({}), flags(o)));

const image = program.command('image').description('Manage images (read-only rootfs trees, and images built on them)');
image
  .command('import <name> <file>')
  .description('Import an image: a `docker save` tarball, an OCI image layout tarball, or a rootfs tarball')
  .action(async (name: string, file: string) => (await server()).imageImport(flags({}), name, file));
image
  .command('build <name> [context]')
  .description('Build an image from a Dockerfile in CONTEXT on the running server (its log as it runs); `image build debian` with no context (re)builds the Debian image from Debian\'s archive')
  .option('-f, --file <dockerfile>', 'the Dockerfile, relative to the current directory (default: CONTEXT/Dockerfile)')
  .option('--build-arg <arg...>', 'NAME=VALUE for an ARG')
  .action(async (name: string, context: string | undefined, o: { file?: string; buildArg?: string[] }) => (await server()).imageBuild(flags({}), name, context, flags(o)));
pullCommand(image, 'Pull an image from a registry into the running server (the same as forkpoint pull)');
withJson(image.command('list').alias('ls').description('The images in this machine\'s data directory')).action(async (o: { json?: boolean }) => (await server()).imageList(flags({}), flags(o)));

program
  .command('openapi')
  .description('Print the OpenAPI document (or write it to a file)')
  .option('-o, --out <file>')
  .option('--openapi <version>', '3.1 (the contract) or 3.0 (the 3.0.3 rendition)', '3.1')
  .action(async (o: { out?: string; openapi: string }) => (await server()).openapi(o));

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('/cli.js')) {
  program.parseAsync().catch(async (err: unknown) => {
    const { CliError } = await import('./cli/api.js');
    const line = err instanceof CliError ? (err.code === 'USAGE' ? err.message : `${err.code}: ${err.message}`) : (err as Error).message;
    process.stderr.write(`forkpoint: ${line}\n`);
    process.exit(err instanceof CliError ? err.exitCode : 1);
  });
}
