/** What the CLI prints: tables and trees for people, JSON for scripts, colours only on a
 * terminal (and never with NO_COLOR). */

const colourful = () => process.stdout.isTTY === true && !process.env.NO_COLOR;

const paint = (code: number) => (s: string) => (colourful() ? `\x1b[${code}m${s}\x1b[0m` : s);
export const dim = paint(2);
export const bold = paint(1);
const green = paint(32);
const yellow = paint(33);
const red = paint(31);

/** A status in the colour it deserves. */
export function status(s: string): string {
  if (['running', 'ready'].includes(s)) return green(s);
  if (['processing', 'starting', 'hibernated', 'stopped'].includes(s)) return yellow(s);
  if (['error', 'failed', 'lost'].includes(s)) return red(s);
  return s;
}

const visible = (s: string) => s.replace(/\x1b\[[0-9;]*m/g, '').length;

/** A table with a header line, columns as wide as their widest cell. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => visible(r[i] ?? ''))));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c + ' '.repeat(widths[i]! - visible(c)))).join('  ').trimEnd();
  return [line(header.map((h) => bold(h))), ...rows.map(line)].join('\n') + '\n';
}

export function printJson(v: unknown): void {
  process.stdout.write(`${JSON.stringify(v, null, 2)}\n`);
}

export interface TreeNode {
  kind: string;
  id: string;
  label: string | null;
  status: string;
  children: TreeNode[];
}

/** The lineage as a tree: instances and the checkpoints taken of them, forks under theirs. */
export function tree(root: TreeNode): string {
  const out: string[] = [];
  const name = (n: TreeNode) => `${n.kind === 'checkpoint' ? '◆' : '●'} ${n.label ? `${n.label} ` : ''}${dim(n.id)} ${status(n.status)}`;
  const walk = (n: TreeNode, prefix: string, last: boolean, top: boolean) => {
    out.push(top ? name(n) : `${prefix}${last ? '└── ' : '├── '}${name(n)}`);
    const next = top ? '' : `${prefix}${last ? '    ' : '│   '}`;
    n.children.forEach((c, i) => walk(c, next, i === n.children.length - 1, false));
  };
  walk(root, '', true, true);
  return out.join('\n') + '\n';
}

/** A size as people read it. */
export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) (v /= 1024), u++;
  return `${u ? v.toFixed(1) : v} ${units[u]}`;
}

/** How long ago an ISO time was, briefly. */
export function ago(iso: string | null | undefined): string {
  if (!iso) return '-';
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.round(s)}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}
