import type { ImageConfig } from '../../store/images.js';

/** What a build does, whatever it was written in (a Dockerfile, an OpenComputer image
 * manifest). `line` is where it was written (null: not in a file); `text` is the step as shown
 * in the build log and hashed into the cache key. */
interface StepBase {
  line: number | null;
  text: string;
}

export type BuildStep =
  /** A command in the build sandbox; `env` is added to the image's (build arguments). */
  | (StepBase & { kind: 'run'; argv: string[]; env: Record<string, string> })
  /** Files of the build context, at `dest` (Docker's COPY rules); ADD unpacks local archives. */
  | (StepBase & { kind: 'copy'; sources: string[]; dest: string; chown: string | null; unpack: boolean })
  /** A file fetched from a URL inside the build sandbox (ADD <url>). */
  | (StepBase & { kind: 'download'; url: string; dest: string; chown: string | null })
  /** Files given whole (an image manifest's add_file and add_dir). */
  | (StepBase & { kind: 'write'; files: { path: string; content: Buffer }[] })
  | (StepBase & { kind: 'workdir'; path: string })
  /** VOLUME: the directories made (as root, where missing) and named in the configuration. */
  | (StepBase & { kind: 'volume'; paths: string[] })
  /** Only the image's configuration changes (ENV, USER, CMD, LABEL, EXPOSE, ...). */
  | (StepBase & { kind: 'config'; apply: (c: ImageConfig) => ImageConfig });

export interface BuildPlan {
  /** A forkpoint image (a rootfs directory or a built one) or a template. */
  from: string;
  fromLine: number | null;
  steps: BuildStep[];
}

/** Whether a step changes files (and so is run in a sandbox and frozen into a layer). */
export const changesFiles = (s: BuildStep): boolean => s.kind !== 'config';
