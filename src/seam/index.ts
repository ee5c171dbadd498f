/**
 * The engine seam: everything the core knows of the machine that runs sandboxes, as interfaces
 * and plain data. The local engine (src/engine) implements it; test/fakes has one in memory.
 * Nothing here imports the engine.
 */
export * from './agent.js';
export * from './errors.js';
export * from './runtime.js';
export * from './sandbox.js';
