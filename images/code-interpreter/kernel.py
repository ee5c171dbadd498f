"""A stand-in for E2B's code interpreter server, on port 49999: what `@e2b/code-interpreter`
calls (`POST /execute` answering NDJSON, `/contexts`, `/health`).

Languages: Python (in this process, so that a forkpoint checkpoint, snapshot or fork keeps a
context's globals), JavaScript and TypeScript (a Node.js process per context, kept with the
sandbox the same way; TypeScript's types stripped by Babel, which the Debian image has), R (an
Rscript process per context, r_kernel.R), Java (a JVM per context evaluating with JShell,
JavaKernel.java) and bash (a shell per cell). Rich outputs as E2B's result fields: `display()`, an object's
`_repr_html_`/`_repr_png_`/..., matplotlib figures as PNG (as Jupyter's inline backend shows
them) with their chart data (fp_charts.py), pandas frames as HTML and `data`. R and Java
give their values as text.

Cells run one at a time on the main thread, so that an interrupt is a signal: a client that
goes away while its cell runs interrupts it (KeyboardInterrupt, or the child process's end),
and the next cell does not wait behind it."""
import ast
import base64
import io
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 49999
MAX_BODY = 16 << 20
HOME = "/home/user"
LANGUAGES = {"python": "python", "py": "python", "javascript": "javascript", "js": "javascript",
             "typescript": "typescript", "ts": "typescript", "bash": "bash", "sh": "bash", "r": "r",
             "java": "java"}
SERVED = "python, javascript, typescript, r, java, bash"
NODE_LANGUAGES = ("javascript", "typescript")
NODE_DRIVER = "/opt/forkpoint/js_kernel.js"
# The process that runs a context's cells, per language (one per context, started on first use).
CHILDREN = {
    "javascript": ["node", NODE_DRIVER],
    "typescript": ["node", NODE_DRIVER],
    "r": ["Rscript", "--vanilla", "/opt/forkpoint/r_kernel.R"],
    "java": ["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-cp", "/opt/forkpoint/java", "JavaKernel"],
}
os.environ.setdefault("MPLBACKEND", "Agg")
# The environment children start with: a cell's own variables are that cell's.
BASE_ENV = dict(os.environ)
# The running cell's display(), for what shows an object from outside the cell's globals.
current_display = [lambda *objs, **kwargs: None]
# `from IPython.display import display, HTML, ...` as in a notebook (IPython is not in the image,
# and its own display needs a running IPython shell): last on the path, so an IPython the sandbox
# installs wins. Not imported here: libraries take an imported IPython for a notebook.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fallback"))


class Context:
    def __init__(self, language="python", cwd=HOME):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.globals = {"__name__": "__main__"}
        self.count = 0
        self.child = None  # the process of a JavaScript, TypeScript, R or Java context (CHILDREN)

    def view(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


default = Context()
contexts = {default.id: default}
default_js = Context("javascript")
contexts[default_js.id] = default_js
default_ts = Context("typescript")
contexts[default_ts.id] = default_ts
# R's and Java's default contexts: made on their first cell (a JVM is not started for nothing).
defaults = {"python": default, "javascript": default_js, "typescript": default_ts}


def default_of(language):
    if language == "bash":
        return Context("bash")
    if language not in defaults:
        defaults[language] = Context(language)
        contexts[defaults[language].id] = defaults[language]
    return defaults[language]


def sandbox_env():
    """The sandbox's variables, given when it was made (after this server started: it is
    restored from the template's checkpoint), as forkpoint's E2B face writes them."""
    try:
        with open("/run/e2b/envs.json") as f:
            env = json.load(f)
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
    except (OSError, ValueError):
        return {}


# ---------- results ----------

MIME_FIELDS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
    "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
    "application/json": "json", "application/javascript": "javascript",
}
REPRS = {"_repr_html_": "html", "_repr_markdown_": "markdown", "_repr_svg_": "svg", "_repr_png_": "png",
         "_repr_jpeg_": "jpeg", "_repr_latex_": "latex", "_repr_json_": "json", "_repr_javascript_": "javascript"}


