"""Score submitted exercise notebooks.

    python -m course_lib.grade alice.ipynb bob.ipynb --csv grades.csv

What it does, and why:

- Only the *answer cells* of a submission are taken (matched by cell id, or,
  in a notebook saved without ids, by their exercise metadata).  Everything
  else the grader runs is the course's own copy of the exercise notebook in
  ``exercises/``, so an edited check cell or a forged ``PASS`` output changes
  nothing; they are still reported (``tampered``), since they tell the
  instructor something.
- The answer cells run in a sandbox (``sandbox.py``): a separate process that
  sees a read-only interpreter and nothing of the course (no ``course_lib``,
  no ``solutions/``, no checkout), cannot write outside its private ``/tmp``,
  has no network, runs as an unprivileged user in its own process namespace,
  with limits on memory, CPU time, processes and file size.
- The check cells run here, in the grader's process, exactly as the learner
  saw them.  When a check calls a name an answer defined, the call crosses to
  the sandbox with the check's inputs as plain data, and only plain data comes
  back (``wire.py``: numbers, strings, numpy arrays of number dtypes, tuples,
  lists and dicts of them; nothing pickled), and ``course_lib.checks`` compares
  it here.  Nothing else the sandbox says is believed: no pid, no status, no
  record of its own.
- A check that hands an answer's ``@cuda.jit`` kernel to ``cudacheck.check``
  (set 09) gets it from the answer cell's text, not from the sandbox:
  ``kernels.py`` keeps the cell's kernels and constants, holds them to the kernel
  language, and runs cudacheck on them in a second sandbox where no other code of
  the answer runs; the report and the arrays the kernel wrote come back as plain data.
- Each exercise has a time limit for its answer cells and one for its check;
  an answer that hangs or kills its process scores ``timeout`` / ``error`` and
  the sandbox is started again without it, so it costs only its own exercise.
- A submission is never modified.

Statuses per exercise: ``pass`` (the check cell ran clean: its points),
``fail`` (the check said no, or the answer is still a stub), ``error`` (any
other exception, or the answer's process died), ``timeout``, ``tampered``
(its check cell or stored check output was edited) and ``invalid`` (not a
notebook of this course, or the answer cell is gone).  All but ``pass`` score 0.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import io
import json
import os
import re
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import kernels, sandbox, wire
from .worker import plain_python as _python

COURSE_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_TIMEOUT = 120          # seconds for an exercise's answer cells, and again for its check
STATUSES = ("pass", "fail", "error", "timeout", "tampered", "invalid")


@dataclass
class Exercise:
    name: str                  # "1.2"
    answer_ids: list
    check_id: str
    points: int


@dataclass
class Row:
    exercise: str
    status: str
    points: int
    max_points: int
    reason: str = ""


@dataclass
class Result:
    submission: str
    exercise_set: str
    rows: list = field(default_factory=list)

    @property
    def total(self):
        return sum(r.points for r in self.rows), sum(r.max_points for r in self.rows)


class Invalid(Exception):
    """The submission cannot be graded as a notebook of this course."""


class NoSandbox(RuntimeError):
    """Submissions from others, and no sandbox to run them in."""


# -- reading notebooks --------------------------------------------------------------

def _text(source) -> str:
    return "".join(map(str, source)) if isinstance(source, list) else str(source or "")


def _tags(cell) -> list:
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    tags = meta.get("tags", []) if isinstance(meta, dict) else []
    return tags if isinstance(tags, list) else []


def _course(cell) -> dict:
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    meta = meta.get("course", {}) if isinstance(meta, dict) else {}
    return meta if isinstance(meta, dict) else {}


def load_submission(path: Path) -> dict:
    """The submission as plain JSON (no repair, no validation beyond what grading needs)."""
    try:
        nb = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Invalid(f"not a readable notebook ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise Invalid("not a notebook: no list of cells")
    if nb.get("nbformat") != 4:
        raise Invalid(f"not an nbformat 4 notebook (nbformat {nb.get('nbformat')!r}): "
                      "save it from JupyterLab as a current notebook")
    if not isinstance(nb.get("metadata", {}), dict):
        raise Invalid("not a notebook: metadata is not an object")
    return nb


def exercises_of(nb) -> list:
    """The exercises of a pristine exercise notebook, in the order they appear."""
    found = {}
    for cell in nb.cells:
        name = _course(cell).get("exercise")
        if "answer" in _tags(cell):
            found.setdefault(name, Exercise(name, [], "", 0)).answer_ids.append(cell.id)
        elif "check" in _tags(cell):
            ex = found.setdefault(name, Exercise(name, [], "", 0))
            ex.check_id, ex.points = cell.id, int(_course(cell).get("points", 0))
    return list(found.values())


class Course:
    """The pristine exercise notebooks under ``root/exercises`` and the sanitize rules."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.paths = {p.stem: p for p in sorted((self.root / "exercises").glob("*.ipynb"))}
        self._cache = {}
        cfg = self.root / "tests" / "sanitize.cfg"
        self.patterns = []
        if cfg.exists():
            from nbval.plugin import get_sanitize_patterns
            self.patterns = get_sanitize_patterns(cfg.read_text(encoding="utf-8"))

    def notebook(self, name):
        if name not in self._cache:
            self._cache[name] = nbformat.read(self.paths[name], as_version=4)
        return self._cache[name]

    def identify(self, sub: dict) -> str:
        """The exercise set: metadata.course.exercise_set, else the one sharing most answer cells."""
        claimed = sub.get("metadata", {}).get("course", {})
        claimed = claimed.get("exercise_set") if isinstance(claimed, dict) else None
        if isinstance(claimed, str) and claimed in self.paths:
            return claimed
        cells = [c for c in sub["cells"] if isinstance(c, dict)]
        ids = {c.get("id") for c in cells if isinstance(c.get("id"), str)}
        names = {_course(c).get("exercise") for c in cells if "answer" in _tags(c)}
        shared = {}
        for name in self.paths:
            exercises = exercises_of(self.notebook(name))
            shared[name] = (len(ids & {i for ex in exercises for i in ex.answer_ids}),
                            len(names & {ex.name for ex in exercises}))
        best = max(shared, key=lambda name: (shared[name], name), default=None)
        if best is None or shared[best] == (0, 0):
            raise Invalid("not an exercise set of this course (no known exercise_set, no matching cells)")
        return best

    def sanitize(self, text: str) -> str:
        for regex, replace in self.patterns:
            text = re.sub(regex, replace, text)
        return text


