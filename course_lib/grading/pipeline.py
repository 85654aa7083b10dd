"""Score submitted exercise notebooks (``python -m course_lib.grade``: ``cli.py``).

What it does, and why:

- Only the *answer cells* of a submission are taken (``submission.py``: matched by
  cell id, or, in a notebook saved without ids, by their exercise metadata).
  Everything else the grader runs is the course's own copy of the exercise notebook
  in ``exercises/``, so an edited check cell or a forged ``PASS`` output changes
  nothing; they are still reported (``tampered``), since they tell the instructor
  something.
- The answer cells run in a sandbox (``sandbox.py``): a separate process that
  sees a read-only interpreter and nothing of the course (no ``course_lib``,
  no ``solutions/``, no checkout), cannot write outside its private ``/tmp``,
  has no network, runs as an unprivileged user (as root: a uid of its own) in
  its own process namespace, with limits on memory (its processes together),
  CPU time, processes and file size.
- The check cells run here, in the grader's process, exactly as the learner
  saw them.  Only the names a check asks for cross from the answers
  (``names.py``: those it reads that no course cell binds and that are no
  builtin, so an answer's ``range`` or ``float`` stays its own).  When a check
  calls a name an answer defined, the call crosses to the sandbox with the
  check's inputs as plain data (``session.py``), and only plain data comes back
  (``wire.py``: numbers, strings, numpy arrays of number dtypes, tuples, lists
  and dicts of them; nothing pickled), and ``course_lib.checks`` compares it
  here.  Nothing else the sandbox says is believed: no pid, no status, no
  record of its own.
- A check that hands an answer's ``@cuda.jit`` kernel to ``cudacheck.check``
  (set 09) gets it from the answer cell's text, not from the sandbox:
  ``kernels.py`` keeps the cell's kernels and constants, holds them to the kernel
  language, and runs cudacheck on them in a second sandbox where no other code of
  the answer runs; the report and the arrays the kernel wrote come back as plain data.
- Each exercise has a time limit for its answer cells and one for its check,
  and the submission one for all of it; the check's and the submission's are
  wall-clock deadlines over the grader's own work too (a check's loop over what
  an answer returned), not only over the sandbox's replies.  An answer that
  hangs or kills its process scores ``timeout`` / ``error`` and the sandbox is
  started again without it, so it costs only its own exercise; a process that dies while
  earlier answers ran in it runs the exercise again with its own answer alone.
- What the grader itself reads of a submission is bounded: an answer cell's size
  (``MAX_ANSWER_BYTES``), a reply's header (``wire.MAX_HEADER``, ``wire.MAX_VALUES``).
  Every reason is one printable line (``plain_line``): text an answer chose (an exception's
  name) neither starts a row of the table nor a formula in the CSV.
- A symbolic or hard link among the submissions is refused (it may name anyone's file,
  the course's solutions included), and a pool worker ends with the grader (``die_with``).
- A submission is never modified.

Statuses per exercise: ``pass`` (the check cell ran clean: its points),
``fail`` (the check said no, or the answer is still a stub), ``error`` (any
other exception, or the answer's process died), ``timeout``, ``tampered``
(its check cell or stored check output was edited) and ``invalid`` (not a
notebook of this course, the answer cell is gone or too large, or a link
refused).  All but ``pass`` score 0.
"""
from __future__ import annotations

import contextlib
import io
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import sandbox
from .names import asked_names, course_cells, course_names, needed_cells
from .session import Run, Stop, answer_outcome, from_answer, one_line
from .submission import (
    Course,
    Invalid,
    exercises_of,
    find_tampering,
    load_submission,
    match_cells,
    refusal,
    source_text,
)
from .worker import plain_python

DEFAULT_TIMEOUT = 120          # seconds for an exercise's answer cells, and again for its check
# An answer cell is read here (``kernels.extract`` parses it) as well as run: its size bounds the
# grader's own memory and time on it. The course's longest answer cell is about 2.3 KiB.
MAX_ANSWER_BYTES = 64 * 2**10
STATUSES = ("pass", "fail", "error", "timeout", "tampered", "invalid")
REASON_CHARS = 300             # a reason carries text an answer chose (an exception's name and message)