def plain_text(value):
    text = repr(value)
    # E2B's server gives a string result without its quotes.
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text


def result_of(value, main):
    """A value as E2B's result: its text and every rich form it has."""
    out = {"type": "result", "is_main_result": main, "text": plain_text(value)}
    if isinstance(value, dict) and set(value) & set(MIME_FIELDS):  # a MIME bundle: display({...}, raw=True)
        out = {"type": "result", "is_main_result": main}
        for mime, field in MIME_FIELDS.items():
            if mime in value:
                out[field] = value[mime]
        return out
    for method, field in REPRS.items():
        fn = getattr(value, method, None) if not isinstance(value, type) else None
        if callable(fn):
            try:
                got = fn()
            except Exception:
                continue
            if got is None:
                continue
            if isinstance(got, tuple):  # (data, metadata)
                got = got[0]
            if isinstance(got, bytes):
                got = base64.b64encode(got).decode()
            out[field] = got
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(value, pandas.DataFrame):
        data = value.to_dict(orient="list")
        out["data"] = {k: [v.isoformat() if hasattr(v, "isoformat") else v for v in col] for k, col in data.items()}
    mpl = sys.modules.get("matplotlib.figure")
    if mpl is not None and isinstance(value, mpl.Figure):
        out.update(figure_result(value, main))
    return out


def figure_result(fig, main=False):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")  # draws it: its tick labels are set now
    out = {"type": "result", "is_main_result": main, "text": repr(fig), "png": base64.b64encode(buf.getvalue()).decode()}
    try:
        import fp_charts
        chart = fp_charts.chart_of(fig)
    except Exception:  # a figure the reader does not understand is still its picture
        chart = None
    if chart is not None:
        out["chart"] = chart
    return out


def flush_figures(emit):
    """The figures a cell made, shown once each and closed, as Jupyter's inline backend does."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        emit(figure_result(plt.figure(num)))
    plt.close("all")


# ---------- Python ----------

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

    def isatty(self):
        return False


def shell_escapes(code):
    """IPython's `!command` lines, as calls that run the command in a shell."""
    lines = []
    for line in code.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("!"):
            indent = line[: len(line) - len(stripped)]
            line = f"{indent}__fp_shell({stripped[1:]!r})"
        lines.append(line)
    return "\n".join(lines)


def patch_pil():
    """PIL images shown or saved appear as results, as in E2B's kernel."""
    try:
        from PIL import Image
    except ImportError:
        return
    if getattr(Image.Image, "_fp_shows", False):
        return
    save = Image.Image.save

    def saved(self, fp, format=None, **params):
        save(self, fp, format, **params)
        if isinstance(fp, (str, os.PathLike)):  # a file, not the buffer _repr_png_ saves into
            current_display[0](self)

    Image.Image.save = saved
    Image.Image.show = lambda self, *a, **k: current_display[0](self)
    Image.Image._fp_shows = True


def run_python(ctx, code, emit):
    def shell(command):
        r = subprocess.run(["/bin/bash", "-c", command], capture_output=True, text=True, cwd=ctx.cwd)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)

    def display(*objs, raw=False, **_):
        for obj in objs:
            emit(result_of(obj, False))

    ctx.globals["display"] = display  # bound to this cell's output
    current_display[0] = display
    if "PIL" in code:
        patch_pil()
    ctx.globals["__fp_shell"] = shell
    plt = None
    try:
        tree = ast.parse(shell_escapes(textwrap.dedent(code)), mode="exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if "matplotlib" in code or "matplotlib" in sys.modules:
            import matplotlib.pyplot as plt  # noqa: F811 (show() shows, as inline does)
            import fp_charts
            fp_charts.install()
            plt.show = lambda *a, **k: flush_figures(emit)
        exec(compile(tree, "<cell>", "exec"), ctx.globals)
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ctx.globals) if last is not None else None
        flush_figures(emit)
        if value is not None:
            emit(result_of(value, True))
    except KeyboardInterrupt:
        emit({"type": "error", "name": "KeyboardInterrupt", "value": "interrupted", "traceback": "KeyboardInterrupt: the cell was interrupted"})
    except BaseException as e:  # a cell's error is its answer, SystemExit included
        emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": traceback.format_exc()})


