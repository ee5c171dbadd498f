import { describe, expect, it } from 'vitest';
import { ensureNodeImage, NODE_IMAGE, podman } from './helpers/node-image.js';

// The node image builds from deploy/Containerfile (helpers/node-image.ts), while the other files
// run; test/node-container.test.ts, which runs alone after them, runs it as the DaemonSet does.
describe('the node image', () => {
  it('builds from deploy/Containerfile on the set-up\'s Debian image, and runs `forkpoint serve` by default', async () => {
    await ensureNodeImage();
    const config = JSON.parse((await podman('image', 'inspect', NODE_IMAGE, '--format', '{{json .Config}}')).stdout) as { Entrypoint: string[]; Cmd: string[]; Env: string[] };
    expect(config.Entrypoint).toEqual(['node', '/opt/forkpoint/src/dist/cli.js']);
    expect(config.Cmd).toEqual(['serve']);
    expect(config.Env).toContain('FORKPOINT_DATA_DIR=/var/lib/forkpoint');
  }, 600_000);
});