# -- matching a submission's cells to the course's -----------------------------------

def match_cells(sub, pristine):
    """({pristine cell id: submitted cell}, notes): by id, else (no ids saved) by exercise metadata."""
    cells = [c for c in sub["cells"] if isinstance(c, dict)]
    by_id = {c["id"]: c for c in cells if isinstance(c.get("id"), str)}
    matched, notes = {}, []
    known = {c.id for c in pristine.cells}
    for cell in pristine.cells:
        if cell.id in by_id:
            matched[cell.id] = by_id[cell.id]
    if not any(isinstance(c.get("id"), str) for c in cells) and cells:
        notes.append("saved without cell ids (nbformat 4.4): cells matched by their exercise metadata; "
                     "save from JupyterLab 3 or later to keep ids")
        pending = {}
        for c in cells:
            if "answer" in _tags(c):
                pending.setdefault(_course(c).get("exercise"), []).append(c)
        for cell in pristine.cells:
            if "answer" in _tags(cell):
                mine = pending.get(_course(cell).get("exercise"), [])
                if mine:
                    matched[cell.id] = mine.pop(0)
            elif "check" in _tags(cell):
                twin = [c for c in cells if "check" in _tags(c) and _course(c).get("exercise") == _course(cell).get("exercise")]
                if twin:
                    matched[cell.id] = twin[0]
    sources = {c.source for c in pristine.cells}
    extra = [i for i, c in enumerate(cells) if c.get("cell_type") == "code" and c.get("id") not in known
             and not any(c is m for m in matched.values()) and _text(c.get("source")).strip()
             and _text(c.get("source")) not in sources]
    if extra:
        where = ", ".join(str(i) for i in extra[:5])
        notes.append(f"extra code cell{'s' if len(extra) > 1 else ''} {where} not run by the grader: "
                     "put code an answer needs in that exercise's answer cell")
    return matched, notes


# -- tampering ---------------------------------------------------------------------

def _output_text(outputs, course) -> list:
    """What a reader sees of some outputs (streams merged, no stderr), sanitised like nbval."""
    texts, streams = [], {}
    for out in outputs if isinstance(outputs, list) else []:
        if not isinstance(out, dict):
            texts.append(repr(out))
        elif out.get("output_type") == "stream" and out.get("name") == "stderr":
            continue  # warnings: not a verdict
        elif out.get("output_type") == "stream":
            name = out.get("name")
            if name not in streams:
                streams[name] = len(texts)
                texts.append(f"{name}:")
            texts[streams[name]] += _text(out.get("text"))
        elif out.get("output_type") == "error":
            texts.append(f"error:{out.get('ename')}")
        else:
            data = out.get("data", {})
            texts.append(_text(data.get("text/plain")) if isinstance(data, dict) else "")
    return [course.sanitize(t) for t in texts]