# ---------- JavaScript and bash ----------

def child_of(ctx):
    if ctx.child is None or ctx.child.poll() is not None:
        ctx.child = subprocess.Popen(CHILDREN[ctx.language], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ctx.cwd, env=BASE_ENV, text=True, bufsize=1)
    return ctx.child


def run_child(proc, emit, job):
    """Relays a child's NDJSON messages until its end of the cell; an interrupt ends the child."""
    job.child = proc
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except ValueError:  # the cell wrote to the process's stdout itself
            emit({"type": "stdout", "text": line})
            continue
        if not isinstance(msg, dict):
            emit({"type": "stdout", "text": line})
        elif msg.get("type") == "end_of_cell":
            return
        else:
            emit(msg)
    if job.interrupted:
        emit({"type": "error", "name": "Interrupted", "value": "interrupted", "traceback": "the cell was interrupted"})
    else:
        emit({"type": "error", "name": "KernelDied", "value": "the process of the cell's language ended", "traceback": ""})


def run_javascript(ctx, code, env, emit, job):
    node = child_of(ctx)
    node.stdin.write(json.dumps({"code": code, "env": env, "typescript": ctx.language == "typescript"}) + "\n")
    node.stdin.flush()
    run_child(node, emit, job)


def run_hex_child(ctx, code, env, emit, job):
    """A cell for the R or Java process: its code and variables in hex on one line (neither
    reads JSON without a library the image does not have)."""
    child = child_of(ctx)
    pairs = ",".join(f"{k.encode().hex()}:{str(v).encode().hex()}" for k, v in env.items())
    child.stdin.write(f"{code.encode().hex()} {pairs}\n")
    child.stdin.flush()
    run_child(child, emit, job)


