"""The sandbox one submission runs in, and the grader's end of the channel to it.

On Linux the worker (``worker.py``) runs under bubblewrap:

- it sees read-only copies of the interpreter, the virtual environment and
  the system libraries, the worker and ``wire.py``, and nothing else: no
  ``course_lib`` (a copy installed in site-packages is hidden under an empty
  tmpfs), no checkout, no ``solutions/``;
- a private ``/tmp`` (a small tmpfs) is the only place it can write;
- no network, its own PID, IPC and UTS namespaces, one session it cannot
  leave, and it dies with the grader (``--die-with-parent``): every process it
  starts ends with it;
- a seccomp filter (``seccomp.py``) refuses what would hold memory outside its
  processes (memfds, System V and POSIX IPC, sockets, io_uring), kernel keys, new
  namespaces and mounts, and new sessions;
- bubblewrap starts with an empty environment: nothing of the grader's is readable
  inside, not even in ``/proc/1/environ`` of bubblewrap's own init;
- a uid of its own: a grader running as root drops each sandbox to a uid
  that no other sandbox running at the same time has (``SANDBOX_UIDS``, claimed
  with a lock) with ``setpriv`` (all capabilities gone, no new privileges), so
  the per-user process limit is the sandbox's alone; any other user maps its
  uid to 65534 in a user namespace of the sandbox's own, and the process limit
  is set inside it, where the kernel counts that sandbox's processes alone;
- limits on address space, CPU seconds, processes, open files, file size; a thread
  of the grader's watches the sandbox's processes for as long as it lives and ends
  it when all of them together hold more resident memory, more processes and
  threads, or more CPU time than its limits; it bounds every message it reads and
  the time of every request, however fast the data comes;
- its output goes nowhere: no file of the grader's fills, nothing stays.

No cgroup is used (``seccomp.py`` says why).  What bounds a sandbox's memory is the watch over
its processes' resident memory, the sizes of its two tmpfs (``/tmp``, ``/dev/shm``), few open
files (so few, small pipes) and the filter; what shares the CPU between sandboxes graded at once
is the kernel's per-session scheduling (autogroup: ``/proc/sys/kernel/sched_autogroup_enabled``),
a sandbox being one session, and the watch bounds the CPU time of all its processes together.

The grader acts on nothing the sandbox says but the plain data of its
replies: it kills only the process it started, by its own handle.
"""
from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import seccomp, wire

HERE = Path(__file__).resolve().parent
SANDBOX_UID = 65534                        # inside a user namespace (a grader that is not root)
SANDBOX_UIDS = range(910_000, 914_096)     # a grader running as root: one per sandbox running at once
WATCH_SECONDS = 0.25                       # how often the grader looks at a sandbox's processes


@dataclass
class Limits:
    memory_bytes: int = 4 * 2**30   # address space of each process, and memory of all of them together
    cpu_seconds: int = 600          # CPU time of each process, and of all of them together (wall time: per request)
    processes: int = 256            # processes and threads of one sandbox
    open_files: int = 128           # open files of each process (pipes and tmpfs files are the memory left open)
    file_bytes: int = 64 * 2**20    # largest file it may write
    tmp_bytes: int = 64 * 2**20     # size of its private /tmp


class SandboxUnavailable(RuntimeError):
    """No real sandbox on this machine."""


class Died(Exception):
    """The worker ended (a crash, a limit, or the grader killed it); ``reason`` says which, when known."""

    def __init__(self, reason=""):
        super().__init__(reason)
        self.reason = reason


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


def interpreter() -> str:
    """This Python by a path the sandbox can follow: its folder resolved, as only the environment is
    bound inside (``exercises/../.venv/bin`` goes through a folder the sandbox has not), its name kept
    (a virtual environment's ``python`` is a link, and Python finds its environment by that name)."""
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(sys.executable))),
                        os.path.basename(sys.executable))