def _stored_output_ok(mine, pristine, course) -> bool:
    """Empty, the course's own output (or the start of it: a run cut short), or a run that failed.

    An exercise notebook shows no verdict under its check cells; the passing
    output is kept in the check cell's ``metadata.course.expected_outputs``.
    """
    outputs = mine.get("outputs") or []
    if any(isinstance(o, dict) and o.get("output_type") == "error" for o in outputs):
        return True
    theirs = "\x00".join(_output_text(outputs, course))
    expected = pristine.outputs or _course(pristine).get("expected_outputs") or []
    ours = "\x00".join(_output_text(expected, course))
    return ours.startswith(theirs)


def find_tampering(matched, pristine, course) -> dict:
    """{exercise: reason} for check cells, or their stored outputs, that were edited."""
    found = {}
    for cell in pristine.cells:
        if "check" not in _tags(cell):
            continue
        owner = _course(cell).get("exercise")
        theirs = matched.get(cell.id)
        if theirs is None:
            continue  # deleted: the course's copy runs anyway
        if theirs.get("cell_type") != "code" or _text(theirs.get("source")) != cell.source:
            found[owner] = f"the check cell of {owner} was edited"
        elif not _stored_output_ok(theirs, cell, course):
            found[owner] = f"the stored output of the check cell of {owner} was edited"
    return found


# -- the course's cells, run here ------------------------------------------------------

def bound_names(sources) -> set:
    """Every name these cells bind anywhere (assignments, defs, imports, loop targets)."""
    names = set()
    for source in sources:
        try:
            tree = ast.parse(_python(source))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                names.update(node.names)
    return names


def read_names(source) -> set:
    """The names a cell reads."""
    try:
        tree = ast.parse(_python(source))
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def sandbox_setup(pristine) -> list:
    """What the sandbox runs before the answers: the ``setup`` cells, or, in a set that has none,
    the top-level imports of the course's cells that do not import course_lib."""
    tagged = [c.source for c in pristine.cells if c.cell_type == "code" and "setup" in _tags(c)]
    if tagged:
        return tagged
    lines = []
    for cell in pristine.cells:
        if cell.cell_type != "code" or {"answer", "check"} & set(_tags(cell)):
            continue
        try:
            tree = ast.parse(_python(cell.source))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if not any(m.split(".")[0] == "course_lib" for m in modules):
                    lines.append(ast.get_source_segment(_python(cell.source), node))
    return ["\n".join(lines)]


class Stop(BaseException):
    """The sandbox timed out or died during a check: ends the check, whatever it catches."""

    def __init__(self, status, reason):
        super().__init__(reason)
        self.status, self.reason = status, reason


class AnswerProxy:
    """Stands in, in the grader, for a function an answer defined; each call crosses to the sandbox."""

    def __init__(self, run, name):
        self._run, self._name = run, name

    def __call__(self, *args, **kwargs):
        return self._run.call(self._name, args, kwargs)

    def __repr__(self):
        return f"<answer {self._name} (in the sandbox)>"


def _rebuilt(error):
    """The builtin exception an answer raised (its nearest builtin Exception type), here."""
    import builtins
    for name in error.get("types", []):
        kind = getattr(builtins, name, None)
        if isinstance(kind, type) and issubclass(kind, Exception):
            exc = kind(error.get("message", ""))
            exc.from_answer = error
            return exc
    exc = RuntimeError(f"{error.get('name', 'Error')}: {error.get('message', '')}")
    exc.from_answer = error
    return exc


