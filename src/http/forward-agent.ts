import { Agent, type Dispatcher } from 'undici';

/** A node the cluster judged lost: what its forwarded calls in flight end with. */
export class NodeLostError extends Error {
  override readonly name = 'NodeLostError';
  constructor(readonly node: string) {
    super(`node ${node} stopped answering and was judged lost`);
  }
}

/**
 * The connections forwarded calls take to other nodes: an undici Agent whose calls to one node
 * can all be ended at once. A call to a machine that dropped off the network gets no reset: it
 * would wait for TCP keep-alive (minutes), or for an exec's own timeout (up to a day). Once the
 * cluster judges that node lost, `cut` ends them, and their callers get a 503 at once.
 */
export class ForwardAgent extends Agent {
  private readonly cuts = new Map<string, AbortController>();

  override request<TOpaque = null>(options: Dispatcher.RequestOptions<TOpaque>, callback: (err: Error | null, data: Dispatcher.ResponseData<TOpaque>) => void): void;
  override request<TOpaque = null>(options: Dispatcher.RequestOptions<TOpaque>): Promise<Dispatcher.ResponseData<TOpaque>>;
  override request<TOpaque = null>(
    options: Dispatcher.RequestOptions<TOpaque>,
    callback?: (err: Error | null, data: Dispatcher.ResponseData<TOpaque>) => void,
  ): void | Promise<Dispatcher.ResponseData<TOpaque>> {
    const cut = this.cutOf(String(options.origin));
    const own = options.signal as AbortSignal | undefined;
    const signal = own ? AbortSignal.any([own, cut.signal]) : cut.signal;
    return callback ? super.request({ ...options, signal }, callback) : super.request({ ...options, signal });
  }

  private cutOf(origin: string): AbortController {
    const key = new URL(origin).origin;
    let c = this.cuts.get(key);
    if (!c || c.signal.aborted) this.cuts.set(key, (c = new AbortController()));
    return c;
  }

  /** Ends every call in flight to the node at `url`. */
  cut(url: string, node: string): void {
    const key = new URL(url).origin;
    this.cuts.get(key)?.abort(new NodeLostError(node));
    this.cuts.delete(key);
  }
}
