"""A small stand-in for E2B's code interpreter server, on port 49999: what `@e2b/code-interpreter`
calls (`POST /execute` answering NDJSON, `/contexts`, `/health`). Python only. Each context keeps
its globals in this process, so a forkpoint checkpoint, snapshot or fork keeps them too."""
import ast
import json
import sys
import threading
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 49999
MAX_BODY = 16 << 20


class Context:
    def __init__(self, language="python", cwd="/home/user"):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.globals = {"__name__": "__main__"}
        self.count = 0
        self.lock = threading.Lock()

    def view(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


default = Context()
contexts = {default.id: default}


class Stream:
    """sys.stdout or sys.stderr while code runs: whole lines go out as NDJSON messages as they
    are written (as Jupyter's streams arrive), the rest when the cell ends."""

    def __init__(self, emit, kind):
        self.emit, self.kind, self.pending = emit, kind, ""

    def write(self, text):
        self.pending += text
        if "\n" in self.pending:
            head, _, self.pending = self.pending.rpartition("\n")
            self.emit({"type": self.kind, "text": head + "\n"})
        return len(text)

    def flush(self):
        if self.pending:
            self.emit({"type": self.kind, "text": self.pending})
            self.pending = ""


def sandbox_env():
    """The sandbox's variables, given when it was made (after this server started: it is
    restored from the template's checkpoint), as forkpoint's E2B face writes them."""
    try:
        with open("/run/e2b/envs.json") as f:
            env = json.load(f)
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    except (OSError, ValueError):
        return {}


def run(ctx, code, env, emit):
    import os

    with ctx.lock:
        ctx.count += 1
        emit({"type": "number_of_executions", "execution_count": ctx.count})
        saved = sys.stdout, sys.stderr, dict(os.environ)
        sys.stdout, sys.stderr = Stream(emit, "stdout"), Stream(emit, "stderr")
        os.environ.update(sandbox_env())
        os.environ.update(env or {})
        try:
            tree = ast.parse(code, mode="exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, "<cell>", "exec"), ctx.globals)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ctx.globals)
                if value is not None:
                    emit({"type": "result", "text": repr(value), "is_main_result": True})
        except BaseException as e:  # a cell's error is its answer, SystemExit included
            emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": traceback.format_exc()})
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved[0], saved[1]
            os.environ.clear()
            os.environ.update(saved[2])
        emit({"type": "end_of_execution"})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body(self):
        n = int(self.headers.get("content-length") or 0)
        if n > MAX_BODY:
            raise ValueError("body too large")
        return json.loads(self.rfile.read(n) or b"{}")

    def reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/health":
            return self.reply(200, "OK")
        if path == "/contexts":
            return self.reply(200, [c.view() for c in contexts.values()])
        self.reply(404, {"error": "not found"})

    def do_DELETE(self):
        cid = self.path.split("?")[0].rsplit("/", 1)[-1]
        if contexts.pop(cid, None) is None:
            return self.reply(404, {"error": f"context {cid} not found"})
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        path = self.path.split("?")[0]
        try:
            req = self.body()
        except ValueError as e:
            return self.reply(400, {"error": str(e)})
        if path == "/contexts":
            ctx = Context(req.get("language") or "python", req.get("cwd") or "/home/user")
            contexts[ctx.id] = ctx
            return self.reply(200, ctx.view())
        if path.startswith("/contexts/") and path.endswith("/restart"):
            cid = path.split("/")[2]
            if cid not in contexts:
                return self.reply(404, {"error": f"context {cid} not found"})
            contexts[cid].globals = {"__name__": "__main__"}
            return self.reply(200, {})
        if path != "/execute":
            return self.reply(404, {"error": "not found"})
        language = req.get("language") or "python"
        if language not in ("python", "py"):
            return self.reply(400, {"error": f"language {language} is not supported here (python only)"})
        ctx = contexts.get(req.get("context_id") or default.id)
        if ctx is None:
            return self.reply(404, {"error": "context not found"})
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def emit(msg):
            line = (json.dumps(msg) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        run(ctx, req.get("code") or "", req.get("env_vars"), emit)
        self.wfile.write(b"0\r\n\r\n")


if __name__ == "__main__":
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()
