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