class Run:
    """One submission: a sandbox for its answers and a namespace here for the course's cells."""

    def __init__(self, pristine, answers, limits, timeout, trusted):
        self.pristine, self.answers = pristine, answers
        self.limits, self.timeout, self.trusted = limits, timeout, trusted
        self.setup = sandbox_setup(pristine)
        self.replay = []          # answer cells that ran without killing their sandbox
        self.names = {}           # what the answers defined, by kind
        self.kernels = {}         # the answers' @cuda.jit functions: name -> their cell's kernels.Kernels
        self.session = None
        self.kernel_session = None   # the kernel sandbox, started by the first check of a kernel
        self.deadline = None
        # the whole submission: an answer and a check per exercise, and room for restarts
        n = sum(1 for c in pristine.cells if "check" in _tags(c))
        self.begin = time.monotonic()
        self.end = self.begin + timeout * (2 * n + 2)
        self.log = tempfile.NamedTemporaryFile(prefix="course-grade-", suffix=".log", delete=False)
        self.log.close()

    def left(self, limit):
        """Seconds a request may take: its own limit, cut to what the submission has left."""
        left = min(limit, self.end - time.monotonic())
        if left <= 0:
            raise sandbox.Timeout()
        return left

    def start(self):
        """A fresh sandbox with the setup and the answers so far; one that now hangs or dies is dropped."""
        while True:
            self.session = sandbox.Session(self.limits, trusted=self.trusted, log_path=self.log.name)
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

    def out_of_time(self, what):
        if time.monotonic() >= self.end:
            return f"the submission ran past its {self.end - self.begin:g} s in all"
        return what

    def stop(self):
        if self.session is not None:
            self.session.close()
            self.session = None

    def stop_kernels(self):
        if self.kernel_session is not None:
            self.kernel_session.close()
            self.kernel_session = None

    def close(self):
        self.stop()
        self.stop_kernels()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)

    def exec_answer(self, ex):
        """(status, reason) if the answer cells of ``ex`` did not run clean, else None."""
        cells = [self.answers[i] for i in ex.answer_ids]
        try:
            if self.session is None:
                self.start()
            names = self.session.exec(cells, label=ex.name, timeout=self.left(self.timeout))
        except sandbox.AnswerRaised as exc:
            self.replay.append((ex.name, cells))
            return _answer_status(exc.error, "answer")
        except sandbox.Timeout:
            self.stop()
            return "timeout", self.out_of_time(f"the answer cell ran longer than {self.timeout:g} s")
        except (sandbox.Died, wire.WireError, EOFError, OSError) as exc:
            self.stop()
            return "error", _died(exc, "answer")
        self.replay.append((ex.name, cells))
        self.names.update(names)
        for cell in cells:  # read here, from the submission's text: the sandbox is not asked
            found = kernels.extract(cell)
            if found.names:
                self.kernels.update({name: found for name in found.names})
                self.stop_kernels()  # the next kernel check starts it again, with these defined too
        return None

    def check_left(self):
        """The seconds left to the check that is running; a Stop when there are none."""
        left = min(self.deadline, self.end) - time.monotonic()
        if left <= 0:
            raise Stop("timeout", self.out_of_time(f"the check ran longer than {self.timeout:g} s"))
        return left

    @contextlib.contextmanager
    def asking(self, what, where, stop):
        """What can go wrong while a sandbox answers the check's request for ``what`` (``f(...)``, or
        cudacheck on a kernel), as the check's outcome: the answer's own exception raised here, rebuilt;
        a timeout, a dead process or a reply that is not plain data stops that sandbox (``stop``)."""
        try:
            yield
        except sandbox.AnswerRaised as exc:
            raise _rebuilt(exc.error) from None
        except sandbox.Timeout:
            stop()
            raise Stop("timeout", self.out_of_time(f"{what} ran longer than the {self.timeout:g} s of its check")) from None
        except (sandbox.Died, EOFError, OSError) as exc:
            stop()
            raise Stop("error", _died(exc, where)) from None
        except wire.WireError as exc:
            stop()  # the channel may be out of step: the next check gets a fresh sandbox
            raise Stop("error", f"{what} returned {exc}") from None

    def check_kernel(self, name, griddim, blockdim, args):
        """``cudacheck.check`` of an answer's kernel, in the kernel sandbox; its Report, here."""
        from course_lib import cudacheck

        left = self.check_left()
        encoded = kernels.encode_args(args)
        with self.asking(f"cudacheck on {name}", "kernel", self.stop_kernels):
            if self.kernel_session is None:
                self.kernel_session = sandbox.Session(self.limits, trusted=self.trusted, log_path=self.log.name,
                                                      kernels=True)
                for found in {id(k): k for k in self.kernels.values()}.values():
                    if not any(found.problems.values()):  # only source that passed every rule is defined
                        self.kernel_session.define(found.source, found.names, timeout=left)
            reply = self.kernel_session.check_kernel(name, griddim, blockdim, encoded, timeout=left)
        if type(reply) is dict and type(reply.get("kernel_error")) is dict:
            error = reply["kernel_error"]
            exc = cudacheck.KernelError(str(error.get("message", ""))[:4000])
            exc.__cause__ = _rebuilt(sandbox._clean_error(error.get("cause")))
            exc.from_answer = {"types": ["RuntimeError"], "name": "KernelError", "message": str(exc), "where": ""}
            raise exc
        try:
            return kernels.report_back(reply, name, args)
        except ValueError as exc:
            self.stop_kernels()
            raise Stop("error", str(exc)) from None

    def call(self, name, args, kwargs):
        left = self.check_left()
        with self.asking(f"{name}(...)", "answer", self.stop):
            if self.session is None:
                self.start()
            return self.session.call(name, args, kwargs, timeout=left)

    def inject(self, namespace, course_names, wanted):
        """Put what the answers defined, the course does not, and the check reads into its namespace."""
        for name, found in self.kernels.items():
            if name not in course_names and name in wanted:
                namespace[name] = kernels.KernelAnswer(self, name, found.problems[name] or [
                    problem for other in found.problems.values() for problem in other], name in found.unfinished)
        for name, kind in self.names.items():
            if name in course_names or name not in wanted or name in self.kernels:
                continue
            if kind == "callable":
                namespace[name] = AnswerProxy(self, name)
                continue
            try:
                namespace[name] = self.session.get(name, timeout=self.left(self.timeout))
            except sandbox.AnswerRaised as exc:
                raise Stop("error", f"{name} is {exc.error.get('message', '')}") from None
            except wire.WireError as exc:
                self.stop()
                raise Stop("error", f"{name} is {exc}") from None
            except sandbox.Timeout:
                self.stop()
                raise Stop("timeout", self.out_of_time(f"fetching {name} took longer than {self.timeout:g} s")) from None
            except (sandbox.Died, EOFError, OSError) as exc:
                self.stop()
                raise Stop("error", _died(exc, "answer")) from None


