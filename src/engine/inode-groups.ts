import { statfs } from 'node:fs/promises';
import { runWithin } from './run.js';

const EXT_SUPER_MAGIC = 0xef53;
/** A `chattr` past it (a filesystem that hangs) is left behind and the server starts unmarked. */
const CHATTR_DEADLINE_MS = 10_000;

/**
 * Spreads the directories made under `dirs` (one per instance, per checkpoint) over ext4's block
 * groups, by marking `dirs` top directories (`chattr +T`: the Orlov allocator places each new
 * subdirectory in a group of its own choosing, and the files in it near it).
 *
 * Why: on an ext4 without a journal the kernel will not reuse an inode freed in the last 60 to
 * 360 s, and finds a free one by reading, one by one, every such inode from the start of the
 * group (`find_inode_bit` → `recently_deleted`). Every instance, fork and checkpoint creates and
 * later deletes a dozen inodes; left in their parent's group they pile up there, and each new
 * inode of a burst of forks cost ~1 ms of kernel CPU (perf of bench/fork-many.ts: 18 % of the
 * host's CPU in `__ext4_new_inode`). Spread, each group sees a few. Elsewhere (a journal, xfs,
 * btrfs) the flag is not asked for; a filesystem that refuses it costs nothing but a warning.
 */
export async function spreadAcrossGroups(dirs: readonly string[], opts: { chattr?: string; deadlineMs?: number } = {}): Promise<{ marked: string[]; failed?: string }> {
  const ext: string[] = [];
  for (const d of dirs) if ((await statfs(d)).type === EXT_SUPER_MAGIC) ext.push(d);
  if (!ext.length) return { marked: [] };
  const r = await runWithin(opts.chattr ?? 'chattr', ['+T', ...ext], opts.deadlineMs ?? CHATTR_DEADLINE_MS, 'chattr');
  return r.code === 0 ? { marked: ext } : { marked: [], failed: r.stderr.trim() || `chattr exited ${r.code}` };
}
