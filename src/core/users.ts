import { MAX_GROUPS, type AgentPort, type UnixIds } from '../seam/agent.js';
import type { SandboxHandle } from '../seam/sandbox.js';
import { InvalidRequestError } from './errors.js';

/** A user of a sandbox, as its own /etc/passwd and /etc/group say. */
export interface SandboxUser extends UnixIds {
  name: string;
  home: string;
}

/** Who the sandbox's ids are, for telling a file's owner by name. */
export interface IdNames {
  users: ReadonlyMap<number, string>;
  groups: ReadonlyMap<number, string>;
}

/** The account databases are the sandbox's: read at most this much of each. */
const MAX_DB_BYTES = 1 << 20;
/** What useradd accepts, and what a name may be to be shown back. */
const NAME = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?$/;
const MAX_ID = 0xfffffffe;
const ROOT: SandboxUser = { name: 'root', uid: 0, gid: 0, groups: [], home: '/root' };
/** Root, for what forkpoint itself runs in a sandbox whatever its image's USER: no lookup of the
 * sandbox's /etc/passwd (a round trip to its agent) on the way. */
export const AS_ROOT: SandboxUser = ROOT;

/** A user named that does not exist in the sandbox (envd: "invalid username"). */
export class UnknownUserError extends InvalidRequestError {
  constructor(readonly user: string) {
    super(`invalid username: '${user}' is not a user of the sandbox`, { reason: 'UNKNOWN_USER', user });
  }
}

const id = (s: string | undefined): number | undefined => (s !== undefined && /^\d{1,10}$/.test(s) && Number(s) <= MAX_ID ? Number(s) : undefined);

/** The lines of a colon-separated database with at least `fields` fields; anything else (a
 * hostile or broken line) is passed over, as libc's own parser does. */
function records(text: string, fields: number): string[][] {
  return text.split('\n').flatMap((line) => {
    const f = line.split(':');
    return f.length >= fields && NAME.test(f[0]!) ? [f] : [];
  });
}

async function readDb(agent: AgentPort, path: string): Promise<string> {
  const file = await agent.readFile(path, MAX_DB_BYTES);
  if (!file) return '';
  const text = file.data.toString('utf8');
  // A database cut at the bound loses its last, partial line, never half a record.
  return file.truncated ? text.slice(0, text.lastIndexOf('\n') + 1) : text;
}

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

function passwd(text: string): PasswdEntry[] {
  return records(text, 7).flatMap(([name, , uid, gid, , home]) => {
    const u = id(uid);
    const g = id(gid);
    return u !== undefined && g !== undefined && home?.startsWith('/') && !home.includes('\0') ? [{ name: name!, uid: u, gid: g, home }] : [];
  });
}

function groups(text: string): { name: string; gid: number; members: string[] }[] {
  return records(text, 4).flatMap(([name, , gid, members]) => {
    const g = id(gid);
    return g !== undefined ? [{ name: name!, gid: g, members: (members ?? '').split(',').filter(Boolean) }] : [];
  });
}

/**
 * The user called `name` in the sandbox: its ids from /etc/passwd, its supplementary groups from
 * /etc/group (those that list it, at most MAX_GROUPS), its home. A number names the uid itself
 * (Docker's `-u 1000`), with the gid of its passwd entry or its own. Read as the agent's root from
 * the sandbox's files, which the sandbox may have written anything into: a line that does not
 * parse is no user.
 */
export async function lookupUser(agent: AgentPort, name: string): Promise<SandboxUser> {
  const numeric = id(name);
  if (!NAME.test(name) && numeric === undefined) throw new UnknownUserError(name);
  const users = passwd(await readDb(agent, '/etc/passwd'));
  const entry = numeric !== undefined ? users.find((u) => u.uid === numeric) : users.find((u) => u.name === name);
  if (!entry) {
    if (name === 'root' || numeric === 0) return ROOT;
    if (numeric !== undefined) return { name, uid: numeric, gid: numeric, groups: [], home: '/' };
    throw new UnknownUserError(name);
  }
  const supplementary = groups(await readDb(agent, '/etc/group'))
    .filter((g) => g.members.includes(entry.name) && g.gid !== entry.gid)
    .map((g) => g.gid);
  return { name: entry.name, uid: entry.uid, gid: entry.gid, groups: [...new Set(supplementary)].slice(0, MAX_GROUPS), home: entry.home };
}

/** A user as Docker's USER and `-u` name one: a name or a uid, with `:group` (a name or a gid)
 * for the primary group in place of the passwd entry's. */
export async function lookupUserSpec(agent: AgentPort, spec: string): Promise<SandboxUser> {
  const colon = spec.indexOf(':');
  if (colon < 0) return lookupUser(agent, spec);
  const user = await lookupUser(agent, spec.slice(0, colon));
  const group = spec.slice(colon + 1);
  const gid = id(group) ?? (NAME.test(group) ? groups(await readDb(agent, '/etc/group')).find((g) => g.name === group)?.gid : undefined);
  if (gid === undefined) throw new InvalidRequestError(`invalid group: '${group}' is not a group of the sandbox`, { reason: 'UNKNOWN_GROUP', group });
  return { ...user, gid, groups: user.groups.filter((g) => g !== gid) };
}

/** The names of the sandbox's users and groups, by id (the first entry of an id wins). */
export async function idNames(agent: AgentPort): Promise<IdNames> {
  const [p, g] = await Promise.all([readDb(agent, '/etc/passwd'), readDb(agent, '/etc/group')]);
  const byId = (entries: { name: string; id: number }[]) => {
    const m = new Map<number, string>();
    for (const e of entries) if (!m.has(e.id)) m.set(e.id, e.name);
    return m;
  };
  return {
    users: byId(passwd(p).map((u) => ({ name: u.name, id: u.uid }))),
    groups: byId(groups(g).map((x) => ({ name: x.name, id: x.gid }))),
  };
}

/** Whether acting as this user needs the agent to change ids at all. */
export function isRoot(u: UnixIds): boolean {
  return u.uid === 0 && u.gid === 0 && u.groups.length === 0;
}

/** What a process started as `name` (Docker's `user[:group]`) runs as, and the variables a login would give it (HOME,
 * USER, LOGNAME); nothing for root, the agent's own. */
export async function processUser(sb: SandboxHandle, user: string | SandboxUser | undefined): Promise<{ ids: UnixIds | undefined; env: Record<string, string>; home: string | undefined }> {
  if (user === undefined) return { ids: undefined, env: {}, home: undefined };
  const u = typeof user === 'string' ? await sb.call((agent) => lookupUserSpec(agent, user)) : user;
  return { ids: isRoot(u) ? undefined : u, env: { HOME: u.home, USER: u.name, LOGNAME: u.name }, home: u.home };
}