def _died(exc, where):
    if isinstance(exc, wire.WireError):
        return f"the {where} sent something that is not plain data ({exc})"
    return f"the {where}'s process died (a crash, or a limit on memory, CPU time or processes)"


def _answer_status(error, where):
    name, message = error.get("name", "Error"), _one_line(error.get("message", ""))
    if "NotImplementedError" in error.get("types", []):
        return "fail", "not implemented yet"
    text = f"{name}: {message}" if message else name
    if name == "WireError":
        text = f"what the answer gave back is {message}"
    elif name == "NameError":
        text += " (the grader runs only the course's cells and your answer cells: define what you use there)"
    elif name == "ModuleNotFoundError" and "course_lib" in message:
        text += " (answers cannot use the course's library: write the code yourself)"
    return "error", f"{text} (in the {where}{' ' + error['where'] if error.get('where') else ''})"


def _one_line(text, width=120) -> str:
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= width else line[:width - 3] + "..."


@contextlib.contextmanager
def fresh_inputs(salt):
    """Every ``np.random.default_rng(seed)`` of the course's cells draws from (seed, salt) instead.

    The checks then ask for the same cases (same shapes, masks, dtypes, labels) on values no one
    saw before grading, so a table of the published cases' outputs is worth nothing."""
    import numpy as np

    if salt is None:
        yield
        return
    original = np.random.default_rng

    def default_rng(seed=None, *args, **kwargs):
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seed = [int(seed), salt]
        return original(seed, *args, **kwargs)

    np.random.default_rng = default_rng
    try:
        yield
    finally:
        np.random.default_rng = original


def run_checks(pristine, answers, exercises, decided, limits, timeout, trusted, salt=None):
    """Run every exercise not yet decided: answers in the sandbox, checks here."""
    check_sources = [c.source for c in pristine.cells if c.cell_type == "code" and "answer" not in _tags(c)]
    course_names = bound_names(check_sources)
    by_check = {ex.check_id: ex for ex in exercises}
    namespace = {"__name__": "__course__"}
    run = Run(pristine, answers, limits, timeout, trusted)
    try:
        with fresh_inputs(salt):
            _run_cells(pristine, run, by_check, namespace, decided, course_names, timeout)
    finally:
        run.close()
    return decided


