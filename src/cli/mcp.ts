import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { forkpointMcpServer, type RestPort } from '../mcp/tools.js';
import { Api, answer, CliError, resolveTarget } from './api.js';
import type { Common } from './client.js';

/** `forkpoint mcp`: forkpoint's tools for an agent over stdio, working a server through its API
 * with this CLI's URL and token. */
export async function mcp(o: Common): Promise<void> {
  const api = new Api(resolveTarget(o));
  const rest: RestPort = {
    json: <T>(method: 'GET' | 'POST' | 'PUT' | 'DELETE', path: string, body?: unknown) => api.call<T>(method, path, body).catch((err: unknown) => Promise.reject(err instanceof CliError ? new Error(`${err.code}: ${err.message}`) : err)),
    readBytes: async (path) => {
      const res = await api.raw('GET', path);
      if (res.status >= 400) await answer(res);
      // Leaving the reader's loop early cancels the body: the rest of the file is not fetched.
      return (res.body ?? new Blob([]).stream()) as unknown as AsyncIterable<Uint8Array>;
    },
    writeText: async (path, text) => void (await answer(await api.raw('PUT', path, { body: text, headers: { 'content-type': 'application/octet-stream' } }))),
  };
  const server = forkpointMcpServer(rest);
  await server.connect(new StdioServerTransport());
  // Until the client closes its end.
  await new Promise<void>((resolve) => process.stdin.once('close', resolve).once('end', resolve));
  await server.close();
}