def plain_line(text, width=REASON_CHARS) -> str:
    """``text`` as one line of at most ``width`` printable characters: newlines, carriage returns,
    tabs, line separators and other control or format characters become spaces, so no text an
    answer chose can start a row of the table or the CSV, or turn the text around."""
    line = "".join(ch if ch.isprintable() else " " for ch in str(text)).strip()
    return line if len(line) <= width else line[:width - 3] + "..."


@dataclass
class Row:
    exercise: str
    status: str
    points: int
    max_points: int
    reason: str = ""

    def __post_init__(self):
        self.reason = plain_line(self.reason)   # whatever made it, an answer's text among it


@dataclass
class Result:
    submission: str
    exercise_set: str
    rows: list = field(default_factory=list)
    seconds: float = 0.0       # how long grading it took (not in the reports: it depends on the machine)

    @property
    def total(self):
        return sum(r.points for r in self.rows), sum(r.max_points for r in self.rows)


class NoSandbox(RuntimeError):
    """Submissions from others, and no sandbox to run them in."""


@dataclass
class Options:
    timeout: float = DEFAULT_TIMEOUT
    trusted: bool = False
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    # draw the checks' random inputs from a secret salt (True), or this salt (an int); False: the
    # notebook's published inputs.  The command line grades with fresh inputs unless told otherwise.
    fresh_inputs: bool | int = False
    submission_timeout: float | None = None  # seconds for all of a submission (default: timeout x (2 x checks + 2))


# -- one submission's cells ------------------------------------------------------------------

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


def run_checks(pristine, answers, exercises, decided, limits, timeout, trusted, salt=None, submission_timeout=None):
    """Run every exercise not yet decided: answers in the sandbox, checks here, all of it (the
    grader's own work included) within the submission's deadline."""
    by_check = {ex.check_id: ex for ex in exercises}
    namespace = {"__name__": "__course__"}
    run = Run(pristine, answers, limits, timeout, trusted, submission_timeout)
    try:
        with run.deadline(run.end, "the submission ran too long"), fresh_inputs(salt):
            _run_cells(pristine, run, by_check, namespace, decided, course_names(pristine), timeout)
    except Stop as stop:   # the submission's deadline, in the course's own cells
        for ex in exercises:
            decided.setdefault(ex.name, (stop.status, stop.reason))
    finally:
        run.close()
    return decided


def _run_cells(pristine, run, by_check, namespace, decided, course_bound, timeout):
    needed = needed_cells(pristine)
    for cell in course_cells(pristine):
        if time.monotonic() >= run.end:
            raise Stop("timeout", run.out_of_time(""))
        ex = by_check.get(cell.id)
        if ex is None:  # the course's own setup and helpers
            if cell.id in needed:
                _run_course_cell(cell.source, namespace)
            continue
        if ex.name in decided:
            if decided[ex.name][0] == "tampered":
                run.exec_answer(ex)  # later answers may build on it, as in the learner's kernel
            continue
        decided[ex.name] = _exercise(run, ex, cell.source, namespace, course_bound, timeout)


def _exercise(run, ex, source, namespace, course_bound, timeout):
    """(status, reason) of one exercise: its answer cells, then its check.

    An answer's process that dies while earlier answers ran in it may have been ended by one of
    them (a thread, a patched worker): the exercise then runs again, in a sandbox of its own answer
    alone, and that outcome stands, so each exercise is charged only for its own answer."""
    run.died = False
    outcome = run.exec_answer(ex) or _check(run, source, namespace, course_bound, timeout)
    earlier = [entry for entry in run.replay if entry[0] != ex.name]
    if not run.died or not earlier:
        return outcome
    run.stop()
    run.replay, run.died = [], False
    try:
        return run.exec_answer(ex) or _check(run, source, namespace, course_bound, timeout)
    finally:
        run.stop()   # the next exercise starts again with every answer that ran
        run.replay = earlier + run.replay


def _run_course_cell(source, namespace):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            exec(compile(plain_python(source), "<course cell>", "exec"), namespace)
        except Exception:  # noqa: BLE001 -- a course cell that needs the learner's code: the checks say what is missing
            pass