def _run_cells(pristine, run, by_check, namespace, decided, course_names, timeout):
    needed = needed_cells(pristine)
    for cell in pristine.cells:
        if cell.cell_type != "code" or "answer" in _tags(cell):
            continue
        ex = by_check.get(cell.id)
        if ex is None:  # the course's own setup and helpers
            if cell.id in needed:
                _run_course_cell(cell.source, namespace)
            continue
        if ex.name in decided:
            if decided[ex.name][0] == "tampered":
                run.exec_answer(ex)  # later answers may build on it, as in the learner's kernel
            continue
        failed = run.exec_answer(ex)
        if failed:
            decided[ex.name] = failed
            continue
        decided[ex.name] = _check(run, cell.source, namespace, course_names, timeout)


def _run_course_cell(source, namespace):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            exec(compile(_python(source), "<course cell>", "exec"), namespace)
        except Exception:
            pass  # a course cell that needs the learner's code: the checks will say what is missing


class _Flow(ast.NodeVisitor):
    """The names a cell reads before it binds them (``free``), and those it binds, in the order
    Python evaluates them; a function body's reads count where it is defined."""

    def __init__(self):
        self.bound, self.free, self.imported, self.defined = set(), set(), set(), set()

    def read(self, name):
        if name not in self.bound:
            self.free.add(name)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.read(node.id)
        else:
            self.bound.add(node.id)

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self.visit(node.target)

    def visit_AugAssign(self, node):
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.read(node.target.id)
        self.visit(node.target)

    def visit_For(self, node):
        self.visit(node.iter)
        self.visit(node.target)
        for child in node.body + node.orelse:
            self.visit(child)

    def visit_Import(self, node):
        for alias in node.names:
            name = (alias.asname or alias.name).split(".")[0]
            self.bound.add(name)
            self.imported.add(name)

    visit_ImportFrom = visit_Import

    def _scope(self, node, name=None):
        for child in getattr(node, "decorator_list", []) + list(getattr(getattr(node, "args", None), "defaults", []) or []):
            self.visit(child)
        inner = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        if hasattr(node, "args"):
            inner |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in inner:
                self.read(n.id)
        if name:
            self.bound.add(name)
            self.defined.add(name)

    def visit_FunctionDef(self, node):
        self._scope(node, node.name)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._scope(node)

    def visit_ListComp(self, node):
        self._scope(node)

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp


def _flow(source):
    flow = _Flow()
    try:
        flow.visit(ast.parse(_python(source)))
    except SyntaxError:
        flow.free.add("*")  # unreadable: treat it as needed
    return flow


def needed_cells(pristine) -> set:
    """Ids of the course cells the checks depend on: every check cell, and (walking back) each
    cell that binds a name a later needed cell reads, or reads shared state one does (a random
    generator: skipping its draws would change the checks' inputs).  Demonstrations and timings
    that nothing later reads are skipped."""
    cells = [c for c in pristine.cells if c.cell_type == "code" and "answer" not in _tags(c)]
    flows = {c.id: _flow(c.source) for c in cells}
    # shared state: values assigned by course cells (a generator, arrays), not modules or functions
    state = set().union(*(f.bound - f.imported - f.defined for f in flows.values())) if flows else set()
    needed, wanted = set(), set()
    for cell in reversed(cells):
        flow = flows[cell.id]
        if "check" in _tags(cell) or "*" in flow.free or flow.bound & wanted or flow.free & wanted & state:
            needed.add(cell.id)
            wanted |= flow.free
    return needed


def _check(run, source, namespace, course_names, timeout):
    from course_lib.checks import CheckFailed

    run.deadline = time.monotonic() + timeout
    out = io.StringIO()
    try:
        if run.session is None:
            run.start()
        run.inject(namespace, course_names, read_names(source))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            exec(compile(_python(source), "<check cell>", "exec"), namespace)
    except Stop as stop:
        return stop.status, stop.reason
    except sandbox.Timeout:
        run.stop()
        return "timeout", run.out_of_time(f"the answers ran longer than {timeout:g} s when the sandbox was restarted")
    except sandbox.Died as exc:
        run.stop()
        return "error", _died(exc, "answer")
    except CheckFailed as exc:
        return "fail", _one_line(exc) or "the check failed"
    except Exception as exc:
        error = getattr(exc, "from_answer", None)
        if error is not None:
            return _answer_status(error, "answer, called by the check")
        if isinstance(exc, AssertionError):
            return "fail", _one_line(exc) or "the check failed"
        return "error", f"{type(exc).__name__}: {_one_line(exc)} (in the check, on what the answer returned)"
    return "pass", ""


# -- grading -------------------------------------------------------------------------

@dataclass
class Options:
    timeout: float = DEFAULT_TIMEOUT
    trusted: bool = False
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    fresh_inputs: bool | int = False  # draw the checks' random inputs from a secret salt (or this one)


