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

Started with a third argument, ``kernels``, it is the kernel sandbox instead
(``kernels.py`` says why): the ``cudacheck`` package lies beside it, no answer cell ever
runs in it, and it takes two other requests:

- ``define``: define the ``@cuda.jit`` functions of one cell from the source the
  grader kept of it, with only the names the grader lists (``cuda`` is
  cudacheck's stand-in, builtins a short list, ``print`` silent);
- ``check``: ``cudacheck.check`` one of them on plain-data arguments; the reply
  is the report and the arrays the kernel wrote, as plain data.

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
def display(*objs, **kwargs):
    """IPython's ``display`` in a notebook; here it prints (the sandbox's output goes nowhere)."""
    print(*objs)


NAMESPACE = {"__name__": "__main__", "__builtins__": builtins, "display": display}
KERNELS = {}             # kernel sandbox: name -> the kernel its latest cell defined
cudacheck = None         # kernel sandbox: the module, imported by serve()
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


def _errstate(modes):
    """numpy's floating-point error handling as the grader's check has it around the call."""
    import numpy as np

    known = ("ignore", "warn", "raise", "print")   # "call" and "log" need a handler the grader cannot send
    modes = {k: v for k, v in (modes if type(modes) is dict else {}).items()
             if k in ("divide", "over", "under", "invalid") and v in known}
    return np.errstate(**modes)


def _kind(value):
    return "callable" if callable(value) else "data"


def _compiled(source, label, index=0):
    """A cell's code, from a real file, as a kernel has: numba's cache=True, tracebacks and
    cudacheck's reports find its lines there."""
    label = "".join(ch if ch.isalnum() else "_" for ch in str(label))[:40]
    path = os.path.join(CELLS, f"answer_{label}_{index}_{len(os.listdir(CELLS))}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(plain_python(source))
    return compile(plain_python(source), path, "exec")


def _exec(request):
    before = {name: id(value) for name, value in NAMESPACE.items()}
    for index, source in enumerate(request.get("cells", [])):
        exec(_compiled(source, request.get("label", ""), index), NAMESPACE)
    names = {name: _kind(value) for name, value in NAMESPACE.items()
             if not (name.startswith("__") and name.endswith("__")) and type(value) is not type(os)
             and before.get(name) != id(value)}
    return {"names": names}


def _define(request):
    import math

    import numpy as np

    allowed = {name: getattr(builtins, name) for name in request["builtins"] if name != "print"}
    allowed["print"] = lambda *args, **kwargs: None
    names = {"__name__": "kernels", "__builtins__": allowed, "math": math, "np": np, "numpy": np,
             "cuda": cudacheck.STANDIN}
    names.update({t: np.bool_ if t == "boolean" else getattr(np, t) for t in request["types"]})
    exec(_compiled(request["source"], request.get("label", "kernels")), names)
    for name in request["names"]:
        KERNELS[name] = names[name]


def _check(request, buffers):
    args = []
    for arg in wire.decode(request.get("args"), buffers):
        if type(arg) is dict and list(arg) == ["cudacheck.uninitialized"]:
            shape, dtype = arg["cudacheck.uninitialized"]
            arg = cudacheck.uninitialized(tuple(shape), np_dtype(dtype))
        args.append(arg)
    grid, block = (wire.decode(request.get(k), buffers) for k in ("griddim", "blockdim"))
    try:
        report = cudacheck.check(KERNELS[request["name"]], grid, block, *args)
    except cudacheck.KernelError as exc:
        return {"kernel_error": {"message": str(exc)[:4000], "cause": _error(exc.__cause__ or exc)}}
    written = []
    for i, arg in enumerate(args):
        if isinstance(arg, cudacheck.Uninitialized):
            written.append([i, arg.copy_to_host()])
        elif type(arg).__name__ == "ndarray" and arg.flags.writeable:
            written.append([i, arg])
    as_ints = lambda t: None if t is None else [int(v) for v in t]
    findings = [{"kind": f.kind, "message": f.message, "block": as_ints(f.block), "thread": as_ints(f.thread),
                 "array": f.array, "index": as_ints(f.index), "line": f.line, "count": f.count}
                for f in report.findings]
    return {"report": {"findings": findings, "intervals": report.intervals, "traffic": dict(report.traffic),
                       "prefetch_intervals": report.prefetch_intervals,
                       "griddim": as_ints(report.griddim), "blockdim": as_ints(report.blockdim)},
            "written": written}


def np_dtype(name):
    import numpy as np
    return np.dtype(name)


def serve():
    global IN, OUT, CELLS, cudacheck
    if sys.argv[3:] == ["kernels"]:
        here = os.path.dirname(os.path.abspath(__file__))
        # beside this file in the sandbox; one folder up (course_lib) when run as a plain process
        sys.path.insert(0, here if os.path.isdir(os.path.join(here, "cudacheck")) else os.path.dirname(here))
        import cudacheck as module
        cudacheck = module
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
            if cudacheck is not None and op in ("define", "check"):
                value = _define(request) if op == "define" else _check(request, buffers)
                reply.update(ok=True, value=wire.encode(value, out))
            elif cudacheck is not None:
                raise ValueError(f"the kernel sandbox takes define and check, not {op!r}")
            elif op == "exec":
                reply.update(_exec(request), ok=True)
            elif op == "call":
                args = wire.decode(request.get("args"), buffers, remote=Remote)
                kwargs = wire.decode(request.get("kwargs"), buffers, remote=Remote)
                with _errstate(request.get("errstate")):
                    value = NAMESPACE[request["name"]](*args, **kwargs)
                reply.update(ok=True, value=wire.encode(value, out))
            elif op == "get":
                reply.update(ok=True, value=wire.encode(NAMESPACE[request["name"]], out))
            else:
                raise ValueError(f"unknown request {op!r}")
        except BaseException as exc:  # noqa: BLE001 -- the answer's exceptions are results, not the worker's end
            if isinstance(exc, SystemExit):
                exc = RuntimeError(f"the answer called exit({exc.code!r})")
            reply, out = {"seq": _seq[0], "ok": False, "error": _error(exc)}, []
        try:
            _send(reply, out)
        except wire.WireError as exc:
            _send({"seq": _seq[0], "ok": False, "error": _error(exc)})


if __name__ == "__main__":
    serve()
