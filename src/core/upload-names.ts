import { randomBytes } from 'node:crypto';

/** The name a file is uploaded under beside its own, until it is whole (FileService.writeStream). */
export function uploadNameFor(name: string): string {
  return `.${name}.upload-${randomBytes(6).toString('hex')}`;
}

/** The file an upload's temporary name (a path's last part, or a relative path) is for, if it is one. */
export function uploadTargetOf(path: string): string | undefined {
  const m = /^(.*\/)?\.(.+)\.upload-[0-9a-f]{12}$/.exec(path);
  return m ? `${m[1] ?? ''}${m[2]}` : undefined;
}