def _check(run, source, namespace, course_bound, timeout):
    """(status, reason) of one check cell, run here on what the answers give back."""
    from course_lib.checks import CheckFailed

    run.deadline_at = time.monotonic() + timeout
    out = io.StringIO()
    try:
        with run.deadline_of_check():
            run.restart()
            run.inject(namespace, asked_names(source, course_bound))
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                exec(compile(plain_python(source), "<check cell>", "exec"), namespace)
    except Stop as stop:
        if stop.alarm:
            run.reset()
        return stop.status, stop.reason
    except CheckFailed as exc:
        return "fail", one_line(exc) or "the check failed"
    except Exception as exc:  # noqa: BLE001 -- whatever the check raised on the answer's values becomes its status
        if from_answer(exc) is not None:
            return answer_outcome(from_answer(exc), "answer, called by the check")
        if isinstance(exc, AssertionError):
            return "fail", one_line(exc) or "the check failed"
        return "error", f"{type(exc).__name__}: {one_line(exc)} (in the check, on what the answer returned)"
    return "pass", ""


# -- submissions -------------------------------------------------------------------------------

def grade(path, course: Course, options: Options | None = None) -> Result:
    """Grade one submission; never raises, whatever is wrong with the submission."""
    options = options or Options()
    start = time.monotonic()
    try:
        result = _grade(path, course, options)
    except Exception as exc:  # noqa: BLE001 -- a grader bug must not stop the other submissions
        result = Result(str(path), "", [Row("*", "error", 0, 0, f"grader error ({type(exc).__name__}: {exc})")])
    result.seconds = time.monotonic() - start
    return result


def _grade(path, course, options):
    refused = refusal(path)
    if refused:
        return Result(str(path), "", [Row("*", "invalid", 0, 0, refused)])
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
        answers = {i: source_text(matched[i].get("source")) for ex in exercises for i in ex.answer_ids if i in matched}
        for ex in exercises:
            size = max([len(answers[i].encode("utf-8", "replace")) for i in ex.answer_ids if i in answers] or [0])
            if size > MAX_ANSWER_BYTES and ex.name not in decided:   # never run, never read again
                decided[ex.name] = ("invalid", f"the answer cell of {ex.name} is {size // 2**10} KiB, over the "
                                               f"{MAX_ANSWER_BYTES // 2**10} KiB an answer cell may have: compute "
                                               "large data in the cell instead of writing it out")
                answers = {i: text for i, text in answers.items() if i not in ex.answer_ids}
        for owner, reason in find_tampering(matched, pristine, course).items():
            decided.setdefault(owner, ("tampered", reason))
        fresh = options.fresh_inputs
        salt = None if not fresh else fresh if type(fresh) is int else secrets.randbits(63)
        run_checks(pristine, answers, exercises, decided, options.limits, options.timeout, options.trusted, salt,
                   options.submission_timeout)
    except Invalid as exc:
        decided = {ex.name: ("invalid", str(exc)) for ex in exercises}
    except sandbox.SandboxUnavailable as exc:
        decided = {ex.name: ("error", f"no sandbox: {exc}") for ex in exercises if ex.name not in decided}
    except Exception as exc:  # noqa: BLE001 -- a grader bug must not stop the other submissions
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
                                            for ex in exercises_of(course.notebook(name))], r.seconds)
        out.append(r)
    return out


def die_with(grader_pid):
    """Make this pool worker end with the grader, however the grader ends (SIGTERM, SIGKILL): the
    kernel sends it SIGKILL then (its sandboxes end with it: ``--die-with-parent``). A grader that
    ended before this ran has left it to another parent: it ends now."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    if os.getppid() != grader_pid:
        os._exit(1)


def grade_all(paths, course: Course, options: Options | None = None, jobs=1):
    """Grade several submissions, ``jobs`` at a time, each path once; results in the order given."""
    options = options or Options()
    unique = list(dict.fromkeys(Path(p).resolve() for p in paths))
    originals = {}
    for p in paths:
        originals.setdefault(Path(p).resolve(), str(p))
    if not options.trusted and not sandbox.available():
        raise NoSandbox(
            f"no sandbox: {sandbox.why_unavailable()}. Grading others' notebooks without one lets their code "
            "act as you. Install bubblewrap (Debian / Ubuntu: apt-get install bubblewrap), or pass --trusted to "
            "grade notebooks you trust without it (your own, one at a time in exercises/, needs no --trusted).")
    if jobs <= 1:
        results = [grade(originals[p], course, options) for p in unique]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from functools import partial
        # spawn, not fork: a forked child cannot run numba's threaded kernels once the parent has
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=die_with, initargs=(os.getpid(),)) as pool:
            results = list(pool.map(partial(grade, course=course, options=options), [originals[p] for p in unique]))
    return results
