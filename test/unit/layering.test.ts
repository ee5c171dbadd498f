import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

// The architecture as the imports show it: data flows route -> core -> seam <- engine, with the
// store beside the core and lib under everything. A change that reaches across fails here.
const SRC = resolve(import.meta.dirname, '../../src');

function modules(): Map<string, { to: string; typeOnly: boolean }[]> {
  const out = new Map<string, { to: string; typeOnly: boolean }[]>();
  const walk = (d: string) => {
    for (const e of readdirSync(d)) {
      const p = join(d, e);
      if (statSync(p).isDirectory()) walk(p);
      else if (p.endsWith('.ts')) {
        const deps = [...readFileSync(p, 'utf8').matchAll(/^(?:import|export)\s+(type\s+)?[^'"]*?from\s+'(\.[^']+)'/gm)].map((m) => ({
          to: relative(SRC, resolve(dirname(p), m[2]!.replace(/\.js$/, '.ts'))),
          typeOnly: Boolean(m[1]),
        }));
        out.set(relative(SRC, p), deps);
      }
    }
  };
  walk(SRC);
  return out;
}

const layerOf = (path: string) => (path.includes('/') ? path.split('/')[0]! : path);
const graph = modules();

/** Imports from `from` layer into any of `to` layers: "file -> target". */
const crossing = (from: string, to: string[]) =>
  [...graph].flatMap(([file, deps]) => (layerOf(file) === from ? deps.filter((d) => to.includes(layerOf(d.to))).map((d) => `${file} -> ${d.to}`) : []));

describe('the layers', () => {
  it('found the source', () => {
    expect(graph.size).toBeGreaterThan(100);
    expect(crossing('core', ['store']).length).toBeGreaterThan(0); // the check sees imports at all
  });

  it('the core knows the engine only through the seam: no import of src/engine, not even a type', () => {
    expect(crossing('core', ['engine'])).toEqual([]);
  });

  it('the HTTP faces talk to the core, never to the engine', () => {
    expect(crossing('http', ['engine'])).toEqual([]);
  });

  it('the seam is interfaces and plain data: it imports nothing but lib', () => {
    expect(crossing('seam', ['engine', 'core', 'http', 'store'])).toEqual([]);
  });

  it('the engine knows nothing of HTTP, the core or the store', () => {
    expect(crossing('engine', ['core', 'http', 'store'])).toEqual([]);
  });

  it('the store and lib stand below the core', () => {
    expect(crossing('store', ['core', 'http', 'engine'])).toEqual([]);
    expect(crossing('lib', ['core', 'http', 'engine', 'store', 'seam'])).toEqual([]);
  });

  it('no import loop anywhere in src, type imports included', () => {
    const index = new Map<string, number>();
    const low = new Map<string, number>();
    const stack: string[] = [];
    const onStack = new Set<string>();
    const loops: string[][] = [];
    let next = 0;
    const visit = (v: string) => {
      index.set(v, next);
      low.set(v, next++);
      stack.push(v);
      onStack.add(v);
      for (const { to } of graph.get(v) ?? []) {
        if (!graph.has(to)) continue;
        if (!index.has(to)) {
          visit(to);
          low.set(v, Math.min(low.get(v)!, low.get(to)!));
        } else if (onStack.has(to)) low.set(v, Math.min(low.get(v)!, index.get(to)!));
      }
      if (low.get(v) === index.get(v)) {
        const loop: string[] = [];
        let w: string;
        do {
          w = stack.pop()!;
          onStack.delete(w);
          loop.push(w);
        } while (w !== v);
        if (loop.length > 1) loops.push(loop);
      }
    };
    for (const v of graph.keys()) if (!index.has(v)) visit(v);
    expect(loops).toEqual([]);
  });
});
