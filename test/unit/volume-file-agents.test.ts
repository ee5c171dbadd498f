import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { VolumeFileAgents } from '../../src/engine/volume-file-agents.js';

describe('volume file agents', () => {
  it('start none for a volume being removed (its mount would make the removal fail as busy), and again once it is over', async () => {
    // An agent that is no program: any call that starts one fails, which tells that it started.
    const agents = new VolumeFileAgents('/nonexistent/fp-agent', pino({ level: 'silent' }));
    let finish!: () => void;
    const removal = agents.whileRemoving('vol_a', () => new Promise<void>((r) => (finish = r)));
    await new Promise((r) => setImmediate(r));
    await expect(agents.call('vol_a', '/nowhere', async () => 'served')).rejects.toMatchObject({ code: 'VOLUME_NOT_HERE' });
    finish();
    await removal;
    await expect(agents.call('vol_a', '/nowhere', async (a) => a.ping())).rejects.not.toMatchObject({ code: 'VOLUME_NOT_HERE' });
    await agents.endAll();
  });
});
