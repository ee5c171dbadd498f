import type { LineageNode } from './api.js';
import { s } from './dom.js';

const COL = 150;
const ROW = 34;
const PAD = 14;
/** A tree larger than this is cut (the rest is said, not drawn): a page must stay usable. */
const MAX_NODES = 400;

interface Placed {
  node: LineageNode;
  x: number;
  y: number;
  parent?: Placed;
}

/** Depth across, one row per leaf; a parent sits level with its first child, as in `git log --graph`. */
function place(root: LineageNode): { placed: Placed[]; cut: number } {
  const placed: Placed[] = [];
  let rows = 0;
  let cut = 0;
  const visit = (node: LineageNode, depth: number, parent?: Placed): void => {
    if (placed.length >= MAX_NODES) {
      cut++;
      return;
    }
    const p: Placed = { node, x: depth, y: rows, parent };
    placed.push(p);
    if (node.children.length === 0) rows++;
    node.children.forEach((c) => visit(c, depth + 1, p));
    if (node.children.length > 0 && rows === p.y) rows++;
  };
  visit(root, 0);
  return { placed, cut };
}

function short(n: LineageNode): string {
  const text = n.label ?? n.id;
  return text.length > 16 ? `${text.slice(0, 15)}…` : text;
}

/**
 * The tree of an instance's family, as SVG: instances as boxes (a click opens one), checkpoints as
 * dots, each fork under the checkpoint it came from.
 */
export function drawLineage(root: LineageNode, current: string, open: (id: string) => void): SVGElement {
  const { placed, cut } = place(root);
  const width = (Math.max(...placed.map((p) => p.x)) + 1) * COL + PAD * 2;
  const height = (Math.max(...placed.map((p) => p.y)) + 1) * ROW + PAD * 2 + (cut ? ROW : 0);
  const svg = s('svg', { class: 'lineage', viewBox: `0 0 ${width} ${height}`, width, height, 'data-testid': 'lineage', 'data-nodes': placed.length });
  const cx = (p: Placed) => PAD + p.x * COL + 8;
  const cy = (p: Placed) => PAD + p.y * ROW + 12;
  for (const p of placed) {
    if (!p.parent) continue;
    const [x1, y1, x2, y2] = [cx(p.parent), cy(p.parent), cx(p), cy(p)];
    svg.append(s('path', { class: 'edge', d: `M${x1},${y1} C${x1 + COL / 2},${y1} ${x2 - COL / 2},${y2} ${x2},${y2}` }));
  }
  for (const p of placed) {
    const n = p.node;
    const title = s('title', {}, `${n.kind} ${n.id}${n.label ? ` (${n.label})` : ''}: ${n.status}`);
    if (n.kind === 'instance') {
      const g = s('g', {
        class: `node-instance${n.id === current ? ' current' : ''}`, 'data-kind': 'instance', 'data-id': n.id, 'data-status': n.status,
        role: 'link', tabindex: 0, 'aria-label': `instance ${n.label ?? n.id}, ${n.status}`,
        onclick: () => open(n.id),
        onkeydown: (e: Event) => {
          if ((e as KeyboardEvent).key === 'Enter') open(n.id);
        },
      },
        title,
        s('rect', { x: cx(p) - 8, y: cy(p) - 11, width: COL - 24, height: 22, rx: 5 }),
        s('text', { x: cx(p) - 2, y: cy(p) + 4 }, short(n)));
      svg.append(g);
    } else {
      svg.append(s('g', { class: `node-checkpoint ${n.status}`, 'data-kind': 'checkpoint', 'data-id': n.id, 'data-status': n.status },
        title,
        s('circle', { cx: cx(p), cy: cy(p), r: 6 }),
        s('text', { x: cx(p) + 12, y: cy(p) + 4 }, short(n))));
    }
  }
  if (cut) svg.append(s('text', { x: PAD, y: height - PAD }, `… and ${cut} more not drawn`));
  return svg;
}
