// The JavaScript and TypeScript side of kernel.py: one process per context, reading a cell a
// line ({"code", "env", "typescript"}) from stdin and answering E2B's NDJSON messages on stdout, then
// {"type": "end_of_cell"}. State lives in one vm context for the process's life. A cell with
// `await` (static imports become dynamic ones) runs as an async function: its value is its last
// expression's, and its declarations stay its own.
'use strict';
const vm = require('node:vm');
const util = require('node:util');
const readline = require('node:readline');

const send = (msg) => process.stdout.write(`${JSON.stringify(msg)}\n`);
const text = (args) => `${args.map((a) => (typeof a === 'string' ? a : util.inspect(a))).join(' ')}\n`;
const out = (type) => (...a) => {
  send({ type, text: text(a) });
};
const sandboxConsole = { log: out('stdout'), info: out('stdout'), debug: out('stdout'), warn: out('stderr'), error: out('stderr') };
const context = vm.createContext({ console: sandboxConsole, process, require, Buffer, URL, URLSearchParams, setTimeout, clearTimeout, setInterval, clearInterval, fetch, structuredClone, TextEncoder, TextDecoder });
const load = (spec) => import(spec);

// Babel as Debian packages it (node-babel7): loaded on a TypeScript context's first cell.
const BABEL = '/usr/share/nodejs/@babel';
let babel;

/** TypeScript as the JavaScript it runs as: its types removed, nothing else changed. */
function stripTypes(code) {
  babel ??= require(`${BABEL}/core`);
  return babel.transformSync(code, {
    filename: 'cell.ts',
    babelrc: false,
    configFile: false,
    presets: [[`${BABEL}/preset-typescript`, { onlyRemoveTypeImports: true }]],
    parserOpts: { allowAwaitOutsideFunction: true },
    retainLines: true,
  }).code;
}

function staticImports(code) {
  return code
    .replace(/^\s*import\s+\*\s+as\s+(\w+)\s+from\s+(['"][^'"]+['"]);?/gm, 'const $1 = await __fp_import($2);')
    .replace(/^\s*import\s+(\{[^}]*\})\s+from\s+(['"][^'"]+['"]);?/gm, (_, names, spec) => `const ${names.replace(/\s+as\s+/g, ': ')} = await __fp_import(${spec});`)
    .replace(/^\s*import\s+(\w+)\s*,\s*(\{[^}]*\})\s+from\s+(['"][^'"]+['"]);?/gm, (_, def, names, spec) => `const { default: ${def}, ...__fp_rest } = await __fp_import(${spec}); const ${names.replace(/\s+as\s+/g, ': ')} = __fp_rest;`)
    .replace(/^\s*import\s+(\w+)\s+from\s+(['"][^'"]+['"]);?/gm, 'const $1 = (await __fp_import($2)).default;')
    .replace(/^\s*import\s+(['"][^'"]+['"]);?/gm, 'await __fp_import($1);');
}

/** The code as an async function's body, its last expression statement returned. */
function asyncBody(code) {
  const lines = code.replace(/\s+$/, '').split('\n');
  const last = lines.length - 1;
  const tail = lines[last].trim().replace(/;$/, '');
  if (tail && !/^(const|let|var|if|for|while|return|function|class|throw|try|switch|import|export|\}|\/\/)/.test(tail)) {
    lines[last] = `return (${tail});`;
  }
  return `(async () => {\n${lines.join('\n')}\n})()`;
}

function plain(value) {
  const s = typeof value === 'string' ? value : util.inspect(value);
  return s;
}

async function run(cell) {
  const saved = {};
  for (const [k, v] of Object.entries(cell.env || {})) {
    saved[k] = process.env[k];
    process.env[k] = String(v);
  }
  try {
    let code = staticImports(cell.typescript ? stripTypes(cell.code || '') : cell.code || '');
    context.__fp_import = load;
    let value;
    if (/\bawait\b/.test(code)) value = await vm.runInContext(asyncBody(code), context, { filename: 'cell.js' });
    else value = vm.runInContext(code, context, { filename: 'cell.js' });
    if (value !== undefined) send({ type: 'result', is_main_result: true, text: plain(value) });
  } catch (err) {
    const e = err instanceof Error ? err : new Error(String(err));
    send({ type: 'error', name: e.name, value: e.message, traceback: e.stack || '' });
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    send({ type: 'end_of_cell' });
  }
}

// Cells one at a time, in order.
let chain = Promise.resolve();
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  chain = chain.then(() => run(JSON.parse(line)));
});
process.on('SIGINT', () => process.exit(130));
