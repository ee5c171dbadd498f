import type { components } from './openapi.js';
/** The console's one way to the API: the same routes and token every client uses. */

// The API's own shapes, generated from its OpenAPI document (itself made from the server's zod
// schemas) when the console is built: the page cannot drift from the server.
type Schemas = components['schemas'];
export type Instance = Schemas['Instance'];
export type Checkpoint = Schemas['Checkpoint'];
export type LineageNode = Schemas['LineageNode'];
export type FileEntry = Schemas['FileEntry'];
export type Image = Schemas['Image'];
export type Template = Schemas['Template'];
export type Execution = Schemas['Execution'];
export interface Page<T> {
  items: T[];
  next_cursor: string | null;
}

/** An answer other than 2xx, with the server's stable code. */
export class ApiError extends Error {
  override readonly name = 'ApiError';
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const TOKEN_KEY = 'forkpoint.token';

/** The tab's token: session storage, so it goes with the tab and is not shared with other tabs. */
export const session = {
  get token(): string | null {
    return sessionStorage.getItem(TOKEN_KEY);
  },
  signIn(token: string): void {
    sessionStorage.setItem(TOKEN_KEY, token);
  },
  signOut(): void {
    sessionStorage.removeItem(TOKEN_KEY);
  },
};

/** A call that does not answer in this time is given up (the server bounds its own work). */
const DEADLINE_MS = 120_000;

export async function call(method: string, path: string, body?: BodyInit | object, opts: { token?: string; signal?: AbortSignal; raw?: boolean } = {}): Promise<Response> {
  const token = opts.token ?? session.token;
  const headers: Record<string, string> = {};
  if (token) headers.authorization = `Bearer ${token}`;
  let payload: BodyInit | undefined;
  if (body instanceof Blob || body instanceof ArrayBuffer || typeof body === 'string') {
    payload = body;
    headers['content-type'] = 'application/octet-stream';
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['content-type'] = 'application/json';
  }
  const signal = opts.signal ? AbortSignal.any([opts.signal, AbortSignal.timeout(DEADLINE_MS)]) : AbortSignal.timeout(DEADLINE_MS);
  const res = await fetch(path, { method, headers, body: payload, signal });
  if (!res.ok) throw await errorOf(res);
  return res;
}

async function errorOf(res: Response): Promise<ApiError> {
  const text = await res.text().catch(() => '');
  try {
    const parsed = JSON.parse(text) as { error?: { code?: string; message?: string } };
    if (parsed.error?.code) return new ApiError(res.status, parsed.error.code, parsed.error.message ?? res.statusText);
  } catch {
    // not the API's envelope
  }
  return new ApiError(res.status, `HTTP_${res.status}`, text.slice(0, 200) || res.statusText);
}

export async function json<T>(method: string, path: string, body?: object, opts: { token?: string; signal?: AbortSignal } = {}): Promise<T> {
  const res = await call(method, path, body, opts);
  if (res.status === 204) return undefined as T;
  return (await res.json()) as T;
}

export const enc = encodeURIComponent;

export const api = {
  instances: (signal?: AbortSignal) => json<Page<Instance>>('GET', '/instances?limit=200', undefined, { signal }),
  instance: (id: string, signal?: AbortSignal) => json<Instance>('GET', `/instances/${enc(id)}`, undefined, { signal }),
  create: (body: { image?: string; template?: string; name?: string }) => json<Instance>('POST', '/instances', body),
  remove: (id: string) => json<void>('DELETE', `/instances/${enc(id)}`),
  hibernate: (id: string) => json<Instance>('POST', `/instances/${enc(id)}/hibernate`),
  wake: (id: string) => json<Instance>('POST', `/instances/${enc(id)}/wake`),
  images: () => json<Schemas['ImageList']>('GET', '/images'),
  templates: () => json<Schemas['TemplateList']>('GET', '/templates'),
  pull: (reference: string) => json<Schemas['PulledImage']>('POST', '/images/pull', { reference }),
  checkpoints: (id: string, signal?: AbortSignal) => json<Page<Checkpoint>>('GET', `/instances/${enc(id)}/checkpoints?limit=200`, undefined, { signal }),
  checkpoint: (id: string, label: string | undefined) => json<Checkpoint>('POST', `/instances/${enc(id)}/checkpoints`, label ? { label } : {}),
  rollback: (id: string, checkpointId: string) => json<Instance>('POST', `/instances/${enc(id)}/rollback`, { checkpoint_id: checkpointId }),
  fork: (id: string, checkpointId: string) => json<Instance>('POST', `/instances/${enc(id)}/fork`, { checkpoint_id: checkpointId }),
  lineage: (id: string, signal?: AbortSignal) => json<LineageNode>('GET', `/instances/${enc(id)}/lineage`, undefined, { signal }),
  list: (id: string, path: string) => json<Schemas['FileList']>('GET', `/instances/${enc(id)}/files/list?path=${enc(path)}`),
  download: async (id: string, path: string) => (await call('GET', `/instances/${enc(id)}/files?path=${enc(path)}`)).blob(),
  upload: (id: string, path: string, data: Blob) => call('PUT', `/instances/${enc(id)}/files?path=${enc(path)}`, data),
  removeFile: (id: string, path: string) => call('DELETE', `/instances/${enc(id)}/files?path=${enc(path)}`),
  pty: (id: string, rows: number, cols: number) => json<Schemas['Pty']>('POST', `/instances/${enc(id)}/pty`, { rows, cols }),
  resizePty: (id: string, ptyId: string, rows: number, cols: number) => call('POST', `/instances/${enc(id)}/pty/${enc(ptyId)}/resize`, { rows, cols }),
  closePty: (id: string, ptyId: string) => call('DELETE', `/instances/${enc(id)}/pty/${enc(ptyId)}`),
  executions: (id: string) => json<Page<Execution>>('GET', `/instances/${enc(id)}/exec?limit=100`),
  execution: (id: string, execId: string) => json<Schemas['ExecutionWithOutput']>('GET', `/instances/${enc(id)}/exec/${enc(execId)}`),
  startProcess: (id: string, command: string) => json<Schemas['StartedProcess']>('POST', `/instances/${enc(id)}/processes`, { command }),
  killExecution: (id: string, execId: string, signal: number) => call('POST', `/instances/${enc(id)}/exec/${enc(execId)}/kill`, { signal }),
};
