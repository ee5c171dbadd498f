/** Where a volume may be mounted in a sandbox: an absolute path of plain names (no `.` or `..`,
 * no `]`, `:` or `,`, which CRIU's external-mount syntax reserves), outside what forkpoint mounts
 * itself (`/proc`, `/dev`, `/sys`, `/.fp`) and not `/` or `/tmp`, at most 8 deep and 255 bytes. */
export const VOLUME_PATH = /^(\/[A-Za-z0-9_@+=~-][A-Za-z0-9._@+=~-]{0,127}){1,8}$/;

const RESERVED = ['/proc', '/dev', '/sys', '/.fp', '/tmp'];

/** Why `path` cannot be a volume's mount point, or undefined if it can. */
export function volumePathProblem(path: string): string | undefined {
  if (path.length > 255 || !VOLUME_PATH.test(path)) return 'an absolute path of plain names (letters, digits, . _ - @ + = ~; no . or .. component), at most 8 deep and 255 bytes';
  if (path.split('/').some((c) => c === '.' || c === '..')) return 'no . or .. component';
  const top = RESERVED.find((r) => path === r || path.startsWith(`${r}/`));
  if (top) return `${top} is the sandbox's own`;
  return undefined;
}

/** Whether one of the paths is another's or under it (volumes do not nest). */
export function nestedVolumePaths(paths: string[]): [string, string] | undefined {
  for (const a of paths) for (const b of paths) if (a !== b && b.startsWith(`${a}/`)) return [a, b];
  const seen = new Set<string>();
  for (const p of paths) {
    if (seen.has(p)) return [p, p];
    seen.add(p);
  }
  return undefined;
}

/** How many paths of its own disk a sandbox mounts on themselves (its image's VOLUMEs). */
export const MAX_OWN_MOUNTS = 16;

/** The image's VOLUME paths a sandbox mounts on themselves: not one a persistent volume takes (at
 * it, over it or under it), nor one under another (one mount point holds both). */
export function ownMountsOf(imageVolumes: string[], volumePaths: string[]): string[] {
  const clash = (a: string, b: string) => a === b || a.startsWith(`${b}/`) || b.startsWith(`${a}/`);
  const free = imageVolumes.filter((p) => !volumePaths.some((v) => clash(p, v)));
  return free.filter((p) => !free.some((q) => q !== p && p.startsWith(`${q}/`))).slice(0, MAX_OWN_MOUNTS);
}
