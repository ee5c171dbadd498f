import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

/** How the client CLI reaches a server: flags, then the environment, then `forkpoint login`'s
 * file, then this machine's own server (its first token, when readable). */
export interface Target {
  url: string;
  token: string;
}

export interface TargetFlags {
  url?: string | undefined;
  token?: string | undefined;
}

/** An answer that is not a success, or a server that could not be reached: one line for the
 * user, with the server's code, and the exit status the command ends with. */
export class CliError extends Error {
  override readonly name = 'CliError';
  constructor(
    message: string,
    readonly code: string,
    readonly exitCode = 1,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** Where `forkpoint login` keeps the URL and token (mode 0600). */
export function loginFile(): string {
  return join(process.env.XDG_CONFIG_HOME || join(homedir(), '.config'), 'forkpoint', 'cli.json');
}

function saved(): Partial<Target> {
  try {
    const v = JSON.parse(readFileSync(loginFile(), 'utf8')) as unknown;
    if (v && typeof v === 'object') {
      const { url, token } = v as Record<string, unknown>;
      return { ...(typeof url === 'string' ? { url } : {}), ...(typeof token === 'string' ? { token } : {}) };
    }
  } catch {
    // no login yet
  }
  return {};
}

const isLoopback = (url: string) => /^https?:\/\/(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?(\/|$)/.test(url);

/** The first token a server on this machine made (`/var/lib/forkpoint/initial-token`, or the
 * data directory's of FORKPOINT_DATA_DIR): readable by root only, as the server wrote it. */
function localToken(): string | undefined {
  const dir = process.env.FORKPOINT_DATA_DIR || '/var/lib/forkpoint';
  try {
    return readFileSync(join(dir, 'initial-token'), 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}

export function resolveTarget(flags: TargetFlags): Target {
  const login = saved();
  const url = (flags.url ?? process.env.FORKPOINT_URL ?? login.url ?? `http://127.0.0.1:${process.env.FORKPOINT_PORT || 7878}`).replace(/\/+$/, '');
  const fromLogin = login.token && (!login.url || login.url.replace(/\/+$/, '') === url) ? login.token : undefined;
  const token = flags.token ?? process.env.FORKPOINT_TOKEN ?? fromLogin ?? (isLoopback(url) ? localToken() : undefined);
  if (!token) throw new CliError(`no token for ${url}: give --token, set FORKPOINT_TOKEN, or run forkpoint login`, 'NO_TOKEN', 2);
  return { url, token };
}

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
/** What a request may carry: JSON text, or bytes streamed from a file. */
export type Body = string | NodeJS.ReadableStream;

/** The server's API, as the CLI speaks to it: JSON in and out, errors as CliError. Node's own
 * fetch, not undici's package: loading that would cost a client command ~90 ms. */
export class Api {
  constructor(readonly target: Target) {}

  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { authorization: `Bearer ${this.target.token}`, ...extra };
  }

  async raw(method: Method, path: string, opts: { body?: Body; headers?: Record<string, string>; signal?: AbortSignal } = {}): Promise<Response> {
    try {
      // A stream goes as it is read (fetch's half duplex).
      const init = { method, headers: this.headers(opts.headers), body: opts.body, signal: opts.signal, ...(opts.body !== undefined && typeof opts.body !== 'string' ? { duplex: 'half' } : {}) };
      return await fetch(`${this.target.url}${path}`, init as RequestInit);
    } catch (err) {
      const why = (err as Error & { cause?: Error }).cause?.message ?? (err as Error).message;
      throw new CliError(`cannot reach ${this.target.url}: ${why}`, 'UNREACHABLE', 3, { cause: err });
    }
  }

  async call<T = unknown>(method: Method, path: string, body?: unknown): Promise<T> {
    const res = await this.raw(method, path, body !== undefined ? { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } } : {});
    return (await answer(res)) as T;
  }
}

/** The body of an answer, or its error as one line: `CODE: message`. */
export async function answer(res: Response): Promise<unknown> {
  const text = await res.text();
  let json: unknown;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  if (res.status < 400) return json;
  const e = (json as { error?: { code?: unknown; message?: unknown } } | undefined)?.error;
  const code = typeof e?.code === 'string' ? e.code : `HTTP_${res.status}`;
  const message = typeof e?.message === 'string' ? e.message : text.slice(0, 200) || `the server answered ${res.status}`;
  throw new CliError(message, code);
}

/** Server-Sent Events of an answer, one `{event, data}` at a time. */
export async function* sseEvents(res: Response): AsyncGenerator<{ event: string; data: string }> {
  if (!res.body) return;
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = 'message';
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) event = line.slice(7);
        else if (line.startsWith('data: ')) data.push(line.slice(6));
      }
      if (data.length) yield { event, data: data.join('\n') };
    }
  }
}
