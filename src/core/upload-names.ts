import { randomBytes } from 'node:crypto';

/** The name a file is uploaded under beside its own, until it is whole (FileService.writeStream);
 * `fresh` when no file had that name as the upload began. The name says it because the watches
 * tell the two apart as envd does (a new file is created, then written) and, once renamed, the
 * file itself cannot say whether it replaced one. */
export function uploadNameFor(name: string, fresh: boolean): string {
  return `.${name}.upload-${fresh ? 'new-' : ''}${randomBytes(6).toString('hex')}`;
}

export interface UploadTarget {
  /** The file's own name (the path's last part, or the relative path, as given). */
  target: string;
  fresh: boolean;
}

/** The file an upload's temporary name (a path's last part, or a relative path) is for, if it is one. */
export function uploadTargetOf(path: string): UploadTarget | undefined {
  const m = /^(.*\/)?\.(.+)\.upload-(new-)?[0-9a-f]{12}$/.exec(path);
  return m ? { target: `${m[1] ?? ''}${m[2]}`, fresh: m[3] !== undefined } : undefined;
}