def grade(path, course: Course, options: Options | None = None) -> Result:
    """Grade one submission; never raises, whatever is wrong with the submission."""
    options = options or Options()
    try:
        return _grade(path, course, options)
    except Exception as exc:  # a grader bug must not stop the other submissions
        return Result(str(path), "", [Row("*", "error", 0, 0, f"grader error ({type(exc).__name__}: {exc})")])


def _grade(path, course, options):
    try:
        sub = load_submission(path)
        name = course.identify(sub)
    except Invalid as exc:
        return Result(str(path), "", [Row("*", "invalid", 0, 0, str(exc))])
    pristine = course.notebook(name)
    exercises = exercises_of(pristine)
    result = Result(str(path), name)
    matched, notes = match_cells(sub, pristine)
    decided = {}
    try:
        for ex in exercises:
            missing = [i for i in ex.answer_ids if i not in matched]
            if missing:
                decided[ex.name] = ("invalid", f"the answer cell of {ex.name} is missing (deleted, or re-made without "
                                               f"its metadata): copy your code into the answer cell of a fresh "
                                               f"exercises/{name}.ipynb")
        if all(ex.name in decided for ex in exercises):
            raise Invalid(f"no answer cell of {name} found: work in a copy of exercises/{name}.ipynb")
        for owner, reason in find_tampering(matched, pristine, course).items():
            decided.setdefault(owner, ("tampered", reason))
        answers = {i: _text(matched[i].get("source")) for ex in exercises for i in ex.answer_ids if i in matched}
        fresh = options.fresh_inputs
        salt = None if not fresh else fresh if type(fresh) is int else secrets.randbits(63)
        run_checks(pristine, answers, exercises, decided, options.limits, options.timeout, options.trusted, salt)
    except Invalid as exc:
        decided = {ex.name: ("invalid", str(exc)) for ex in exercises}
    except sandbox.SandboxUnavailable as exc:
        decided = {ex.name: ("error", f"no sandbox: {exc}") for ex in exercises if ex.name not in decided}
    except Exception as exc:  # a grader bug must not stop the other submissions
        decided = {ex.name: ("error", f"grader error ({type(exc).__name__}: {exc}); please report it")
                   for ex in exercises}
    note = "; ".join(notes)
    for ex in exercises:
        status, reason = decided.get(ex.name, ("error", "not graded"))
        if note and status != "pass":
            reason = f"{reason} (note: {note})" if reason else f"note: {note}"
        elif note:
            reason = f"note: {note}"
        result.rows.append(Row(ex.name, status, ex.points if status == "pass" else 0, ex.points, reason))
    return result


def expand_unknown(results, course: Course, exercise_set=None):
    """Give a file that could not be read one row per exercise of the set, so class totals stay right.

    The set is ``exercise_set``, else the one every other submission of the batch belongs to.
    """
    sets = {r.exercise_set for r in results if r.exercise_set}
    name = exercise_set or (sets.pop() if len(sets) == 1 else None)
    if name not in course.paths:
        return results
    out = []
    for r in results:
        if not r.exercise_set and len(r.rows) == 1 and r.rows[0].exercise == "*":
            why = r.rows[0]
            r = Result(r.submission, name, [Row(ex.name, why.status, 0, ex.points, why.reason)
                                            for ex in exercises_of(course.notebook(name))])
        out.append(r)
    return out


def grade_all(paths, course: Course, options: Options | None = None, jobs=1):
    """Grade several submissions, ``jobs`` at a time, each path once; results in the order given."""
    options = options or Options()
    unique = list(dict.fromkeys(Path(p).resolve() for p in paths))
    originals = {}
    for p in paths:
        originals.setdefault(Path(p).resolve(), str(p))
    if not options.trusted and not sandbox.available():
        raise NoSandbox(
            "no sandbox: bubblewrap (bwrap) is " + ("not installed" if not sandbox.bwrap() else "installed but does not start here")
            + ". Grading others' notebooks without one lets their code act as you. Install it (Debian / Ubuntu: "
            "apt-get install bubblewrap), or pass --trusted to grade notebooks you trust (your own) without it.")
    if jobs <= 1:
        results = [grade(originals[p], course, options) for p in unique]
    else:
        from concurrent.futures import ProcessPoolExecutor
        from functools import partial
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(partial(grade, course=course, options=options), [originals[p] for p in unique]))
    return results


# -- reporting ---------------------------------------------------------------------

