import { describe, expect, it } from 'vitest';
import { parseDockerfile } from '../../src/core/build/dockerfile.js';
import { DockerfileError } from '../../src/core/errors.js';
import { ownMountsOf } from '../../src/lib/volume-path.js';

describe('VOLUME', () => {
  it('takes the JSON and the plain form, variables expanded, trailing slashes dropped', () => {
    const plan = parseDockerfile('FROM debian\nARG ROOT=/srv\nVOLUME ["/workspace", "${ROOT}/data/"]\nVOLUME /a /b\n');
    expect(plan.steps.map((s) => (s.kind === 'volume' ? s.paths : s.kind))).toEqual([['/workspace', '/srv/data'], ['/a', '/b']]);
  });

  it('refuses, with its line, a path that cannot be a mount point of the sandbox\'s own', () => {
    for (const bad of ['VOLUME', 'VOLUME relative', 'VOLUME /proc/sys', 'VOLUME /.fp/x', 'VOLUME /a/../b', 'VOLUME /', 'VOLUME ["/a,b"]']) {
      let err: unknown;
      try {
        parseDockerfile(`FROM debian\n${bad}\n`);
      } catch (e) {
        err = e;
      }
      expect(err, bad).toBeInstanceOf(DockerfileError);
      expect((err as DockerfileError).details, bad).toMatchObject({ line: 2 });
    }
  });

  it('mounts at boot only what no persistent volume takes and no other of them holds', () => {
    expect(ownMountsOf(['/workspace', '/workspace/cache', '/srv', '/data'], ['/data/x', '/srv'])).toEqual(['/workspace']);
    expect(ownMountsOf(['/a'], [])).toEqual(['/a']);
  });
});
