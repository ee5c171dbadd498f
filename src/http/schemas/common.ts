import { z } from 'zod';

/** What every face's schemas share: the error envelope, ids, paging, query booleans. */

export const ERROR_CODES = [
  'INVALID_REQUEST',
  'UNAUTHENTICATED',
  'FORBIDDEN',
  'NOT_FOUND',
  'CONFLICT',
  'QUOTA_EXCEEDED',
  'PAYLOAD_TOO_LARGE',
  'UNAVAILABLE',
  'INSUFFICIENT_STORAGE',
  'SANDBOX_NOT_RUNNING',
  'DOCKERFILE_INVALID',
  'BUILD_STEP_FAILED',
  'INTERNAL',
] as const;

export const ErrorEnvelope = z
  .object({
    error: z.object({
      code: z.enum(ERROR_CODES).describe('stable: clients branch on it'),
      message: z.string().describe('for people'),
      details: z.record(z.string(), z.unknown()).optional().describe('what the error is about: the instance, the field, the issues found in the request, ...'),
    }),
  })
  .meta({
    id: 'Error',
    description: 'Every failure of the Firecase-style face.',
    examples: [{ error: { code: 'NOT_FOUND', message: 'instance inst_0123456789abcdef not found', details: { instance: 'inst_0123456789abcdef' } } }],
  });

const failure = (description: string) => ({ description, content: { 'application/json': { schema: ErrorEnvelope } } });

/** The error statuses any route can answer with, each with the envelope. */
export const errorResponses = {
  400: failure('Bad input: INVALID_REQUEST'),
  401: failure('No token, or not a valid one: UNAUTHENTICATED'),
  403: failure('A valid credential that does not open this route (a sandbox\'s access token on an owner\'s route; a token that is not an operator\'s on the cluster\'s): FORBIDDEN'),
  404: failure('No such route or object (or not yours): NOT_FOUND'),
  409: failure('The object is not in a state for this: CONFLICT'),
  413: failure('The body is too large: PAYLOAD_TOO_LARGE'),
  429: failure('A quota is reached: QUOTA_EXCEEDED'),
  500: failure('A bug in forkpoint: INTERNAL'),
  503: failure('The engine could not do it now (a sandbox that does not answer, a CRIU failure): UNAVAILABLE'),
  507: failure('The disk under the data directory is full: INSUFFICIENT_STORAGE'),
};

/** A success answer with a description and a JSON body. */
export const ok = <T extends z.ZodType>(description: string, schema: T) => ({ description, content: { 'application/json': { schema } } });

/** A success answer with no body. */
export const noContent = (description: string) => z.null().describe(description);

/** A request body that may be left out altogether: Fastify validates a missing body as null. */
export const optionalBody = <T extends z.ZodType>(schema: T) => z.preprocess((v) => (v === null ? undefined : v), schema.optional());

/** Marks an operation whose request body may be left out altogether (openapi.ts turns it into
 * `requestBody.required: false`; @fastify/swagger always says true). */
export const OPTIONAL_BODY = { 'x-optional-body': true } as const;

export const InstanceId = z.string().min(1).max(64).meta({ description: 'an instance id', examples: ['inst_0123456789abcdef'] });
export const CheckpointId = z.string().min(1).max(64).meta({ description: 'a checkpoint id', examples: ['ckpt_0123456789abcdef'] });

export const IdParams = z.object({ id: InstanceId });
export const CheckpointParams = IdParams.extend({ checkpoint_id: CheckpointId });

export const PageQuery = z.object({
  limit: z.coerce.number().int().min(1).max(500).default(50).describe('page size'),
  cursor: z.string().max(64).optional().describe('the `next_cursor` of the previous page'),
});

/** A query parameter that is `true` or `false` (`1` and `0` too), typed boolean in the document. */
export const queryBoolean = () =>
  z.preprocess((v) => (v === 'true' || v === '1' ? true : v === 'false' || v === '0' ? false : v), z.boolean()).optional();

const MAX_ENV_VARS = 256;
const MAX_ENV_BYTES = 64 * 1024;

export const Env = z
  .record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'names are letters, digits and _'), z.string().max(32 * 1024))
  .refine((e) => Object.keys(e).length <= MAX_ENV_VARS, `at most ${MAX_ENV_VARS} variables`)
  .refine(
    (e) => Object.entries(e).reduce((n, [k, v]) => n + k.length + v.length + 2, 0) <= MAX_ENV_BYTES,
    `at most ${MAX_ENV_BYTES} bytes of variables in all`,
  )
  .meta({ description: 'environment variables', examples: [{ GREETING: 'hello' }] });

export const Metadata = z.record(z.string().max(64), z.string().max(1024)).meta({ description: 'your own labels', examples: [{ owner: 'ci' }] });
