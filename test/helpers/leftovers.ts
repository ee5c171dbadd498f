/**
 * Fails the run if the suite leaves anything of its own behind: mounts and loop devices of
 * test data directories, sandbox cgroups (and CPU groups a test held a process in), temporary directories, staged memory images, firewall tables, gateway
 * addresses, links, test hosts' network namespaces, and servers it started (forkpoint nodes,
 * throwaway PostgreSQL clusters). What existed before the run
 * (another checkout's, a developer's server) is not counted.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { execaSync } from 'execa';

const TEMP = /^(forkpoint-|fp-config-|fp-store-|fp-pg-)/;
const CLI = new URL('../../dist/cli.js', import.meta.url).pathname;

function snapshot(): Set<string> {
  const found = new Set<string>();
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const at = line.split(' ')[4];
    if (at?.startsWith(`${tmpdir()}/forkpoint-`)) found.add(`mount ${at}`);
  }
  for (const line of execaSync('losetup', ['-a'], { reject: false }).stdout.split('\n')) {
    if (line.includes(`${tmpdir()}/forkpoint-`)) found.add(`loop ${line}`);
  }
  // Sandboxes' groups (forkpoint/<node>/inst_..., and forkpoint/inst_... of older servers),
  // and a node's group left with nothing in it.
  for (const controller of ['memory', 'pids', 'cpu', 'cpuacct', 'devices', 'freezer', '.']) {
    const root = `/sys/fs/cgroup/${controller}/forkpoint`;
    let entries: string[];
    try {
      entries = readdirSync(root, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => e.name);
    } catch {
      continue; // no such hierarchy here
    }
    for (const g of entries) {
      if (g.startsWith('inst_')) found.add(`cgroup ${controller}/${g}`);
      else if (g.startsWith('node-')) {
        const inside = readdirSync(`${root}/${g}`, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => e.name);
        for (const i of inside) if (i.startsWith('inst_')) found.add(`cgroup ${controller}/${g}/${i}`);
      }
    }
  }
  // CPU groups a test held a process in (helpers/throttle.ts).
  for (const root of ['/sys/fs/cgroup/cpu', '/sys/fs/cgroup']) {
    let names: string[];
    try {
      names = readdirSync(root);
    } catch {
      continue;
    }
    for (const name of names) if (name.startsWith('forkpoint-test-throttle-')) found.add(`cgroup ${root}/${name}`);
  }
  for (const name of readdirSync(tmpdir())) if (TEMP.test(name)) found.add(`temp ${tmpdir()}/${name}`);
  // Memory images staged during a checkpoint's freeze (engine/dump-staging.ts), per node.
  for (const name of readdirSync('/dev/shm')) if (name.startsWith('forkpoint-dumps-')) found.add(`staging /dev/shm/${name}`);
  // Networks: servers' firewall tables and gateway addresses, links, test hosts' namespaces.
  for (const line of execaSync('nft', ['list', 'tables'], { reject: false }).stdout.split('\n')) {
    if (/ forkpoint_fp/.test(line)) found.add(`nft ${line.trim()}`);
  }
  for (const line of execaSync('ip', ['-o', '-4', 'addr', 'show', 'dev', 'lo'], { reject: false }).stdout.split('\n')) {
    const m = / inet (10\.\d+\.\d+\.1)\/32 /.exec(line);
    if (m) found.add(`gateway ${m[1]} on lo`);
  }
  for (const line of execaSync('ip', ['-o', 'link', 'show'], { reject: false }).stdout.split('\n')) {
    const m = /^\d+: (fp[0-9a-f]{3}[0-9a-f]{10}|fpt[0-9a-z]+)[@:]/.exec(line);
    if (m) found.add(`link ${m[1]}`);
  }
  for (const name of execaSync('ip', ['netns', 'list'], { reject: false }).stdout.split('\n')) {
    if (name.startsWith('fpt-')) found.add(`netns ${name.split(' ')[0]}`);
  }
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    let args: string[];
    try {
      args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    } catch {
      continue; // gone meanwhile
    }
    if (args[1] === CLI && args[2] === 'serve') found.add(`process ${pid} (forkpoint serve)`);
    if (args.some((a) => a.startsWith(`${tmpdir()}/fp-pg-`)) && args[0]?.endsWith('/postgres')) found.add(`process ${pid} (${args.slice(0, 3).join(' ')})`);
  }
  return found;
}

export default function setup(): () => void {
  const before = snapshot();
  return () => {
    const left = [...snapshot()].filter((x) => !before.has(x));
    if (!left.length) return;
    // Vitest only logs what a global teardown throws: the exit code is what fails CI.
    process.stderr.write(`\nthe test suite left behind:\n  ${left.join('\n  ')}\n`);
    process.exitCode = 1;
  };
}
