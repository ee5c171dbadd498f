/**
 * Checks answers against the OpenAPI document itself: the status must be one the operation
 * documents, and a JSON body must match the schema the document gives for it (ajv, JSON Schema
 * 2020-12, the document's own `$ref`s). Used by the journeys that run on generated clients.
 */
import { readFileSync } from 'node:fs';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';

type Json = Record<string, any>;
const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => void;

export class DocumentValidator {
  readonly doc: Json;
  private readonly ajv = new Ajv2020({ strict: false, allErrors: true });
  checked = 0;

  constructor(path: string) {
    this.doc = JSON.parse(readFileSync(path, 'utf8')) as Json;
    addFormats(this.ajv);
    this.ajv.addSchema({ $id: 'doc', components: this.doc.components, paths: this.doc.paths });
  }

  /** Throws unless `body` (undefined for none) is what the document promises for this answer. */
  check(method: string, template: string, status: number, contentType: string, body: unknown): void {
    const op = this.doc.paths?.[template]?.[method.toLowerCase()];
    if (!op) throw new Error(`${method} ${template} is not in the document`);
    const res = op.responses?.[String(status)];
    if (!res) throw new Error(`${method} ${template} answered ${status}, which the document does not list`);
    const type = contentType.split(';')[0]!.trim();
    if (!res.content || Object.keys(res.content).length === 0) {
      if (body !== undefined && body !== '') throw new Error(`${method} ${template} ${status}: a body the document does not promise`);
    } else if (!res.content[type]) {
      throw new Error(`${method} ${template} ${status}: content type ${type} not in the document (${Object.keys(res.content).join(', ')})`);
    } else if (type === 'application/json') {
      const pointer = ['paths', template, method.toLowerCase(), 'responses', String(status), 'content', type, 'schema']
        .map((p) => encodeURIComponent(p.replace(/~/g, '~0').replace(/\//g, '~1')))
        .join('/');
      const validate = this.ajv.getSchema(`doc#/${pointer}`);
      if (!validate) throw new Error(`no schema at ${pointer}`);
      if (!validate(body)) throw new Error(`${method} ${template} ${status}: the body does not match the document: ${this.ajv.errorsText(validate.errors)}\n${JSON.stringify(body).slice(0, 500)}`);
    }
    this.checked++;
  }
}
