import { describe, expect, it } from 'vitest';
import type { AgentPort } from '../../src/seam/agent.js';
import { idNames, lookupUser, UnknownUserError } from '../../src/core/users.js';
import { parseStat } from '../../src/engine/agent/frames.js';
import { AgentProtocolError } from '../../src/seam/errors.js';

/** An agent whose sandbox holds these account files (cut at `max`, as the agent cuts them). */
function agentWith(files: Record<string, string>): AgentPort {
  return {
    readFile: async (path: string, max: number) => {
      const text = files[path];
      if (text === undefined) return undefined;
      const data = Buffer.from(text);
      return { data: data.subarray(0, max), truncated: data.length > max };
    },
  } as unknown as AgentPort;
}

const PASSWD = 'root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nweb:x:33:33::/var/www:/usr/sbin/nologin\n';
const GROUP = 'root:x:0:\nsudo:x:27:user\nuser:x:1000:\ndocker:x:999:web,user\n';

describe('users of a sandbox, read from its own account files', () => {
  it('a user by name: ids, the groups that list it, its home; root even without a passwd', async () => {
    const agent = agentWith({ '/etc/passwd': PASSWD, '/etc/group': GROUP });
    expect(await lookupUser(agent, 'user')).toEqual({ name: 'user', uid: 1000, gid: 1000, groups: [27, 999], home: '/home/user' });
    expect(await lookupUser(agent, '33')).toMatchObject({ name: 'web', uid: 33, gid: 33, groups: [999] });
    expect(await lookupUser(agentWith({}), 'root')).toEqual({ name: 'root', uid: 0, gid: 0, groups: [], home: '/root' });
    expect(await lookupUser(agentWith({}), '4242')).toEqual({ name: '4242', uid: 4242, gid: 4242, groups: [], home: '/' });
    await expect(lookupUser(agent, 'root123')).rejects.toBeInstanceOf(UnknownUserError);
  });

  it('attack: hostile account files name no one they should not, and no id out of range', async () => {
    const hostile = [
      'evil:x:-1:0::/root:/bin/sh', // a negative uid
      'big:x:4294967295:0::/:/bin/sh', // (uid_t)-1: "unchanged" to setresuid
      'rel:x:5:5::relative/home:/bin/sh', // a home that is not absolute
      'short:x:6', // too few fields
      '../../x:x:7:7::/:/bin/sh', // not a name
      `${'a'.repeat(40)}:x:8:8::/:/bin/sh`, // too long a name
      'nul:x:9:9::/ho\0me:/bin/sh',
      '',
    ].join('\n');
    const agent = agentWith({ '/etc/passwd': hostile, '/etc/group': `g:x:1:${'big,'.repeat(10_000)}\n` });
    for (const name of ['evil', 'big', 'rel', 'short', '../../x', 'a'.repeat(40), 'nul', 'a b', '']) {
      await expect(lookupUser(agent, name), name).rejects.toBeInstanceOf(UnknownUserError);
    }
    // A group file listing a user in more groups than a process can hold: cut, never refused.
    const many = Array.from({ length: 100 }, (_, i) => `g${i}:x:${2000 + i}:user`).join('\n');
    const u = await lookupUser(agentWith({ '/etc/passwd': PASSWD, '/etc/group': many }), 'user');
    expect(u.groups).toHaveLength(32);
  });

  it('a database larger than the bound is read to its last whole line', async () => {
    const filler = Array.from({ length: 40_000 }, (_, i) => `u${i}:x:${10_000 + i}:${10_000 + i}::/home/u${i}:/bin/sh`).join('\n');
    const agent = agentWith({ '/etc/passwd': `${filler}\nlast:x:7:7::/:/bin/sh\n`, '/etc/group': '' });
    expect((await lookupUser(agent, 'u1')).uid).toBe(10_001);
    await expect(lookupUser(agent, 'last')).rejects.toBeInstanceOf(UnknownUserError);
  });

  it('names by id, the first entry of an id winning', async () => {
    const names = await idNames(agentWith({ '/etc/passwd': `${PASSWD}dup:x:1000:1000::/:/bin/sh\n`, '/etc/group': GROUP }));
    expect([names.users.get(0), names.users.get(1000), names.groups.get(27), names.users.get(5)]).toEqual(['root', 'user', 'sudo', undefined]);
  });
});

describe('the stat answer\'s owner line', () => {
  const stat = (s: string) => parseStat(Buffer.from(s));
  it('gives the owner\'s ids; an agent without the line gives none', () => {
    expect(stat('f\t3\t644\t1000\t\nu\t1000\t27\n')).toMatchObject({ uid: 1000, gid: 27 });
    expect(stat('f\t3\t644\t1000\t\n')).not.toHaveProperty('uid');
  });
  it('attack: an owner line out of shape is a protocol error', () => {
    for (const bad of ['u\t\t\n', 'u\t-1\t0\n', 'u\t4294967295\t0\n', 'u\t1\t2\t3\n', 'u\t1e3\t0\n', 'u\t0x10\t0\n']) {
      expect(() => stat(`f\t3\t644\t1000\t\n${bad}`), bad).toThrow(AgentProtocolError);
    }
  });
});