def _bwrap_argv(in_fd, out_fd, limits: Limits, userns: bool, kernels=False, uid=SANDBOX_UID,
                filter_fd=None):
    import course_lib  # only to hide it where it is installed

    argv = [bwrap(), *(["--seccomp", str(filter_fd)] if filter_fd is not None else []),
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
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
        argv.extend(["--", "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"])
    else:
        # The process limit is set inside the sandbox's own user namespace, where the kernel counts
        # this sandbox's processes alone (per namespace and user); set before bwrap, it would count
        # every process of the grader's user, other sandboxes included.
        argv[1:1] = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
        argv.extend(["--", "prlimit", f"--nproc={limits.processes}:{limits.processes}", "--"])
    return argv + [interpreter(), "-I", "-B", "/grader/worker.py", str(in_fd), str(out_fd)] + (["kernels"] if kernels else [])


def _plain_argv(in_fd, out_fd, kernels=False):
    return [interpreter(), "-I", "-B", str(HERE / "worker.py"), str(in_fd), str(out_fd)] + (["kernels"] if kernels else [])


_PROBED = {}


def available() -> bool:
    """Whether a bubblewrap sandbox starts here (tried once per process)."""
    if "ok" not in _PROBED:
        ok = False
        if sys.platform.startswith("linux") and bwrap() and seccomp.supported():
            try:
                with Session(Limits(), trusted=False) as session:
                    ok = session.exec(["x = 1"], timeout=60) == {"x": "data"}
            except Exception:  # noqa: BLE001 -- a probe: any failure to start means no sandbox here
                ok = False
        _PROBED["ok"] = ok
    return _PROBED["ok"]


def why_unavailable() -> str:
    """What stops the sandbox here, in words: no bubblewrap, a bubblewrap that does not start, or a
    Python that does not start inside it."""
    if not bwrap():
        return "bubblewrap (bwrap) is not installed"
    if not seccomp.supported():
        return f"the sandbox's seccomp filter is written for {' and '.join(seccomp.NUMBERS)}, not {seccomp.machine()}"
    userns = ["--unshare-user"] if os.geteuid() != 0 else []
    fd = seccomp.program_fd()   # a kernel without seccomp filters says so here
    try:
        tried = subprocess.run([bwrap(), *userns, "--seccomp", str(fd), "--unshare-pid", "--ro-bind", "/", "/", "true"],
                               capture_output=True, text=True, timeout=30, pass_fds=(fd,))
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap is installed but does not start here ({exc})"
    finally:
        os.close(fd)
    if tried.returncode != 0:
        said = (tried.stderr.strip().splitlines() or [f"exit status {tried.returncode}"])[-1]
        return f"bubblewrap is installed but does not start here ({said})"
    return (f"bubblewrap starts, but this Python ({interpreter()}) does not start inside it, where only "
            f"{', '.join(map(str, _python_roots()))} and the system's folders are bound: run the grader "
            "with the course's .venv/bin/python")


class Session:
    """One worker: exec cells, call names, fetch values, each within a time limit.

    ``trusted=True`` runs the worker as a plain subprocess (limits, no
    isolation): only for a course's own notebooks or where no sandbox exists
    and the instructor said the submissions are trusted.  ``kernels=True``
    starts the kernel sandbox (``define`` and ``check_kernel``, not ``exec``).
    """

    def __init__(self, limits: Limits, trusted=False, userns=None, kernels=False):
        self.limits = limits
        # root drops to a uid of the sandbox's own with setpriv (a real unprivileged user outside
        # too); anyone else becomes 65534 inside a user namespace of their own
        self.userns = os.geteuid() != 0 if userns is None else userns
        self.uid, self._uid_lock = None, None
        self.seen = {"memory": 0, "threads": 0, "cpu": 0.0}   # the most the watch saw its processes hold
        self._over = ""                            # why the watch ended the sandbox
        self._closed = threading.Event()
        to_worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        passed = [to_worker_r, from_worker_w]
        try:
            in_fd, out_fd = to_worker_r, from_worker_w
            if trusted:
                argv, env = _plain_argv(in_fd, out_fd, kernels), None
            else:
                if not bwrap():
                    raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
                if not seccomp.supported():
                    raise SandboxUnavailable(why_unavailable())
                if not self.userns:
                    self.uid, self._uid_lock = _claim_uid()
                passed.append(seccomp.program_fd())
                argv = _bwrap_argv(in_fd, out_fd, limits, self.userns, kernels,
                                   SANDBOX_UID if self.uid is None else self.uid, passed[-1])
                # bubblewrap's init keeps the environment it was started with (its /proc/1/environ):
                # start it with none, the sandbox's own is set with --setenv
                env = {}
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                close_fds=True, pass_fds=passed, preexec_fn=self._child_limits, start_new_session=True)
        except BaseException:
            os.close(self._to_worker)
            os.close(self._from_worker)
            self._release_uid()
            raise
        finally:
            for fd in passed:
                os.close(fd)
        self._buffer = bytearray()
        self._seq = 0
        self._instruments = []
        threading.Thread(target=self._watch, name="sandbox watch", daemon=True).start()

    def _child_limits(self):
        limits = self.limits
        for kind, value in ((resource.RLIMIT_AS, limits.memory_bytes), (resource.RLIMIT_CPU, limits.cpu_seconds),
                            (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_CORE, 0),
                            (resource.RLIMIT_NOFILE, limits.open_files)):
            resource.setrlimit(kind, (value, value))
        # Counted per real user: as root, for this sandbox's own uid after setpriv (root itself is
        # never held to it). In a user namespace, prlimit sets it inside (_bwrap_argv).
        if os.geteuid() == 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))

    def _release_uid(self):
        if self._uid_lock is not None:
            os.close(self._uid_lock)
            self._uid_lock = None

    # -- the watch: every process of the sandbox, together ----------------------------------

    def _watch(self):
        """Every ``WATCH_SECONDS``, in a thread of the grader's, for as long as the sandbox lives, even
        while the grader is busy with a check: end the sandbox when its processes together hold more
        memory, more processes and threads, or more CPU time than its limits (the next request says why).

        CPU time counts the processes alive and those their parents reaped; a process reaped by a parent
        that ignores SIGCHLD takes its time along, so a RLIMIT_CPU of the same value bounds each one too."""
        while not self._closed.wait(WATCH_SECONDS) and self.proc.poll() is None:
            memory, threads, cpu = _tree_usage(self.proc.pid)
            self.seen["memory"], self.seen["threads"] = max(self.seen["memory"], memory), max(self.seen["threads"], threads)
            self.seen["cpu"] = max(self.seen["cpu"], cpu)
            if cpu > self.limits.cpu_seconds:
                self._over = (f"its processes used {cpu:.1f} s of CPU time together, over the sandbox's limit of "
                              f"{self.limits.cpu_seconds:g} s")
            elif memory > self.limits.memory_bytes:
                self._over = (f"its processes held {memory / 2**30:.1f} GB together, over the sandbox's limit of "
                              f"{self.limits.memory_bytes / 2**30:g} GB (--memory)")
            elif threads > self.limits.processes + 4:   # bwrap's own processes besides the sandbox's
                self._over = (f"it ran {threads} processes and threads, over the sandbox's limit of "
                              f"{self.limits.processes} (--processes)")
            if self._over:
                with contextlib.suppress(OSError):
                    self.proc.kill()  # our own child, by our own handle
                return

    def _kill(self):
        if self.proc.poll() is None:
            try:
                self.proc.kill()  # our own child, by our own handle: never a pid the sandbox wrote
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def _died(self):
        """``Died`` with what is known of why the worker ended."""
        if self._over:
            return Died(self._over)
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        signals = {signal.SIGXCPU: f"its CPU time limit of {self.limits.cpu_seconds} s",
                   signal.SIGXFSZ: f"its file size limit of {self.limits.file_bytes // 2**20} MiB",
                   signal.SIGKILL: "killed", signal.SIGSEGV: "a crash (segmentation fault)"}
        number = -code if code is not None and code < 0 else code - 128 if code is not None and code > 128 else None
        if number in signals:
            return Died(signals[number])
        if self.seen["threads"] >= self.limits.processes * 0.9:
            return Died(f"it ran {self.seen['threads']} processes and threads, at the sandbox's limit of "
                        f"{self.limits.processes} (--processes)")
        return Died("")

    # -- the channel ------------------------------------------------------------

    def _wait(self, readable, deadline):
        """Wait until the channel is ready, watching the sandbox; Timeout at the deadline, whatever arrives."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout()
            if self._over:
                self._kill()
                raise Died(self._over)
            fds = [self._from_worker] if readable else [self._to_worker]
            ready = select.select(fds, [], [], min(left, WATCH_SECONDS)) if readable else \
                select.select([], fds, [], min(left, WATCH_SECONDS))
            if ready[0] or ready[1]:
                return

    def _write(self, data, deadline):
        view = memoryview(data)
        while view:
            self._wait(False, deadline)
            try:
                n = os.write(self._to_worker, view[:1 << 16])
            except (BrokenPipeError, OSError):
                raise self._died() from None
            view = view[n:]

    def _read(self, n, deadline):
        while len(self._buffer) < n:
            self._wait(True, deadline)
            chunk = os.read(self._from_worker, min(1 << 22, max(1 << 16, n - len(self._buffer))))
            if not chunk:
                raise self._died()
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def _message(self, deadline):
        import struct
        (length,) = struct.unpack("!Q", self._read(8, deadline))
        if length > wire.MAX_HEADER:   # refused before a byte of it is read
            raise wire.WireError(f"a reply's header of {length / 2**20:.0f} MiB, over the "
                                 f"{wire.MAX_HEADER // 2**20} MiB a reply may have")
        header = wire.header_of(self._read(length, deadline))
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
        except Exception as exc:  # noqa: BLE001 -- the instrument's own refusals go back to the answer
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
        import numpy as np

        buffers = []
        # the check's np.errstate holds for the answer's arithmetic too, as it would in one process
        header = {"op": "call", "name": name, "args": wire.encode(tuple(args), buffers, remote=self._remote),
                  "kwargs": wire.encode(dict(kwargs), buffers, remote=self._remote), "errstate": np.geterr()}
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
        self._closed.set()
        for fd in (self._to_worker, self._from_worker):
            try:
                os.close(fd)
            except OSError:
                pass
        self._kill()
        self._release_uid()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def clean_error(error) -> dict:
    if type(error) is not dict:
        return {"types": [], "name": "Error", "message": "the sandbox reported an unreadable error"}
    types = [t for t in error.get("types", []) if type(t) is str][:8] if type(error.get("types")) is list else []
    text = lambda key, n: str(error.get(key, ""))[:n]
    return {"types": types, "name": text("name", 100), "message": text("message", 2000), "where": text("where", 40)}


def _claim_uid():
    """(uid, lock fd): a uid of ``SANDBOX_UIDS`` that no other sandbox holds now and no process runs as.

    Held with ``flock`` on a file of its own (released when the fd closes, or the grader dies)."""
    folder = Path("/run/course-grade-uids")
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.is_symlink() or folder.stat().st_uid != os.geteuid():
        raise SandboxUnavailable(f"{folder} is not the grader's own folder")
    busy = None
    for uid in SANDBOX_UIDS:
        fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if busy is None:
            busy = _uids_running()
        if uid in busy:   # a process of an earlier sandbox still runs as it: leave that uid alone
            os.close(fd)
            continue
        return uid, fd
    raise SandboxUnavailable(f"all {len(SANDBOX_UIDS)} sandbox uids are in use")


def _uids_running() -> set:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                pass
    return found


def _tree_usage(root_pid):
    """(resident bytes, processes and threads, CPU seconds) of ``root_pid`` and every process under it
    (the CPU time of the children they reaped included)."""
    children, usage = {}, {}
    page, tick = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()   # after "pid (comm) "
        try:
            ppid, threads, rss = int(fields[1]), int(fields[17]), int(fields[21])
            ticks = sum(int(f) for f in fields[11:15])   # utime, stime, cutime, cstime
        except (IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
        usage[int(entry)] = (rss * page, threads, ticks / tick)
    memory = threads = cpu = 0
    todo, seen = [root_pid], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        rss, n, seconds = usage.get(pid, (0, 0, 0))
        memory, threads, cpu = memory + rss, threads + n, cpu + seconds
        todo.extend(children.get(pid, []))
    return memory, threads, cpu