def run_bash(ctx, code, env, emit, job):
    proc = subprocess.Popen(["/bin/bash", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ctx.cwd, env={**os.environ, **env})
    job.child = proc
    streams = {proc.stdout: "stdout", proc.stderr: "stderr"}
    while streams:
        ready, _, _ = select.select(list(streams), [], [])
        for f in ready:
            data = os.read(f.fileno(), 65536)
            if not data:
                del streams[f]
            else:
                emit({"type": streams[f], "text": data.decode(errors="replace")})
    code = proc.wait()
    if code != 0:
        emit({"type": "error", "name": "CommandExitError", "value": f"exit status {code}", "traceback": ""})


# ---------- the executor ----------

class Job:
    def __init__(self, ctx, code, env):
        self.ctx, self.code, self.env = ctx, code, env
        self.out = queue.Queue()
        self.state = "queued"  # queued, running, done, cancelled
        self.child = None
        self.interrupted = False

    def interrupt(self):
        if self.state == "queued":
            self.state = "cancelled"
        elif self.state == "running":
            self.interrupted = True
            if self.child is not None:
                self.child.kill() if self.ctx.language == "bash" else self.child.send_signal(signal.SIGINT)
            else:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


jobs = queue.Queue()


def stamped(put):
    """Output as E2B's server says it: a stream's text with when it came (Unix time in
    nanoseconds), which its Python SDK reads from every stdout and stderr message."""
    def emit(msg):
        if msg.get("type") in ("stdout", "stderr") and "timestamp" not in msg:
            msg = {**msg, "timestamp": time.time_ns()}
        put(msg)
    return emit


def execute(job):
    ctx, emit = job.ctx, stamped(job.out.put)
    ctx.count += 1
    emit({"type": "number_of_executions", "execution_count": ctx.count})
    env = {**sandbox_env(), **(job.env or {})}
    saved = sys.stdout, sys.stderr, dict(os.environ)
    sys.stdout, sys.stderr = Stream(emit, "stdout"), Stream(emit, "stderr")
    os.environ.update(env)
    cwd = os.getcwd()
    try:
        os.chdir(ctx.cwd)
        if ctx.language == "python":
            run_python(ctx, job.code, emit)
        elif ctx.language in NODE_LANGUAGES:
            run_javascript(ctx, job.code, env, emit, job)
        elif ctx.language in ("r", "java"):
            run_hex_child(ctx, job.code, env, emit, job)
        else:
            run_bash(ctx, job.code, env, emit, job)
    except KeyboardInterrupt:
        emit({"type": "error", "name": "KeyboardInterrupt", "value": "interrupted", "traceback": ""})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved[0], saved[1]
        os.environ.clear()
        os.environ.update(saved[2])
        os.chdir(cwd)
        emit({"type": "end_of_execution"})


def executor():
    while True:
        job = jobs.get()
        try:
            if job.state != "queued":
                continue
            job.state = "running"
            try:
                execute(job)
            except KeyboardInterrupt:  # one that came between the cell's end and here
                pass
            except Exception as e:  # the server's own failure: the cell says so, the server goes on
                job.out.put({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": traceback.format_exc()})
        finally:
            job.state = "done"
            job.out.put(None)


# ---------- HTTP ----------

def client_gone(sock):
    """Whether the client closed its end (a request has no more to send once read)."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


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
        ctx = contexts.pop(cid, None)
        if ctx is None:
            return self.reply(404, {"error": f"context {cid} not found"})
        if ctx.child is not None:
            ctx.child.kill()
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
            language = LANGUAGES.get(req.get("language") or "python")
            if language is None:
                return self.reply(400, {"error": f"language {req.get('language')} is not served here ({SERVED})"})
            ctx = Context(language, req.get("cwd") or HOME)
            contexts[ctx.id] = ctx
            return self.reply(200, ctx.view())
        if path.startswith("/contexts/") and path.endswith("/restart"):
            ctx = contexts.get(path.split("/")[2])
            if ctx is None:
                return self.reply(404, {"error": "context not found"})
            ctx.globals = {"__name__": "__main__"}
            if ctx.child is not None:
                ctx.child.kill()
                ctx.child = None
            return self.reply(200, {})
        if path != "/execute":
            return self.reply(404, {"error": "not found"})
        if not isinstance(req.get("code"), str) or not isinstance(req.get("env_vars") or {}, dict):
            return self.reply(400, {"error": "code must be a string, env_vars an object"})
        if req.get("context_id") and req.get("language"):
            return self.reply(400, {"error": "give a context or a language, not both"})
        if req.get("context_id"):
            ctx = contexts.get(req["context_id"])
            if ctx is None:
                return self.reply(404, {"error": "context not found"})
        else:
            language = LANGUAGES.get(req.get("language") or "python")
            if language is None:
                return self.reply(400, {"error": f"language {req.get('language')} is not served here ({SERVED})"})
            ctx = default_of(language)
        job = Job(ctx, req.get("code") or "", req.get("env_vars"))
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        jobs.put(job)
        try:
            while True:
                try:
                    msg = job.out.get(timeout=0.5)
                except queue.Empty:
                    if client_gone(self.connection):
                        job.interrupt()
                        return
                    continue
                if msg is None:
                    break
                line = (json.dumps(msg) + "\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away mid-answer
            job.interrupt()


if __name__ == "__main__":
    # An interrupt is SIGINT to this thread: its own handler, whatever the parent left.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    executor()
