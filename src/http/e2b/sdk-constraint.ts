import type { FastifyServerOptions } from 'fastify';

type ConstraintStrategy = NonNullable<NonNullable<FastifyServerOptions['routerOptions']>['constraints']>[string];
type Handler = ReturnType<ReturnType<ConstraintStrategy['storage']>['get']>;

/** The value `e2bSdk` derives for a call from one of E2B's SDKs. */
export const E2B_SDK = 'e2b';

/**
 * Where E2B's API and forkpoint's own share a path (`/volumes`, with other shapes), the route is
 * chosen by who calls: E2B's SDKs (JS and Python) send `publisher: e2b` with every call, which
 * forkpoint's own clients never do. E2B's route declares it (`constraints: { e2bSdk: 'e2b' }`);
 * every other route matches whatever the header, so it decides nothing elsewhere.
 */
export const e2bSdkConstraint: ConstraintStrategy = {
  name: 'e2bSdk',
  mustMatchWhenDerived: false,
  storage() {
    const handlers = new Map<string, NonNullable<Handler>>();
    return {
      get: (value: string) => handlers.get(value) ?? null,
      set: (value: string, handler: NonNullable<Handler>) => void handlers.set(value, handler),
    };
  },
  validate(value: unknown) {
    if (value !== E2B_SDK) throw new Error(`the e2bSdk constraint is '${E2B_SDK}' or absent`);
  },
  // No E2B SDK: no value, which routes without the constraint match.
  deriveConstraint: (req) => (req.headers.publisher === E2B_SDK ? E2B_SDK : (undefined as unknown as string)),
};
