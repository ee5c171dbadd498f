import { afterEach, describe, expect, it } from 'vitest';
import { buildOwner } from '../../src/core/build/builder.js';
import { startFakeNode, type FakeNode } from '../fakes/fake-node.js';

// A build is work for the one who asked: when the asker goes away (its request's clientGone), the
// step running is killed, the build sandbox goes, and no image is recorded.
describe('a build whose asker is gone', () => {
  let n: FakeNode | undefined;
  afterEach(async () => {
    await n?.close();
    n = undefined;
  });

  it('stops in the step it runs: the step killed, the builder gone, no image; the same build then runs through', async () => {
    n = await startFakeNode();
    const node = n;
    const asker = new AbortController();
    const builders = async () => (await node.fp.store.instances.page(buildOwner('default'), 100)).items.length;
    let stepStarted!: () => void;
    const inStep = new Promise<void>((r) => (stepStarted = r));
    const building = node.fp.builds.buildDockerfile('default', { name: 'cancelled', dockerfile: 'FROM default\nRUN sleep 100\nRUN echo after\n', signal: asker.signal }, (l) => {
      if (l.type === 'step' && l.step === 1) stepStarted();
    });
    building.catch(() => {});
    await inStep;
    // The step's command is running in the build sandbox.
    for (let i = 0; i < 100 && (await builders()) === 0; i++) await new Promise((r) => setTimeout(r, 10));
    expect(await builders()).toBe(1);
    asker.abort(new Error('the client went away before the answer'));
    await expect(building).rejects.toMatchObject({ code: 'BUILD_STEP_FAILED', message: expect.stringContaining('cancelled (the client went away') });
    expect(await builders()).toBe(0);
    const names = ((await node.call('GET', '/images')).body.images as { name: string }[]).map((i) => i.name);
    expect(names).toContain('default');
    expect(names).not.toContain('cancelled');
    // An asker gone before the first step: nothing starts.
    const gone = AbortSignal.abort(new Error('gone'));
    await expect(node.fp.builds.buildDockerfile('default', { name: 'never', dockerfile: 'FROM default\nRUN echo x\n', signal: gone })).rejects.toMatchObject({ code: 'BUILD_STEP_FAILED' });
    expect(await builders()).toBe(0);
    const ok = await node.fp.builds.buildDockerfile('default', { name: 'fine', dockerfile: 'FROM default\nRUN echo fine\n', signal: new AbortController().signal });
    expect(ok.name).toBe('fine');
  });
});
