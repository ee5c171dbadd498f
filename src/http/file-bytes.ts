import type { Readable } from 'node:stream';
import type { FastifyReply } from 'fastify';

/** A file's bytes as the answer, streamed, with the length the agent announced for them (the
 * core's stream carries exactly that many). */
export async function sendFileBytes(reply: FastifyReply, read: Promise<{ size: number | undefined; stream: Readable }>): Promise<FastifyReply> {
  const { size, stream } = await read;
  reply.type('application/octet-stream');
  if (size !== undefined) reply.header('content-length', size);
  return reply.send(stream);
}
