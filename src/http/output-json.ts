import { Readable } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';
import type { FastifyReply } from 'fastify';
import type { Output } from '../lib/output.js';

/** How command output goes into JSON strings: UTF-8 text (bytes that are not UTF-8 become
 * U+FFFD), or base64 for output that must come back byte for byte. */
export type OutputEncoding = 'utf8' | 'base64';

export type JsonField = [name: string, value: unknown];

const isOutput = (v: unknown): v is Output => typeof v === 'object' && v !== null && 'chunks' in v && 'dispose' in v;

/** The output as one string, for outputs small enough to hold (Output.small). */
export function outputText(o: Output, encoding: OutputEncoding): string {
  return o.toBuffer().toString(encoding);
}

/**
 * Sends a JSON object some of whose fields are command outputs. Small outputs go the usual
 * way (the route's schema serialises them); large ones are written as they are read from the
 * spill files, escaped a piece at a time, so that neither the output nor its JSON form (six
 * bytes for every NUL) is ever whole in memory. Spill files go once the reply is done.
 */
export function sendWithOutputs(reply: FastifyReply, fields: JsonField[], encoding: OutputEncoding): FastifyReply {
  const outputs = fields.map(([, v]) => v).filter(isOutput);
  const dispose = () => outputs.forEach((o) => o.dispose());
  if (outputs.every((o) => o.small)) {
    const body = Object.fromEntries(fields.map(([k, v]) => [k, isOutput(v) ? outputText(v, encoding) : v]));
    dispose();
    return reply.send(body);
  }
  reply.raw.once('close', dispose);
  return reply.type('application/json; charset=utf-8').send(Readable.from(json(fields, encoding), { objectMode: false, highWaterMark: 1 << 16 }));
}

function* json(fields: JsonField[], encoding: OutputEncoding): Generator<string> {
  let first = true;
  for (const [key, value] of fields) {
    yield `${first ? '{' : ','}${JSON.stringify(key)}:`;
    first = false;
    if (!isOutput(value)) {
      yield JSON.stringify(value);
      continue;
    }
    yield '"';
    yield* encoding === 'base64' ? base64(value) : utf8(value);
    yield '"';
  }
  yield first ? '{}' : '}';
}

const escaped = (text: string) => JSON.stringify(text).slice(1, -1);

function* utf8(o: Output): Generator<string> {
  const decoder = new StringDecoder('utf8'); // keeps a character split across pieces whole
  for (const chunk of o.chunks()) {
    const text = decoder.write(chunk);
    if (text) yield escaped(text);
  }
  const rest = decoder.end();
  if (rest) yield escaped(rest);
}

function* base64(o: Output): Generator<string> {
  let carry = Buffer.alloc(0);
  for (const chunk of o.chunks()) {
    const all = carry.length ? Buffer.concat([carry, chunk]) : chunk;
    const whole = all.length - (all.length % 3);
    if (whole) yield all.subarray(0, whole).toString('base64');
    carry = Buffer.from(all.subarray(whole));
  }
  if (carry.length) yield carry.toString('base64');
}
