/**
 * Puts the tables of one `npm run bench` into the README: `npx tsx scripts/bench-tables.ts
 * BENCH_OUTPUT [README.md]`. A README table is replaced by the bench table whose rows name the same
 * operations (the first column, in the same order); the prose around it is left for a person to
 * read again. Prints what it replaced and which bench tables found no place.
 */
import { readFileSync, writeFileSync } from 'node:fs';

interface Table {
  /** Line index of the header row, and one past the last row. */
  start: number;
  end: number;
  labels: string[];
}

/** Markdown tables: a header row, a separator row of dashes, then rows, each line starting `|`. */
function tablesOf(lines: string[]): Table[] {
  const found: Table[] = [];
  for (let i = 0; i + 1 < lines.length; i++) {
    if (!lines[i]!.startsWith('|') || !/^\|[\s:|-]+\|$/.test(lines[i + 1]!.trim())) continue;
    let end = i + 2;
    while (end < lines.length && lines[end]!.startsWith('|')) end++;
    const labels = lines.slice(i + 2, end).map((l) => l.split('|')[1]!.trim());
    found.push({ start: i, end, labels });
    i = end - 1;
  }
  return found;
}

const [outputFile, readmeFile = 'README.md'] = process.argv.slice(2);
if (!outputFile) {
  console.error('usage: tsx scripts/bench-tables.ts BENCH_OUTPUT [README.md]');
  process.exit(2);
}
// A bench's console output may carry colour codes.
const output = readFileSync(outputFile, 'utf8').replace(/\x1b\[[0-9;]*m/g, '').split('\n');
const readme = readFileSync(readmeFile, 'utf8').split('\n');
const fresh = tablesOf(output);
const same = (a: string[], b: string[]) => a.length === b.length && a.every((x, i) => x === b[i]);
// From the end, so that replacing one table leaves the line numbers of those before it.
let replaced = 0;
const used = new Set<Table>();
for (const old of tablesOf(readme).reverse()) {
  const match = fresh.find((t) => same(t.labels, old.labels));
  if (!match) continue;
  used.add(match);
  readme.splice(old.start, old.end - old.start, ...output.slice(match.start, match.end));
  replaced++;
}
writeFileSync(readmeFile, readme.join('\n'));
console.log(`${replaced} README tables replaced from ${outputFile}`);
for (const t of fresh.filter((x) => !used.has(x))) console.log(`no place in ${readmeFile} for the table starting "${t.labels[0] ?? ''}" (output line ${t.start + 1})`);
