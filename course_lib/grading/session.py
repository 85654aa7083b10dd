"""One submission's answers in their sandbox, as the course's check cells see them.

A check cell runs in the grader; a name an answer defined stands in it for what lies in the
sandbox: a function as an ``AnswerProxy`` (each call crosses to the sandbox with plain data),
a kernel as a ``KernelAnswer`` (cudacheck on it runs in the kernel sandbox), data as its
value, fetched once.  ``Run.answering`` is the one mapping of what can go wrong while a
sandbox answers: the answer's own exception is rebuilt here; a timeout, a dead process or a
reply that is not plain data ends the exercise (``Stop``) and that sandbox.
"""
from __future__ import annotations

import builtins
import contextlib
import signal
import threading
import time

from . import kernels, sandbox, wire
from .names import sandbox_setup
from .submission import tags

ALARM_GRACE = 1.0   # seconds past a deadline before the grader's own work is interrupted


class Stop(BaseException):
    """The sandbox timed out or died during a check, or a deadline passed (``alarm``: the grader was
    interrupted wherever it was, so its sandboxes may be mid-message): ends the check, whatever it catches."""

    def __init__(self, status, reason, alarm=False):
        super().__init__(reason)
        self.status, self.reason, self.alarm = status, reason, alarm


# -- the answer's own exceptions --------------------------------------------------------------

def rebuilt(error, kind=None):
    """The exception an answer raised, here: ``kind``, else the nearest builtin Exception type of
    the sandbox's description ``error`` (types, name, message, where), which it carries along."""
    if kind is None:
        kinds = (getattr(builtins, name, None) for name in error.get("types", []))
        kind = next((k for k in kinds if isinstance(k, type) and issubclass(k, Exception)), None)
    if kind is None:
        exc = RuntimeError(f"{error.get('name', 'Error')}: {error.get('message', '')}")
    else:
        exc = kind(error.get("message", ""))
    exc.from_answer = error
    return exc


def from_answer(exc):
    """What the sandbox said of the answer's exception that ``exc`` rebuilds, or None."""
    return getattr(exc, "from_answer", None)


def answer_outcome(error, where):
    """(status, reason) of an exercise that the answer's exception ``error`` ended."""
    name, message = error.get("name", "Error"), one_line(error.get("message", ""))
    if "NotImplementedError" in error.get("types", []):
        return "fail", "not implemented yet"
    text = f"{name}: {message}" if message else name
    if name == "WireError":
        text = f"what the answer gave back is {message}"
    elif name == "NameError":
        text += " (the grader runs only the course's cells and your answer cells: define what you use there)"
    elif name == "ModuleNotFoundError" and "course_lib" in message:
        text += " (answers cannot use the course's library: write the code yourself)"
    elif "can't start new thread" in message or "Resource temporarily unavailable" in message:
        text += " (the sandbox's limit on processes and threads: --processes)"
    return "error", f"{text} (in the {where}{' ' + error['where'] if error.get('where') else ''})"


def one_line(text, width=120) -> str:
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= width else line[:width - 3] + "..."


# -- what stands in a check cell for the answer's names -------------------------------------------

class AnswerProxy:
    """Stands in, in the grader, for a function an answer defined; each call crosses to the sandbox."""

    def __init__(self, run, name):
        self._run, self._name = run, name

    def __call__(self, *args, **kwargs):
        return self._run.call(self._name, args, kwargs)

    def __repr__(self):
        return f"<answer {self._name} (in the sandbox)>"


class KernelAnswer:
    """Stands in, in the grader, for a kernel an answer defined: ``cudacheck.check`` on it runs
    in the kernel sandbox (``Run.check_kernel``), and only its report and arrays come back."""

    def __init__(self, run, name, problems, unfinished=False):
        self._run, self.__name__, self._problems, self._unfinished = run, name, problems, unfinished

    def __cudacheck__(self, griddim, blockdim, *args):
        from course_lib.checks import CheckFailed

        if self._problems and self._unfinished:   # the stub, and what it leaves undefined
            raise rebuilt({"types": ["NotImplementedError"], "name": "NotImplementedError",
                           "message": f"{self.__name__} is not written yet", "where": ""})
        if self._problems:
            raise CheckFailed(f"the grader cannot run this kernel: {self._problems[0]}")
        return self._run.check_kernel(self.__name__, griddim, blockdim, args)

    def __getitem__(self, launch):
        raise TypeError(f"in grading, {self.__name__} runs only through cudacheck.check(kernel, grid, block, ...)")

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.__name__} is a kernel: launch it through cudacheck.check")

    def __repr__(self):
        return f"<kernel {self.__name__} (checked in the kernel sandbox)>"


# -- the sandboxes of one submission ----------------------------------------------------------

