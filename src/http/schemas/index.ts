/** The Firecase-style face's schemas: they are the OpenAPI document (openapi/openapi.json). */
export * from './common.js';
export * from './instances.js';
export * from './exec.js';
export * from './checkpoints.js';
export * from './files.js';
export * from './health.js';
export * from './executions.js';
export * from './network.js';
export * from './images.js';
export * from './volumes.js';
export * from './secrets.js';
