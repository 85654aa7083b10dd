"""The process inside the sandbox: it runs answer cells and calls what they define.

    python -I -B worker.py IN_FD OUT_FD        (started by course_lib.grading.sandbox)

Standard library, numpy and ``wire`` (copied in beside this file) only: the
sandbox has no ``course_lib``.  The grader sends requests on IN_FD and reads
one reply per request on OUT_FD:

- ``exec``: run cells (the set's setup cells, then a submission's answer
  cells) in one namespace, as a kernel would; the reply lists the names
  defined, as ``callable`` or ``data``.
- ``call``: call a defined name with arguments decoded from plain data; while
  it runs, an argument that is one of the grader's instruments is a
  ``Remote`` whose item reads, ``len`` and attributes are asked of the grader.
- ``get``: the value of a defined name, as plain data.

Everything here runs beside the answer's code, so the grader believes none of
it beyond the data it decodes; this file only makes honest answers work.
"""
import builtins
import os
import shutil
import sys
import tempfile
import traceback

try:
    from . import wire  # imported by the grader, for plain_python
except ImportError:  # run as a script in the sandbox: wire.py lies beside it, no package around
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import wire

IN = OUT = CELLS = None  # the channel and a folder for the cells, made by serve()
NAMESPACE = {"__name__": "__main__", "__builtins__": builtins}
_seq = [0]


def plain_python(source: str) -> str:
    """A cell without its IPython lines (``%magic``, ``!shell``): each becomes ``pass``, indent kept.

    The grader runs cells as plain Python, with no IPython around them."""
    lines = []
    for line in source.splitlines():
        body = line.lstrip()
        lines.append(line[:len(line) - len(body)] + "pass  # " + body if body[:1] in ("%", "!") else line)
    return "\n".join(lines)


def _send(header, buffers=()):
    OUT.write(wire.pack(header, buffers))


def _error(exc):
    types = [t.__name__ for t in type(exc).__mro__ if getattr(builtins, t.__name__, None) is t]
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f"line {f.lineno}" for f in reversed(frames) if CELLS and f.filename.startswith(CELLS)), "")
    return {"types": types[:8], "name": type(exc).__name__[:100], "message": str(exc)[:2000], "where": where}


class Remote:
    """An instrument of the grader's: every use is a question to the grader."""

    def __init__(self, handle):
        object.__setattr__(self, "_handle", handle)

    def _ask(self, action, *args):
        buffers = []
        _send({"op": "remote", "seq": _seq[0], "id": self._handle, "action": action,
               "args": [wire.encode(a, buffers) for a in args]}, buffers)
        header, buffers = wire.unpack(IN)
        if header.get("ok"):
            return wire.decode(header.get("value"), buffers, remote=Remote)
        raise _rebuilt(header.get("error") or {})

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __len__(self):
        return self._ask("len")

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __array__(self, *args, **kwargs):
        return self._ask("array")

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        return f"<instrument {self._handle} of the grader>"


def _rebuilt(error):
    kind = next((getattr(builtins, n) for n in error.get("types", []) if isinstance(getattr(builtins, n, None), type)
                 and issubclass(getattr(builtins, n), BaseException)), RuntimeError)
    return kind(error.get("message", ""))


def _kind(value):
    return "callable" if callable(value) else "data"


def _exec(request):
    before = {name: id(value) for name, value in NAMESPACE.items()}
    for index, source in enumerate(request.get("cells", [])):
        # a real file, as a kernel has, so that numba's cache=True and tracebacks find the source
        label = "".join(ch if ch.isalnum() else "_" for ch in str(request.get("label", "")))[:40]
        path = os.path.join(CELLS, f"answer_{label}_{index}_{len(os.listdir(CELLS))}.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(plain_python(source))
        code = compile(plain_python(source), path, "exec")
        exec(code, NAMESPACE)
    names = {name: _kind(value) for name, value in NAMESPACE.items()
             if not (name.startswith("__") and name.endswith("__")) and type(value) is not type(os)
             and before.get(name) != id(value)}
    return {"names": names}


def serve():
    global IN, OUT, CELLS
    IN = os.fdopen(int(sys.argv[1]), "rb", buffering=0)
    OUT = os.fdopen(int(sys.argv[2]), "wb", buffering=0)
    CELLS = tempfile.mkdtemp(prefix="answers-")
    try:
        _serve()
    finally:
        shutil.rmtree(CELLS, ignore_errors=True)


def _serve():
    while True:
        try:
            request, buffers = wire.unpack(IN)
        except EOFError:
            return
        _seq[0] = request.get("seq")
        reply, out = {"seq": _seq[0]}, []
        try:
            op = request.get("op")
            if op == "exec":
                reply.update(_exec(request), ok=True)
            elif op == "call":
                args = wire.decode(request.get("args"), buffers, remote=Remote)
                kwargs = wire.decode(request.get("kwargs"), buffers, remote=Remote)
                value = NAMESPACE[request["name"]](*args, **kwargs)
                reply.update(ok=True, value=wire.encode(value, out))
            elif op == "get":
                reply.update(ok=True, value=wire.encode(NAMESPACE[request["name"]], out))
            else:
                raise ValueError(f"unknown request {op!r}")
        except BaseException as exc:  # the answer's exceptions are results, not the worker's end
            if isinstance(exc, SystemExit):
                exc = RuntimeError(f"the answer called exit({exc.code!r})")
            reply, out = {"seq": _seq[0], "ok": False, "error": _error(exc)}, []
        try:
            _send(reply, out)
        except wire.WireError as exc:
            _send({"seq": _seq[0], "ok": False, "error": _error(exc)})


if __name__ == "__main__":
    serve()
