"""The sandbox one submission runs in, and the grader's end of the channel to it.

On Linux the worker (``worker.py``) runs under bubblewrap:

- it sees read-only copies of the interpreter, the virtual environment and
  the system libraries, the worker and ``wire.py``, and nothing else: no
  ``course_lib`` (a copy installed in site-packages is hidden under an empty
  tmpfs), no checkout, no ``solutions/``;
- a private ``/tmp`` (a small tmpfs) is the only place it can write;
- no network, its own PID, IPC and UTS namespaces, a new session, and it dies
  with the grader (``--die-with-parent``): every process it starts ends with it;
- uid 65534: a grader running as root drops to it with ``setpriv`` (all
  capabilities gone, no new privileges), any other user maps its uid to
  65534 in a user namespace;
- limits on address space, CPU seconds, processes, file size; the grader
  bounds every message it reads and the time of every request.

The grader acts on nothing the sandbox says but the plain data of its
replies: it kills only the process it started, by its own handle.
"""
from __future__ import annotations

import builtins
import os
import resource
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import wire

HERE = Path(__file__).resolve().parent
SANDBOX_UID = 65534


@dataclass
class Limits:
    memory_bytes: int = 4 * 2**30   # address space of each process
    cpu_seconds: int = 600          # CPU time of each process (wall time is bounded per request)
    processes: int = 256            # processes and threads of the sandbox's user
    file_bytes: int = 64 * 2**20    # largest file it may write (its log included)
    tmp_bytes: int = 64 * 2**20     # size of its private /tmp


class SandboxUnavailable(RuntimeError):
    """No real sandbox on this machine."""


class Died(Exception):
    """The worker ended (a crash, a limit, or the grader killed it)."""


class Timeout(Exception):
    """A request ran past its time."""


class AnswerRaised(Exception):
    """The answer raised; ``error`` is what the worker reported (types, message)."""

    def __init__(self, error):
        super().__init__(error.get("message", ""))
        self.error = error


def bwrap() -> str | None:
    return shutil.which("bwrap")


def _python_roots():
    roots = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix),
             Path(os.path.realpath(sys.executable)).parent.parent}
    return sorted({r for r in roots if r.exists()} | {r.resolve() for r in roots if r.exists()})


def _bwrap_argv(in_fd, out_fd, limits: Limits, userns: bool, kernels=False):
    import course_lib  # only to hide it where it is installed

    argv = [bwrap(), "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--proc", "/proc", "--dev", "/dev",
            # the private /tmp first: a Python or .venv that lives under /tmp (a checkout there) is
            # bound on top of it below, instead of being hidden by it
            "--perms", "01777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
            "--perms", "01777", "--size", str(8 * 2**20), "--tmpfs", "/dev/shm"]  # numba's parallel lock
    made = {Path("/"), Path("/tmp")}

    def parents(path: Path):
        for parent in reversed(path.parents):
            if parent not in made:
                argv.extend(["--perms", "0755", "--dir", str(parent)])
                made.add(parent)

    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv.extend(["--symlink", os.readlink(top), top])
        elif os.path.isdir(top):
            argv.extend(["--ro-bind", top, top])
        made.add(Path(top))
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "passwd", "group"):
        if os.path.exists(f"/etc/{name}"):
            parents(Path("/etc") / name)
            argv.extend(["--ro-bind", f"/etc/{name}", f"/etc/{name}"])
    for root in _python_roots():
        if any(root == m or m in root.parents for m in made if str(m) in ("/usr",)):
            continue
        parents(root)
        argv.extend(["--ro-bind", str(root), str(root)])
        made.add(root)
    package = Path(course_lib.__file__).resolve().parent
    if any(r in package.parents for r in _python_roots()):
        argv.extend(["--tmpfs", str(package)])  # installed, not editable: hide it
    argv.extend(["--dir", "/grader", "--ro-bind", str(HERE / "worker.py"), "/grader/worker.py",
                 "--ro-bind", str(HERE / "wire.py"), "/grader/wire.py"])
    if kernels:  # the kernel sandbox: cudacheck beside the worker, and still nothing else of the course
        argv.extend(["--ro-bind", str(HERE.parent / "cudacheck"), "/grader/cudacheck"])
    argv.extend(["--remount-ro", "/", "--chdir", "/tmp"])
    env = {"HOME": "/tmp", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
           "NUMBA_CACHE_DIR": "/tmp/numba", "NUMBA_OPT": "0", "MPLCONFIGDIR": "/tmp/mpl", "MPLBACKEND": "Agg"}
    for key, value in env.items():
        argv.extend(["--setenv", key, value])
    if not userns:
        argv.extend(["--", "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"])
    else:
        argv[1:1] = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
        argv.append("--")
    return argv + [sys.executable, "-I", "-B", "/grader/worker.py", str(in_fd), str(out_fd)] + (["kernels"] if kernels else [])


