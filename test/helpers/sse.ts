import { request } from 'node:http';

export interface SseEvent {
  event: string;
  id: string | undefined;
  data: any;
  /** ms since the request was sent */
  at: number;
}

export interface SseClient {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  /** Comment lines seen (heartbeats), with when. */
  comments: { text: string; at: number }[];
  /** The next event, or undefined once the stream ended; rejects after `timeoutMs`. */
  next(timeoutMs?: number): Promise<SseEvent | undefined>;
  /** Every event until the stream ends (bounded by `timeoutMs` overall). */
  rest(timeoutMs?: number): Promise<SseEvent[]>;
  close(): void;
  /** The body of a non-SSE answer (an error). */
  text(): Promise<string>;
}

/** A minimal Server-Sent Events client over node:http, keeping arrival times. */
export function openSse(url: string, opts: { method?: string; headers?: Record<string, string>; body?: unknown } = {}): Promise<SseClient> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const body = opts.body === undefined ? undefined : JSON.stringify(opts.body);
    const req = request(url, {
      method: opts.method ?? 'GET',
      headers: { accept: 'text/event-stream', ...(body ? { 'content-type': 'application/json' } : {}), ...opts.headers },
    });
    req.on('error', reject);
    req.on('response', (res) => {
      const queue: SseEvent[] = [];
      const waiters: ((e: SseEvent | undefined) => void)[] = [];
      let ended = false;
      let buf = '';
      let raw = '';
      const comments: { text: string; at: number }[] = [];
      const push = (e: SseEvent | undefined) => {
        const w = waiters.shift();
        if (w) w(e);
        else if (e) queue.push(e);
      };
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        raw += chunk;
        buf += chunk;
        for (let i; (i = buf.indexOf('\n\n')) >= 0; ) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let event = 'message';
          let id: string | undefined;
          const data: string[] = [];
          for (const line of block.split('\n')) {
            if (line.startsWith(':')) comments.push({ text: line.slice(1).trim(), at: performance.now() - t0 });
            else if (line.startsWith('event: ')) event = line.slice(7);
            else if (line.startsWith('id: ')) id = line.slice(4);
            else if (line.startsWith('data: ')) data.push(line.slice(6));
          }
          if (data.length) push({ event, id, data: JSON.parse(data.join('\n')), at: performance.now() - t0 });
        }
      });
      const end = () => {
        ended = true;
        for (const w of waiters.splice(0)) w(undefined);
      };
      res.on('end', end);
      res.on('close', end);
      res.on('error', end);
      const client: SseClient = {
        status: res.statusCode ?? 0,
        headers: res.headers,
        comments,
        next(timeoutMs = 10_000) {
          if (queue.length) return Promise.resolve(queue.shift());
          if (ended) return Promise.resolve(undefined);
          return new Promise((res2, rej) => {
            const timer = setTimeout(() => {
              waiters.splice(waiters.indexOf(done), 1);
              rej(new Error(`no event within ${timeoutMs} ms`));
            }, timeoutMs);
            const done = (e: SseEvent | undefined) => {
              clearTimeout(timer);
              res2(e);
            };
            waiters.push(done);
          });
        },
        async rest(timeoutMs = 15_000) {
          const deadline = Date.now() + timeoutMs;
          const out: SseEvent[] = [];
          for (;;) {
            const e = await client.next(Math.max(1, deadline - Date.now()));
            if (!e) return out;
            out.push(e);
          }
        },
        close() {
          req.destroy();
          res.destroy();
        },
        async text() {
          await new Promise<void>((r) => (ended ? r() : res.on('end', () => r())));
          return raw;
        },
      };
      resolve(client);
    });
    if (body) req.write(body);
    req.end();
  });
}