class Run:
    """One submission: a sandbox for its answers and a namespace here for the course's cells."""

    def __init__(self, pristine, answers, limits, timeout, trusted, submission_timeout=None):
        self.pristine, self.answers = pristine, answers
        self.limits, self.timeout, self.trusted = limits, timeout, trusted
        self.setup = sandbox_setup(pristine)
        self.replay = []          # answer cells that ran without killing their sandbox
        self.names = {}           # what the answers defined, by kind
        self.kernels = {}         # the answers' @cuda.jit functions: name -> their cell's kernels.Kernels
        self.session = None
        self.died = False            # the answers' sandbox died since the exercise began (pipeline._exercise)
        self.kernel_session = None   # the kernel sandbox, started by the first check of a kernel
        self.deadline_at = None      # when the running check must end (time.monotonic())
        self.check_limit = f"the {timeout:g} s of its check"
        # the whole submission: by default an answer and a check per exercise, and room for restarts
        n = sum(1 for c in pristine.cells if "check" in tags(c))
        self.begin = time.monotonic()
        self.end = self.begin + (submission_timeout or timeout * (2 * n + 2))
        self._deadlines = []      # (monotonic time, reason) of the deadlines armed, innermost last
        self._quiet = 0           # > 0 while a sandbox starts or ends: the alarm waits

    # -- time --------------------------------------------------------------------------------

    def left(self, limit):
        """Seconds a request may take: its own limit, cut to what the submission has left."""
        left = min(limit, self.end - time.monotonic())
        if left <= 0:
            raise sandbox.Timeout()
        return left

    def check_left(self):
        """The seconds left to the check that is running; a Stop when there are none."""
        left = min(self.deadline_at, self.end) - time.monotonic()
        if left <= 0:
            raise Stop("timeout", self.out_of_time(f"the check ran longer than {self.timeout:g} s"))
        return left

    def deadline_of_check(self):
        """The running check's deadline (``self.deadline_at``), over the grader's own work too."""
        return self.deadline(self.deadline_at, f"the check ran longer than {self.timeout:g} s")

    def out_of_time(self, what):
        if time.monotonic() >= self.end:
            return f"the submission ran past its {self.end - self.begin:g} s in all"
        return what

    @contextlib.contextmanager
    def deadline(self, until, reason):
        """Whatever runs inside, the grader's own work included (a check's loops), stops at ``until``
        (``time.monotonic()``) with ``Stop("timeout", reason, alarm=True)``: a SIGALRM timer, in the
        main thread (elsewhere only the sandbox's requests are bounded)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        outermost = not self._deadlines
        previous = signal.signal(signal.SIGALRM, self._alarm) if outermost else None
        self._deadlines.append((min(until, self.end), reason))
        self._arm()
        try:
            yield
        finally:
            self._deadlines.pop()
            signal.setitimer(signal.ITIMER_REAL, 0)
            if outermost:
                signal.signal(signal.SIGALRM, previous)
            else:
                self._arm()

    def _arm(self):
        # a second late: a request to the sandbox that runs up to the deadline ends on its own,
        # with its own words (what ran too long); the alarm is for the grader's own work
        until = min(t for t, _ in self._deadlines) + ALARM_GRACE
        signal.setitimer(signal.ITIMER_REAL, max(0.001, until - time.monotonic()))

    @contextlib.contextmanager
    def no_alarm(self):
        """Starting or ending a sandbox is never cut in half (a process or its uid left behind): a
        deadline that passes meanwhile stops what runs right after."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def _alarm(self, signum, frame):
        if self._quiet:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        now = time.monotonic()
        passed = [(t, reason) for t, reason in self._deadlines if t + ALARM_GRACE <= now + 0.001]
        if not passed:   # early by a hair: wait for the rest
            self._arm()
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise Stop("timeout", self.out_of_time(min(passed)[1]), alarm=True)

    def reset(self):
        """After a deadline interrupted the grader: its sandboxes may be mid-message, so end them."""
        self.stop()
        self.stop_kernels()

    @contextlib.contextmanager
    def answering(self, what, limit, kernel=False):
        """What can go wrong while a sandbox (``kernel``: the kernel sandbox) answers a request for
        ``what`` (``f(...)``, the answer cell, cudacheck on a kernel), within ``limit`` (words).

        The answer's own exception is raised here, rebuilt (``rebuilt``); a timeout, a dead process
        or a reply that is not plain data stops that sandbox and ends the exercise (``Stop``)."""
        stop = self.stop_kernels if kernel else self.stop
        try:
            yield
        except sandbox.AnswerRaised as exc:
            raise rebuilt(exc.error) from None
        except sandbox.Timeout:
            stop()
            raise Stop("timeout", self.out_of_time(f"{what} ran longer than {limit}")) from None
        except (sandbox.Died, EOFError, OSError) as exc:
            self.died = self.died or not kernel
            stop()
            why = getattr(exc, "reason", "") or "a crash, or a limit on memory, CPU time or processes"
            raise Stop("error", f"the {'kernel' if kernel else 'answer'}'s process died ({why})") from None
        except wire.WireError as exc:
            stop()  # the channel may be out of step: the next request gets a fresh sandbox
            raise Stop("error", f"{what} sent a reply that is not plain data ({exc})") from None

    # -- the answers' sandbox ------------------------------------------------------------------

    def start(self):
        """A fresh sandbox with the setup and the answers so far; one that now hangs or dies is dropped."""
        while True:
            with self.no_alarm():
                self.session = sandbox.Session(self.limits, trusted=self.trusted)
            self.session.exec(self.setup, label="setup", timeout=self.left(max(60.0, self.timeout)))
            for label, cells in self.replay:
                try:
                    self.session.exec(cells, label=label, timeout=self.left(self.timeout))
                except sandbox.AnswerRaised:
                    pass
                except (sandbox.Timeout, sandbox.Died):
                    self.stop()
                    if time.monotonic() >= self.end:
                        raise
                    self.replay.remove((label, cells))
                    break
            else:
                return

    def restart(self):
        """Start the answers' sandbox again if a check or answer stopped it."""
        if self.session is None:
            with self.answering("the answers", f"{self.timeout:g} s when the sandbox was restarted"):
                self.start()

    def stop(self):
        if self.session is not None:
            with self.no_alarm():
                self.session.close()
            self.session = None

    def stop_kernels(self):
        if self.kernel_session is not None:
            with self.no_alarm():
                self.kernel_session.close()
            self.kernel_session = None

    def close(self):
        self.stop()
        self.stop_kernels()

    def exec_answer(self, ex):
        """(status, reason) if the answer cells of ``ex`` did not run clean, else None."""
        cells = [self.answers[i] for i in ex.answer_ids]
        try:
            with self.answering("the answer cell", f"{self.timeout:g} s"):
                if self.session is None:
                    self.start()
                names = self.session.exec(cells, label=ex.name, timeout=self.left(self.timeout))
        except Stop as stop:
            if stop.alarm:
                self.reset()
            return stop.status, stop.reason
        except Exception as exc:
            if from_answer(exc) is None:
                raise
            self.replay.append((ex.name, cells))
            return answer_outcome(from_answer(exc), "answer")
        self.replay.append((ex.name, cells))
        self.names.update(names)
        for cell in cells:  # read here, from the submission's text: the sandbox is not asked
            try:
                found = kernels.extract(cell)
            except RecursionError:
                found = kernels.Kernels(error="the cell is nested too deeply for the grader to read its kernels")
            if found.error and (found.names or "cuda.jit" in cell):
                return "fail", f"the grader cannot run this cell's kernels: {found.error}"
            if found.names:
                self.kernels.update({name: found for name in found.names})
                self.stop_kernels()  # the next kernel check starts it again, with these defined too
        return None

    def call(self, name, args, kwargs):
        left = self.check_left()
        with self.answering(f"{name}(...)", self.check_limit):
            if self.session is None:
                self.start()
            return self.session.call(name, args, kwargs, timeout=left)

    def get(self, name):
        """The value of the answer's ``name``, as plain data."""
        try:
            with self.answering(f"fetching {name}", self.check_limit):
                return self.session.get(name, timeout=self.check_left())
        except Exception as exc:
            if from_answer(exc) is None:
                raise
            raise Stop("error", f"{name} is {from_answer(exc).get('message', '')}") from None

    def inject(self, namespace, asked):
        """Put into a check's namespace what the answers defined of the names it ``asked`` for
        (``names.asked_names``): nothing else of the sandbox reaches a check."""
        for name, found in self.kernels.items():
            if name in asked:
                namespace[name] = KernelAnswer(self, name, found.problems[name] or [
                    problem for other in found.problems.values() for problem in other], name in found.unfinished)
        for name, kind in self.names.items():
            if name in asked and name not in self.kernels:
                namespace[name] = AnswerProxy(self, name) if kind == "callable" else self.get(name)

    # -- the kernel sandbox ------------------------------------------------------------------

    def check_kernel(self, name, griddim, blockdim, args):
        """``cudacheck.check`` of an answer's kernel, in the kernel sandbox; its Report, here."""
        from course_lib import cudacheck

        left = self.check_left()
        encoded = kernels.encode_args(args)
        with self.answering(f"cudacheck on {name}", self.check_limit, kernel=True):
            if self.kernel_session is None:
                with self.no_alarm():
                    self.kernel_session = sandbox.Session(self.limits, trusted=self.trusted, kernels=True)
                for found in {id(k): k for k in self.kernels.values()}.values():
                    if not any(found.problems.values()):  # only source that passed every rule is defined
                        self.kernel_session.define(found.source, found.names, timeout=left)
            # what is left now: starting the sandbox and defining the kernels took some of it
            reply = self.kernel_session.check_kernel(name, griddim, blockdim, encoded, timeout=self.check_left())
            if type(reply) is dict and type(reply.get("kernel_error")) is dict:
                error = reply["kernel_error"]
                exc = rebuilt({"types": ["RuntimeError"], "name": "KernelError",
                               "message": str(error.get("message", ""))[:4000], "where": ""}, cudacheck.KernelError)
                exc.__cause__ = rebuilt(sandbox.clean_error(error.get("cause")))
                raise exc
            return kernels.report_back(reply, name, args)