def _plain_argv(in_fd, out_fd, kernels=False):
    return [sys.executable, "-I", "-B", str(HERE / "worker.py"), str(in_fd), str(out_fd)] + (["kernels"] if kernels else [])


_PROBED = {}


def available() -> bool:
    """Whether a bubblewrap sandbox starts here (tried once per process)."""
    if "ok" not in _PROBED:
        ok = False
        if sys.platform.startswith("linux") and bwrap():
            try:
                with Session(Limits(), trusted=False) as session:
                    ok = session.exec(["x = 1"], timeout=60) == {"x": "data"}
            except Exception:
                ok = False
        _PROBED["ok"] = ok
    return _PROBED["ok"]


class Session:
    """One worker: exec cells, call names, fetch values, each within a time limit.

    ``trusted=True`` runs the worker as a plain subprocess (limits, no
    isolation): only for a course's own notebooks or where no sandbox exists
    and the instructor said the submissions are trusted.  ``kernels=True``
    starts the kernel sandbox (``define`` and ``check_kernel``, not ``exec``).
    """

    def __init__(self, limits: Limits, trusted=False, log_path=None, userns=None, kernels=False):
        self.limits = limits
        # root drops to uid 65534 with setpriv (a real unprivileged user outside too); anyone
        # else becomes 65534 inside a user namespace of their own
        self.userns = os.geteuid() != 0 if userns is None else userns
        to_worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        log = open(log_path or os.devnull, "wb")
        try:
            in_fd, out_fd = to_worker_r, from_worker_w
            if trusted:
                argv = _plain_argv(in_fd, out_fd, kernels)
            else:
                if not bwrap():
                    raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
                argv = _bwrap_argv(in_fd, out_fd, limits, self.userns, kernels)
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
                pass_fds=(in_fd, out_fd), preexec_fn=self._child_limits, start_new_session=True)
        except BaseException:
            os.close(self._to_worker)
            os.close(self._from_worker)
            raise
        finally:
            os.close(to_worker_r)
            os.close(from_worker_w)
            log.close()
        self._buffer = b""
        self._seq = 0
        self._instruments = []

    def _child_limits(self):
        limits = self.limits
        for kind, value in ((resource.RLIMIT_AS, limits.memory_bytes), (resource.RLIMIT_CPU, limits.cpu_seconds),
                            (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(kind, (value, value))
        # Counted per real user: as root, for uid 65534 after setpriv (root itself is never
        # held to it); as anyone else, for that user, so leave room for what already runs.
        n = limits.processes + (0 if os.geteuid() == 0 else _processes_of(os.getuid()))
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))

    # -- the channel ------------------------------------------------------------

    def _write(self, data, deadline):
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [self._to_worker], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise Timeout()
            try:
                n = os.write(self._to_worker, view[:1 << 16])
            except (BrokenPipeError, OSError):
                raise Died() from None
            view = view[n:]

    def _read(self, n, deadline):
        while len(self._buffer) < n:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_worker], [], [], max(0.0, left))
            if not ready:
                raise Timeout()
            chunk = os.read(self._from_worker, 1 << 20)
            if not chunk:
                raise Died()
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _message(self, deadline):
        import struct
        (length,) = struct.unpack("!Q", self._read(8, deadline))
        if length > wire.MAX_MESSAGE:
            raise wire.WireError("the sandbox sent a message over the size limit")
        import json
        try:
            header = json.loads(self._read(length, deadline).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise wire.WireError("the sandbox sent a malformed message") from None
        sizes = header.get("sizes") if type(header) is dict else None
        if type(sizes) is not list or not all(type(s) is int and s >= 0 for s in sizes) \
                or sum(sizes) + length > wire.MAX_MESSAGE:
            raise wire.WireError("the sandbox sent a malformed message")
        return header, [self._read(s, deadline) for s in sizes]

    def _request(self, header, buffers=(), timeout=60.0):
        self._seq += 1
        seq = self._seq
        deadline = time.monotonic() + timeout
        self._write(wire.pack(dict(header, seq=seq), buffers), deadline)
        while True:
            reply, data = self._message(deadline)
            if reply.get("op") == "remote":
                self._answer_remote(reply, data, deadline)
                continue
            if reply.get("seq") != seq:
                raise wire.WireError("the sandbox answered out of turn")
            if reply.get("ok") is True:
                return reply, data
            error = reply.get("error")
            raise AnswerRaised(clean_error(error))

    def _answer_remote(self, request, data, deadline):
        """An answer used an instrument: do it here, on the real object, with plain data only."""
        buffers = []
        try:
            handle, action = request.get("id"), request.get("action")
            if type(handle) is not int or not 0 <= handle < len(self._instruments):
                raise wire.WireError("no such instrument")
            obj = self._instruments[handle]
            args = [wire.decode(a, data) for a in request.get("args", [])] if type(request.get("args")) is list else []
            if action == "getitem" and len(args) == 1:
                value = obj[args[0]]
            elif action == "len" and not args:
                value = len(obj)
            elif action == "getattr" and len(args) == 1 and type(args[0]) is str and not args[0].startswith("_"):
                value = getattr(obj, args[0])
                if callable(value):
                    raise AttributeError(f"{args[0]} of an instrument cannot be called from an answer")
            elif action == "array" and not args:
                value = obj.__array__()
            else:
                raise TypeError("an instrument supports obj[...], len(obj), np.asarray(obj) and its data attributes")
            reply = {"ok": True, "value": wire.encode(value, buffers, remote=self._remote)}
        except Exception as exc:  # the instrument's own refusals go back to the answer
            types = [t.__name__ for t in type(exc).__mro__ if getattr(builtins, t.__name__, None) is t]
            reply, buffers = {"ok": False, "error": {"types": types, "message": str(exc)[:2000]}}, []
        self._write(wire.pack(reply, buffers), deadline)

    def _remote(self, obj):
        """Handles for objects the course defined (instruments); plain data never gets here."""
        if type(obj).__module__ != "__course__":
            return None
        self._instruments.append(obj)
        return len(self._instruments) - 1

    # -- what the grader asks -------------------------------------------------------

    def exec(self, cells, label="", timeout=60.0) -> dict:
        reply, _ = self._request({"op": "exec", "cells": list(cells), "label": label}, timeout=timeout)
        names = reply.get("names")
        if type(names) is not dict:
            raise wire.WireError("the sandbox sent a malformed reply")
        return {str(k)[:200]: v for k, v in names.items() if v in ("callable", "data")}

    def call(self, name, args, kwargs, timeout=60.0):
        buffers = []
        header = {"op": "call", "name": name, "args": wire.encode(tuple(args), buffers, remote=self._remote),
                  "kwargs": wire.encode(dict(kwargs), buffers, remote=self._remote)}
        reply, data = self._request(header, buffers, timeout=timeout)
        return wire.decode(reply.get("value"), data)

    def get(self, name, timeout=60.0):
        reply, data = self._request({"op": "get", "name": name}, timeout=timeout)
        return wire.decode(reply.get("value"), data)

    # -- what the grader asks the kernel sandbox ----------------------------------------

    def define(self, source, names, label="", timeout=60.0):
        """Define the kernels ``names`` from the source ``kernels.extract`` kept of a cell."""
        from .kernels import BUILTINS, NUMBA_TYPES

        self._request({"op": "define", "source": source, "names": list(names), "label": label,
                       "builtins": list(BUILTINS), "types": list(NUMBA_TYPES)}, timeout=timeout)

    def check_kernel(self, name, griddim, blockdim, args, timeout=60.0):
        """cudacheck.check(name, griddim, blockdim, *args) there: its reply, as plain data."""
        buffers = []
        header = {"op": "check", "name": name, "griddim": wire.encode(griddim, buffers),
                  "blockdim": wire.encode(blockdim, buffers), "args": wire.encode(tuple(args), buffers)}
        reply, data = self._request(header, buffers, timeout=timeout)
        return wire.decode(reply.get("value"), data)

    def close(self):
        """End the worker and everything it started (its PID namespace dies with it)."""
        for fd in (self._to_worker, self._from_worker):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                self.proc.kill()  # our own child, by our own handle: never a pid the sandbox wrote
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def clean_error(error) -> dict:
    if type(error) is not dict:
        return {"types": [], "name": "Error", "message": "the sandbox reported an unreadable error"}
    types = [t for t in error.get("types", []) if type(t) is str][:8] if type(error.get("types")) is list else []
    text = lambda key, n: str(error.get(key, ""))[:n]  # noqa: E731
    return {"types": types, "name": text("name", 100), "message": text("message", 2000), "where": text("where", 40)}


def _processes_of(uid) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return n
