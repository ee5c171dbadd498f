import { readFile } from 'node:fs/promises';
import { run } from './run.js';
import { EngineError } from '../seam/errors.js';

/** The kernel cuts mount options at one page, silently: check before, verify after. */
export const MAX_MOUNT_OPTIONS = 4095;
export const MAX_LOWER_LAYERS = 500;

export interface OverlaySpec {
  /** Lower dirs, newest first, relative to `cwd` where possible to keep the option short. */
  lowers: string[];
  upper: string;
  work: string;
  target: string;
  cwd: string;
}

/** `index=off` whatever the kernel's default: a checkpoint mounts the frozen upper as a lower
 * while the old overlay, pinned until the restore is done, still has it as its upper. */
export function overlayOptions(spec: OverlaySpec): string {
  return `lowerdir=${spec.lowers.join(':')},upperdir=${spec.upper},workdir=${spec.work},index=off`;
}

/** Mounts and unmounts through the static helper: direct syscalls, a fraction of mount(8)'s
 * start-up. A sandbox's own disk is mounted by the helper that starts it (`helperArgs`). */
export class Mounter {
  constructor(private readonly helper: string) {}

  /** The arguments `fp-agent boot` and `criu-run` take to mount a sandbox's disk themselves
   * (`--overlay DIR [TARGET] OPTIONS`), checked against the kernel's limits first. */
  static helperArgs(spec: OverlaySpec, withTarget: boolean): string[] {
    if (spec.lowers.length > MAX_LOWER_LAYERS) {
      throw new EngineError('LAYER_LIMIT', `${spec.lowers.length} lower layers exceed the kernel's ${MAX_LOWER_LAYERS}`);
    }
    const options = overlayOptions(spec);
    if (options.length > MAX_MOUNT_OPTIONS) {
      throw new EngineError('LAYER_LIMIT', `overlay options are ${options.length} bytes, over the kernel's ${MAX_MOUNT_OPTIONS}`);
    }
    return ['--overlay', spec.cwd, ...(withTarget ? [spec.target] : []), options];
  }

  /** A read-only overlay of lower layers only, for reading their merged view. */
  async mountReadOnly(lowers: string[], target: string, cwd: string): Promise<void> {
    const options = `lowerdir=${lowers.join(':')}`;
    if (options.length > MAX_MOUNT_OPTIONS) throw new EngineError('LAYER_LIMIT', `overlay options are ${options.length} bytes`);
    const r = await run(this.helper, ['mount-overlay', cwd, target, options]);
    if (r.code !== 0) throw new EngineError('MOUNT_FAILED', r.stderr.trim());
  }

  async unmount(target: string): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      if (!(await isMounted(target))) return;
      const r = await run(this.helper, ['umount', target]);
      if (r.code === 0) return;
      if (attempt >= 100) throw new EngineError('UNMOUNT_FAILED', r.stderr.trim());
      // A dying sandbox may still pin the mount for a moment after SIGKILL.
      await new Promise((res) => setTimeout(res, 10));
    }
  }
}

export interface MountEntry {
  mountPoint: string;
  fsType: string;
  superOptions: string;
}

/** Mount points in this process's namespace, from /proc/self/mountinfo. */
export async function mounts(): Promise<MountEntry[]> {
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  return text
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const [pre, post] = line.split(' - ');
      const fields = pre!.split(' ');
      const [fsType, , superOptions] = post!.split(' ');
      return { mountPoint: unescapeMount(fields[4]!), fsType: fsType!, superOptions: superOptions ?? '' };
    });
}

const unescapeMount = (s: string): string => s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));

export async function mountInfo(target: string): Promise<MountEntry | undefined> {
  return (await mounts()).filter((m) => m.mountPoint === target).pop();
}

export async function isMounted(target: string): Promise<boolean> {
  return (await mountInfo(target)) !== undefined;
}
