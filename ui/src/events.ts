import { session } from './api.js';

export interface InstanceEvent {
  seq: number;
  type: string;
  instance_id: string;
  at: string;
  data: unknown;
}

/** Longest an event line may be before the stream is judged broken (the server's are small). */
const MAX_BUFFER = 1 << 20;

/**
 * Follows an instance's events (SSE) until `signal` aborts: over fetch, since EventSource cannot
 * send the token in a header. Reconnects after a drop with Last-Event-ID, a second later, so no
 * event is missed; ends when the instance is deleted (the server then ends the stream).
 */
export async function followEvents(id: string, onEvent: (e: InstanceEvent) => void, signal: AbortSignal): Promise<void> {
  let last: number | undefined;
  while (!signal.aborted) {
    try {
      const headers: Record<string, string> = { authorization: `Bearer ${session.token ?? ''}`, accept: 'text/event-stream' };
      if (last !== undefined) headers['last-event-id'] = String(last);
      const res = await fetch(`/instances/${encodeURIComponent(id)}/events`, { headers, signal });
      if (!res.ok || !res.body) return;
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        if (buf.length > MAX_BUFFER) throw new Error('event stream line too long');
        let end: number;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
          if (!data) continue;
          const e = JSON.parse(data) as InstanceEvent;
          last = e.seq;
          onEvent(e);
          if (e.type === 'instance.deleted') return;
        }
      }
    } catch {
      if (signal.aborted) return;
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}
