import type { FastifyDynamicSwaggerOptions } from '@fastify/swagger';
import { jsonSchemaTransform, jsonSchemaTransformObject } from 'fastify-type-provider-zod';

/** Which rendition of the document: 3.1 (the contract) or 3.0.3 (for generators and gateways
 * that read only 3.0; the same routes, with `nullable` and `example`). */
export type OpenApiVersion = '3.1.0' | '3.0.3';

export interface DocumentOptions {
  version: string;
  openapi: OpenApiVersion;
  /** The address this server answers on: the document's `servers`. */
  host: string;
  port: number;
}

type Json = Record<string, unknown>;

const TAGS = [
  { name: 'instances', description: 'Sandboxes: create, list, rename, stop, start, delete.' },
  { name: 'exec', description: 'Run commands and wait for them; persistent shell sessions.' },
  { name: 'processes', description: 'Background processes with a bounded scrollback.' },
  { name: 'checkpoints', description: 'Checkpoints (files, memory and processes), rollback in place, forks, lineage.' },
  { name: 'files', description: 'Files inside an instance, streamed both ways.' },
  { name: 'secrets', description: 'Secrets your instances\' requests carry to the hosts you name, put in by the egress proxy: the sandbox sees a placeholder only.' },
  { name: 'volumes', description: 'Persistent volumes: size-limited filesystems that outlive instances, mounted by several, never part of a checkpoint.' },
  { name: 'health', description: 'Whether the server and its engine are there.' },
  { name: 'opencomputer', description: 'The OpenComputer-compatible face under /api: what `@opencomputer/sdk` calls. camelCase; errors as `{"error": "message"}`.' },
];

/** The address for clients: an unspecified listen address is reached as localhost. */
export function serverUrl(host: string, port: number): string {
  const h = host === '0.0.0.0' || host === '::' ? 'localhost' : host.includes(':') ? `[${host}]` : host;
  return `http://${h}:${port}`;
}

export function swaggerOptions(opts: DocumentOptions): FastifyDynamicSwaggerOptions {
  return {
    openapi: {
      openapi: opts.openapi,
      info: {
        title: 'forkpoint',
        version: opts.version,
        description:
          'Self-hosted Linux sandboxes with instant checkpoints, rollback and fork.\n\n' +
          'Authenticate with `Authorization: Bearer <token>` or `X-API-Key: <token>`. Every route of the Firecase-style face also answers under `/v1` ' +
          '(`/v1/instances`, ...). Every failure is `{"error": {"code", "message", "details"}}` with a stable code ' +
          '(under `/api`: `{"error": "message"}`).',
        license: { name: 'Apache-2.0', identifier: 'Apache-2.0' },
        contact: { name: 'forkpoint', url: 'https://github.com/forkpoint/forkpoint' },
      },
      servers: [{ url: serverUrl(opts.host, opts.port), description: 'this server' }],
      tags: TAGS,
      components: {
        securitySchemes: {
          bearer: { type: 'http', scheme: 'bearer', description: 'a forkpoint token: `forkpoint token create`' },
          apiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key', description: 'the same token, as OpenComputer\'s SDK sends it' },
        },
      },
      security: [{ bearer: [] }, { apiKey: [] }],
    },
    transform: jsonSchemaTransform,
    transformObject: (doc) => finish(jsonSchemaTransformObject(doc) as Json, opts.openapi),
  };
}

/** What @fastify/swagger cannot say by itself: bodies that may be left out, 204s without a body;
 * and for 3.0, the
 * `example` keyword where JSON Schema 2020-12 has `examples`; and a license without 3.1's
 * `identifier`. */
function finish(doc: Json, openapi: OpenApiVersion): Json {
  foldInputSchemas(doc);
  for (const item of Object.values((doc.paths ?? {}) as Record<string, Record<string, Json>>)) {
    for (const op of Object.values(item)) {
      if (!op || typeof op !== 'object') continue;
      // A 204 has no body (the 3.0 target would describe z.null() as a JSON "null").
      const noContent = (op.responses as Record<string, Json> | undefined)?.['204'];
      if (noContent) delete noContent.content;
      if (!('x-optional-body' in op)) continue;
      delete op['x-optional-body'];
      if (op.requestBody) (op.requestBody as Json).required = false;
    }
  }
  if (openapi === '3.0.3') {
    const info = doc.info as Json;
    const license = info.license as Json;
    delete license.identifier;
    license.url = 'https://www.apache.org/licenses/LICENSE-2.0';
    singleExamples(doc.components);
    singleExamples(doc.paths);
    openMaps(doc.components);
    openMaps(doc.paths);
    doc.components = bareRefs(doc.components);
    doc.paths = bareRefs(doc.paths);
  }
  return doc;
}