def format_result(result: Result) -> str:
    """The submission's table: one row per exercise, then the total; plain, deterministic text."""
    width = max([8] + [len(r.exercise) for r in result.rows])

    def line(exercise, status, points, reason=""):
        return f"  {exercise:<{width}}  {status:<8}  {points:>9}  {reason}".rstrip()

    got, out_of = result.total
    return "\n".join(
        [f"{result.submission}  [{result.exercise_set or 'unknown exercise set'}]",
         line("exercise", "status", "points", "reason")]
        + [line(r.exercise, r.status, f"{r.points} / {r.max_points}", r.reason) for r in result.rows]
        + [line("total", "", f"{got} / {out_of}")])


CSV_COLUMNS = ["submission", "exercise_set", "exercise", "status", "points", "max_points", "reason"]


def write_csv(results, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for result in results:
            for r in result.rows:
                writer.writerow([result.submission, result.exercise_set, r.exercise, r.status,
                                 r.points, r.max_points, r.reason])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.grade",
        description="Score exercise notebooks.  Only the answer cells of each submission are taken; they run in "
                    "a sandbox (bubblewrap: read-only, no course library, no network, an unprivileged user, "
                    "limits), and the course's own check cells run here on what the answers' functions return "
                    "as plain data (a kernel is defined from its cell's text and checked by cudacheck in a "
                    "sandbox of its own).  Prints a table per submission; the exit code is 0 whenever every "
                    "submission was graded, whatever the scores.  Submissions are never modified.",
        epilog="statuses: pass (the check's points), fail (the check said no, or still a stub), "
               "error (another exception, or the answer's process died), timeout, tampered (an edited check "
               "cell or stored check output), invalid (not a notebook of this course, or the answer cell is "
               "gone).  All but pass score 0.")
    parser.add_argument("submissions", nargs="+", type=Path, metavar="SUBMISSION.ipynb",
                        help="notebooks to grade (never modified; a path given twice is graded once)")
    parser.add_argument("--csv", type=Path, metavar="OUT",
                        help="also write " + ",".join(CSV_COLUMNS) + " rows")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="time limit for each exercise's answer cells, and again for its check "
                             "(default %(default)s)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="grade N submissions at a time, each in its own sandbox (default 1)")
    parser.add_argument("--memory", type=float, default=4, metavar="GB",
                        help="address space each sandboxed process may use (default %(default)s GB)")
    parser.add_argument("--processes", type=int, default=sandbox.Limits.processes, metavar="N",
                        help="processes and threads the sandbox may run (default %(default)s; the CUDA "
                             "simulator runs a thread per CUDA thread: raise it for set 09)")
    parser.add_argument("--set", dest="exercise_set", metavar="NN_topic",
                        help="the exercise set, for files too broken to tell (default: the batch's)")
    parser.add_argument("--fresh-inputs", action="store_true",
                        help="draw the checks' random inputs from a secret salt, so that outputs copied for "
                             "the notebook's own inputs are worth nothing (the cases stay the same; a learner's "
                             "notebook then checked other values than the grader)")
    parser.add_argument("--trusted", action="store_true",
                        help="the submissions are trusted (your own work): where no sandbox is available, run "
                             "them in a plain subprocess instead of refusing")
    parser.add_argument("--course-root", type=Path, default=COURSE_ROOT, metavar="DIR",
                        help="the course folder whose exercises/ hold the pristine notebooks "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.memory <= 0:
        parser.error("--memory must be a positive number of GB")
    if args.processes < 8:
        parser.error("--processes must be at least 8")
    course = Course(args.course_root)
    if not course.paths:
        parser.error(f"no exercise notebooks in {args.course_root / 'exercises'}; is --course-root right?")
    if args.exercise_set and args.exercise_set not in course.paths:
        parser.error(f"--set {args.exercise_set}: not one of {', '.join(course.paths)}")
    options = Options(args.timeout, args.trusted, sandbox.Limits(memory_bytes=int(args.memory * 2**30),
                                                                 processes=args.processes), args.fresh_inputs)
    try:
        results = grade_all(args.submissions, course, options, args.jobs)
    except NoSandbox as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = expand_unknown(results, course, args.exercise_set)
    for result in results:
        print(format_result(result), flush=True)
        print()
    if args.csv:
        write_csv(results, args.csv)
    got = sum(r.total[0] for r in results)
    out_of = sum(r.total[1] for r in results)
    print(f"graded {len(results)} submission{'s' if len(results) != 1 else ''}: {got} / {out_of} points in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
