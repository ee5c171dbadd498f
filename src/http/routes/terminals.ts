import type { FastifyPluginAsyncZod } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { Forkpoint } from '../../core/forkpoint.js';
import { CreatePtyRequest, errorResponses, IdParams, noContent, ok, Pty, PtyParams, ResizeRequest } from '../schemas/index.js';
import { bridgeExecution } from '../streams/ws.js';
import { argvOf } from './executions.js';

/** An interactive bash where the image has one, else sh. */
export const DEFAULT_TERMINAL = ['/bin/sh', '-c', 'if [ -x /bin/bash ]; then exec /bin/bash -i; fi; exec /bin/sh -i'];

export const WS_CLOSE_CODES =
  'The socket closes with 1000 and the reason `exit <code>` when the command ends; 1011 when the stream ended without an exit (the instance was rolled back past it, hibernated, stopped or deleted); ' +
  '1013 when the client fell more than 4 MiB behind; 4000 + an HTTP status (4404, 4409, ...) when the attach failed. A token may also be passed as `?token=` or `?api_key=` (browsers cannot set headers on a WebSocket).';

export const switching = (description: string) => ({ 101: z.null().describe(description) });

export const terminalRoutes = (fp: Forkpoint): FastifyPluginAsyncZod =>
  async (app) => {
    const tags = ['terminals'];
    app.post('/instances/:id/pty', {
      schema: {
        operationId: 'createPty',
        tags,
        summary: 'Open a terminal',
        description: 'Starts `command` (an interactive shell by default) on a PTY of `rows` x `cols`. It runs until it exits or is closed, attached or not; it is an execution like the others (listed, killed, carried through checkpoints, rollbacks, forks and hibernation).',
        params: IdParams,
        body: CreatePtyRequest,
        response: { 201: ok('The terminal', Pty), ...errorResponses },
      },
    }, async (req, reply) => {
      const b = req.body;
      const st = await fp.executions.start(req.owner, req.params.id, {
        kind: 'pty',
        argv: b.command ? argvOf(b.command) : DEFAULT_TERMINAL,
        env: b.env,
        cwd: b.cwd,
        pty: { rows: b.rows, cols: b.cols },
        user: b.user,
      });
      return reply.code(201).send({ id: st.record.id, pid: st.pid });
    });

    app.get('/instances/:id/pty/:pty_id', {
      websocket: true,
      preHandler: async (req) => {
        await fp.executions.find(req.owner, req.params.id, req.params.pty_id);
      },
      schema: {
        operationId: 'attachPty',
        tags,
        summary: 'Attach to a terminal (WebSocket)',
        description: `A WebSocket carrying raw bytes both ways: every message from the client (binary or text) is typed into the terminal; the terminal's output comes as binary messages, its scrollback first. Any number of clients may attach at once. ${WS_CLOSE_CODES}`,
        params: PtyParams,
        response: { ...switching('Switching to the WebSocket protocol'), ...errorResponses },
      },
    }, (socket, req) => bridgeExecution(fp, socket, { owner: req.owner, id: req.params.id, execId: req.params.pty_id }, 'raw', req.log));

    app.post('/instances/:id/pty/:pty_id/resize', {
      schema: {
        operationId: 'resizePty',
        tags,
        summary: 'Resize a terminal',
        description: 'Sets its size; what runs in it gets SIGWINCH.',
        params: PtyParams,
        body: ResizeRequest,
        response: { 204: noContent('Resized'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.executions.resize(req.owner, req.params.id, req.params.pty_id, req.body.rows, req.body.cols);
      return reply.code(204).send(null);
    });

    app.delete('/instances/:id/pty/:pty_id', {
      schema: {
        operationId: 'closePty',
        tags,
        summary: 'Close a terminal',
        description: 'Kills what runs in it and forgets it; attached clients are closed.',
        params: PtyParams,
        response: { 204: noContent('Closed'), ...errorResponses },
      },
    }, async (req, reply) => {
      await fp.executions.remove(req.owner, req.params.id, req.params.pty_id);
      return reply.code(204).send(null);
    });
  };