/** OpenAPI 3.0's schema objects take one `example`; 2020-12's `examples` is a list. */
function singleExamples(node: unknown): void {
  if (Array.isArray(node)) return node.forEach(singleExamples);
  if (!node || typeof node !== 'object') return;
  const o = node as Json;
  if (Array.isArray(o.examples) && ('type' in o || 'properties' in o || '$ref' in o || 'anyOf' in o || 'oneOf' in o || 'enum' in o)) {
    if (o.examples.length) o.example = o.examples[0];
    delete o.examples;
  }
  for (const v of Object.values(o)) singleExamples(v);
}

const REF = '#/components/schemas/';

/** Rewrites every `$ref` to a component schema through `rename`. */
function renameRefs(node: unknown, rename: (name: string) => string): unknown {
  if (Array.isArray(node)) return node.map((n) => renameRefs(n, rename));
  if (!node || typeof node !== 'object') return node;
  const out: Json = {};
  for (const [k, v] of Object.entries(node as Json)) {
    out[k] = k === '$ref' && typeof v === 'string' && v.startsWith(REF) ? REF + rename(v.slice(REF.length)) : renameRefs(v, rename);
  }
  return out;
}

function refsIn(node: unknown, into: Set<string>): void {
  if (Array.isArray(node)) return node.forEach((n) => refsIn(n, into));
  if (!node || typeof node !== 'object') return;
  for (const [k, v] of Object.entries(node as Json)) {
    if (k === '$ref' && typeof v === 'string' && v.startsWith(REF)) into.add(v.slice(REF.length));
    else refsIn(v, into);
  }
}

/**
 * The zod provider registers every named schema twice, as it is read (`XInput`) and as it is
 * written (`X`). Where the two say the same, or only one of them is used, one component named
 * `X` is kept; a pair that really differs keeps both. Components nothing refers to go.
 */
function foldInputSchemas(doc: Json): void {
  const components = doc.components as Json | undefined;
  const schemas = (components?.schemas ?? {}) as Json;
  const used = new Set<string>();
  refsIn(doc.paths, used);
  for (let grew = true; grew; ) {
    const before = used.size;
    for (const name of [...used]) refsIn(schemas[name], used);
    grew = used.size > before;
  }
  const toBase = (n: string) => (n.endsWith('Input') && n.slice(0, -5) in schemas ? n.slice(0, -5) : n);
  const same = (a: string, b: string) => JSON.stringify(renameRefs(schemas[a], toBase)) === JSON.stringify(renameRefs(schemas[b], toBase));
  const rename = new Map<string, string>();
  for (const name of Object.keys(schemas)) {
    if (!name.endsWith('Input') || !used.has(name)) continue;
    const base = name.slice(0, -5);
    if (!(base in schemas)) continue;
    if (!used.has(base) || same(name, base)) rename.set(name, base);
  }
  const renamed = (n: string) => rename.get(n) ?? n;
  const kept: Json = {};
  for (const name of Object.keys(schemas)) {
    const target = renamed(name);
    const wanted = used.has(name) || [...rename].some(([from, to]) => to === name && used.has(from));
    if (!wanted || (rename.has(name) && used.has(target) && target !== name)) continue;
    // An input folded into an unused output takes the output's name, with its own content.
    const source = rename.has(name) ? name : [...rename].find(([from, to]) => to === name && !used.has(name))?.[0] ?? name;
    kept[target] = renameRefs(schemas[source], renamed);
  }
  if (components) components.schemas = Object.fromEntries(Object.entries(kept).sort(([a], [b]) => a.localeCompare(b)));
  doc.paths = renameRefs(doc.paths, renamed);
}

/** A map of anything: `additionalProperties: true` says it in a way every 3.0 generator reads
 * (an empty schema there is taken for a model called Object). */
function openMaps(node: unknown): void {
  if (Array.isArray(node)) return node.forEach(openMaps);
  if (!node || typeof node !== 'object') return;
  const o = node as Json;
  const ap = o.additionalProperties;
  if (ap && typeof ap === 'object' && !Array.isArray(ap) && Object.keys(ap).length === 0) o.additionalProperties = true;
  for (const v of Object.values(o)) openMaps(v);
}

/** 3.0 allows nothing beside a `$ref`, so zod wraps one in `allOf`; with nothing else beside
 * it, the plain reference says the same. */
function bareRefs(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(bareRefs);
  if (!node || typeof node !== 'object') return node;
  const o = node as Json;
  const keys = Object.keys(o);
  if (keys.length === 1 && Array.isArray(o.allOf) && o.allOf.length === 1) {
    const only = o.allOf[0] as Json;
    if (only && typeof only === 'object' && Object.keys(only).length === 1 && typeof only.$ref === 'string') return { $ref: only.$ref };
  }
  return Object.fromEntries(keys.map((k) => [k, bareRefs(o[k])]));
}
