"""Score submitted exercise notebooks.

    python -m course_lib.grade alice.ipynb bob.ipynb --csv grades.csv

Why it works the way it does:

- Only the *answer cells* of a submission count.  They are copied (matched by
  cell id) into a fresh copy of the course's own ``exercises/`` notebook, and
  that copy is run.  So an edited check cell or a forged ``PASS`` output
  changes nothing; they are still reported (``tampered``) because they tell
  the instructor something.
- The run is nbval's, in a subprocess, with a time limit per cell and for the
  whole run: the learner saw these exact checks in their notebook, and an
  endless loop, a crash or a kernel that dies cannot take the grader down.
  ``course_lib.nbval_record`` writes each cell's outcome as it happens, so
  even a run killed from outside leaves its results.
- An answer that crashes or hangs the kernel is scored (``error`` /
  ``timeout``), replaced by a ``raise`` and the notebook is run again, so
  one crash costs only its own exercise (later answers that need the crashed
  one fail, as they would for a learner).
- Answer cells are scanned before they run (``course_lib.answer_scan``);
  one that patches numpy or the checks, shadows what a check reads, or calls
  the course's own kernels is ``tampered`` and never runs.
- A submission is never modified: everything happens in a temporary folder.

Statuses per exercise: ``pass`` (answer and check cells ran clean; the points
of the check cell), ``fail`` (the check said no, or the answer is still a
stub), ``error`` (any other exception, or the kernel died), ``timeout``,
``tampered`` and ``invalid`` (the file is not a notebook of this course, or
the answer cell is gone).  Everything but ``pass`` scores 0.
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .answer_scan import Context, scan_answer

COURSE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT = 120          # seconds per cell
STARTUP_ALLOWANCE = 60         # seconds a run may take beyond its cells' limits
STALL_GRACE = 30               # seconds nbval may take past a cell's limit to interrupt it


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


# -- reading notebooks --------------------------------------------------------------

def _text(source) -> str:
    return "".join(map(str, source)) if isinstance(source, list) else str(source or "")


def _tags(cell) -> list:
    tags = cell.get("metadata", {}).get("tags", [])
    return tags if isinstance(tags, list) else []


def _course(cell) -> dict:
    meta = cell.get("metadata", {}).get("course", {})
    return meta if isinstance(meta, dict) else {}


def load_submission(path: Path) -> dict:
    """The submission as plain JSON (no repair, no validation beyond what grading needs)."""
    try:
        nb = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Invalid(f"not a readable notebook ({type(exc).__name__}: {exc})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise Invalid("not a notebook: no list of cells")
    if nb.get("nbformat") != 4:
        raise Invalid(f"not an nbformat 4 notebook (nbformat {nb.get('nbformat')!r})")
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
        self.sanitize_cfg = cfg if cfg.exists() else None
        self.patterns = []
        if self.sanitize_cfg:
            from nbval.plugin import get_sanitize_patterns
            self.patterns = get_sanitize_patterns(cfg.read_text(encoding="utf-8"))

    def notebook(self, name):
        if name not in self._cache:
            self._cache[name] = nbformat.read(self.paths[name], as_version=4)
        return self._cache[name]

    def identify(self, sub: dict) -> str:
        """The exercise set: metadata.course.exercise_set, else the one sharing most answer ids."""
        claimed = sub.get("metadata", {}).get("course", {})
        claimed = claimed.get("exercise_set") if isinstance(claimed, dict) else None
        if isinstance(claimed, str) and claimed in self.paths:
            return claimed
        ids = {c.get("id") for c in sub["cells"] if isinstance(c, dict) and isinstance(c.get("id"), str)}
        shared = {name: len(ids & {i for ex in exercises_of(self.notebook(name)) for i in ex.answer_ids})
                  for name in self.paths}
        best = max(shared, key=lambda name: (shared[name], name), default=None)
        if best is None or shared[best] == 0:
            raise Invalid("not an exercise set of this course (no known exercise_set, no matching cells)")
        return best

    def sanitize(self, text: str) -> str:
        for regex, replace in self.patterns:
            text = re.sub(regex, replace, text)
        return text


# -- tampering ---------------------------------------------------------------------

def _output_text(outputs, course) -> list:
    """What a reader sees of some outputs, as the grader's nbval compares them (streams merged, no stderr)."""
    texts, streams = [], {}
    for out in outputs if isinstance(outputs, list) else []:
        if not isinstance(out, dict):
            texts.append(repr(out))
        elif out.get("output_type") == "stream" and out.get("name") == "stderr":
            continue  # warnings: not a verdict, and nothing to gain by forging them
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

    Anything else was written by hand.
    """
    outputs = mine.get("outputs") or []
    if any(isinstance(o, dict) and o.get("output_type") == "error" for o in outputs):
        return True
    theirs, ours = "\x00".join(_output_text(outputs, course)), "\x00".join(_output_text(pristine.outputs, course))
    return ours.startswith(theirs)


def find_tampering(sub, pristine, exercises, course) -> dict:
    """{exercise name or "*": reason} for everything edited that must not be."""
    mine = {c.get("id"): c for c in sub["cells"] if isinstance(c, dict) and isinstance(c.get("id"), str)}
    found = {}
    answers, checks, others = [], [], []
    for index, cell in enumerate(pristine.cells):
        tags = _tags(cell)
        if "answer" in tags:
            if cell.id in mine:
                answers.append((_course(cell).get("exercise"), _text(mine[cell.id].get("source"))))
            continue
        if cell.cell_type == "code":
            (checks if "check" in tags else others).append(cell.source)
        owner = _course(cell).get("exercise") if "check" in tags else "*"
        what = f"check cell of {owner}" if "check" in tags else f"cell {index} ({cell.cell_type})"
        theirs = mine.get(cell.id)
        if theirs is None:
            found.setdefault(owner, f"{what} was deleted")
        elif theirs.get("cell_type") != cell.cell_type or _text(theirs.get("source")) != cell.source:
            found.setdefault(owner, f"{what} was edited")
        elif "check" in tags and not _stored_output_ok(theirs, cell, course):
            found.setdefault(owner, f"stored output of the {what} was edited")
    context = Context.of(others, checks, [source for _, source in answers])
    for name, source in answers:
        reasons = scan_answer(source, context)
        if reasons:
            found.setdefault(name, "answer " + "; ".join(reasons))
    return found


# -- running -----------------------------------------------------------------------

def _neutral(reason: str) -> str:
    return f"raise RuntimeError({('not run by the grader: ' + reason)!r})"


def assemble(pristine, answers: dict, skip: dict):
    """The pristine notebook with the submission's answers; cells of ``skip`` exercises just raise."""
    nb = copy.deepcopy(pristine)
    for cell in nb.cells:
        exercise = _course(cell).get("exercise")
        if exercise in skip and ("answer" in _tags(cell) or "check" in _tags(cell)):
            cell.source = _neutral(skip[exercise])
        elif "answer" in _tags(cell):
            cell.source = answers[cell.id]
    return nb


def _mirror(root: Path, tmp: Path) -> Path:
    """tmp/exercises/ beside links to the course's folders, so relative paths resolve as in the course."""
    (tmp / "exercises").mkdir()
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.name.startswith(".") and entry.name != "exercises":
            (tmp / entry.name).symlink_to(entry.resolve())
    for entry in sorted((root / "exercises").iterdir()):
        if entry.suffix != ".ipynb" and not entry.name.startswith("."):
            (tmp / "exercises" / entry.name).symlink_to(entry.resolve())
    (tmp / "pytest.ini").write_text("[pytest]\n")  # not the course's pytest settings
    return tmp / "exercises"


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, TypeError, OSError):
        pass


def run_nbval(nb, name, course, cell_timeout, tmp: Path):
    """Run ``nb`` under nbval in a subprocess: (cell records, whether it was killed, log tail)."""
    folder = _mirror(course.root, tmp)
    path, records_path, log_path = folder / f"{name}.ipynb", tmp / "records.jsonl", tmp / "nbval.log"
    path.write_text(nbformat.writes(nb), encoding="utf-8")
    cmd = [sys.executable, "-m", "pytest", str(path), "-c", str(tmp / "pytest.ini"), "--rootdir", str(tmp),
           "-p", "course_lib.nbval_record", "-p", "nbval.plugin", "-p", "no:cacheprovider",
           "--nbval", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout}",
           "--cell-records", str(records_path), "--ignore-stderr", "-q", "--tb=no", "--color=no"]
    if course.sanitize_cfg:
        cmd += ["--nbval-sanitize-with", str(course.sanitize_cfg)]
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTEST_ADDOPTS="")
    n_cells = sum(1 for c in nb.cells if c.cell_type == "code")
    limit = STARTUP_ALLOWANCE + cell_timeout * max(1, n_cells)
    killed, started = False, time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        # nbval ends a cell that runs too long by interrupting the kernel; a cell that
        # swallows KeyboardInterrupt while printing keeps nbval reading its output forever.
        # So: kill the run when no cell has started or ended for longer than nbval needs.
        try:
            while proc.poll() is None:
                try:
                    proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
                if records_path.exists():
                    quiet = time.time() - records_path.stat().st_mtime > cell_timeout + STALL_GRACE
                else:
                    quiet = time.monotonic() - started > STARTUP_ALLOWANCE + STALL_GRACE
                if proc.poll() is None and (quiet or time.monotonic() - started > limit):
                    killed = True
                    _kill_group(proc.pid)
                    proc.wait()
        except BaseException:  # Ctrl-C: leave no run (and no kernel) behind
            killed = True
            _kill_group(proc.pid)
            raise
        finally:
            if killed:  # the kernel runs in a session of its own: end it too
                for line in records_path.read_text().splitlines() if records_path.exists() else []:
                    if '"kernel"' in line:
                        _kill_group(json.loads(line).get("pid"))
    records = []
    if records_path.exists():
        for line in records_path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                pass  # a line cut short by a kill
    return records, killed, log_path.read_text(encoding="utf-8", errors="replace")[-2000:]


def _one_line(text, course, width=90) -> str:
    line = next((s.strip() for s in course.sanitize(str(text)).splitlines() if s.strip()), "")
    return line if len(line) <= width else line[:width - 3] + "..."


def cell_status(record, is_check, cell_timeout, course):
    """(status, reason) of a cell that did not pass."""
    kind, ename = record.get("kind"), record.get("ename", "")
    evalue = _one_line(record.get("evalue", ""), course)
    where = "check" if is_check else "answer"
    if kind == "timeout":
        return "timeout", f"the {where} cell ran longer than {cell_timeout:g} s"
    if kind == "kernel_died":
        return "error", f"the kernel died in the {where} cell (a crash, e.g. an out-of-bounds access)"
    if kind == "output_mismatch":
        return "fail", "the check printed something else than expected (does your code print?)"
    if kind == "exception" and ename == "NotImplementedError":
        return "fail", "not implemented yet"
    if kind == "exception" and is_check and ename in ("CheckFailed", "AssertionError"):
        return "fail", evalue or ename
    if kind == "exception":
        return "error", _one_line(f"{ename}: {evalue}" if evalue else ename, course) + f" (in the {where} cell)"
    return "error", f"{where} cell: {evalue or kind}"


def run_exercises(pristine, name, answers, exercises, decided, course, cell_timeout):
    """Run until every exercise has a status; a crash or hang is scored and not run again."""
    skip = {ex: f"exercise {ex} is {status}" for ex, (status, _) in decided.items()}
    while any(ex.name not in decided for ex in exercises):
        with tempfile.TemporaryDirectory(prefix="course-grade-") as tmp:
            records, killed, log = run_nbval(assemble(pristine, answers, skip), name, course,
                                             cell_timeout, Path(tmp))
        ends = {r.get("id"): r for r in records if r.get("event") == "end"}
        starts = [r.get("id") for r in records if r.get("event") == "start"]
        running = starts[-1] if killed and starts and starts[-1] not in ends else None
        progressed = False
        for ex in exercises:
            if ex.name in decided:
                continue
            status = _exercise_status(ex, ends, running, cell_timeout, course)
            if status is None:   # not run: the kernel had died, or the run was killed, before it
                break
            status, reason, fatal = status
            decided[ex.name], progressed = (status, reason), True
            if fatal:            # it hung or killed the kernel: never again
                skip[ex.name] = f"exercise {ex.name} {status}: not run again"
        if not progressed:
            if killed:
                reason = "the run was stopped after running past its time limits" + (
                    f" in cell {running}" if running else "")
            elif records:
                reason = "the kernel died outside the answer and check cells"
            else:
                reason = "the notebook could not be run: " + _one_line(log.strip().splitlines()[-1] if
                                                                        log.strip() else "no output", course)
            for ex in exercises:
                decided.setdefault(ex.name, ("timeout" if killed else "error", reason))
    return decided


def _exercise_status(ex, ends, running, cell_timeout, course):
    """(status, reason, fatal) from the cell records of one run; None if it did not get to run."""
    for cell_id in ex.answer_ids + [ex.check_id]:
        record = ends.get(cell_id)
        if record is None:
            if cell_id != running:
                return None
            where = "check" if cell_id == ex.check_id else "answer"
            return ("timeout", f"the {where} cell ran past {cell_timeout:g} s and could not be interrupted", True)
        if record.get("outcome") in ("passed", "skipped"):
            continue
        if record.get("kind") == "kernel_dead":
            return None
        fatal = record.get("kind") in ("timeout", "kernel_died")
        return cell_status(record, cell_id == ex.check_id, cell_timeout, course) + (fatal,)
    return ("pass", "", False)


def grade(path, course: Course, cell_timeout=DEFAULT_TIMEOUT) -> Result:
    """Grade one submission; never raises, whatever is wrong with the submission."""
    try:
        return _grade(path, course, cell_timeout)
    except Exception as exc:  # a grader bug must not stop the other submissions
        return Result(str(path), "", [Row("*", "error", 0, 0, f"grader error ({type(exc).__name__}: {exc})")])


def _grade(path, course, cell_timeout):
    try:
        sub = load_submission(path)
        name = course.identify(sub)
    except Invalid as exc:
        return Result(str(path), "", [Row("*", "invalid", 0, 0, str(exc))])
    pristine = course.notebook(name)
    exercises = exercises_of(pristine)
    result = Result(str(path), name)
    try:
        mine = {c["id"]: c for c in sub["cells"] if isinstance(c, dict) and isinstance(c.get("id"), str)}
        decided = {}
        for ex in exercises:
            if any(i not in mine for i in ex.answer_ids):
                decided[ex.name] = ("invalid", "answer cell missing (was it deleted or recreated?)")
        if all(ex.name in decided for ex in exercises):
            raise Invalid("no answer cell of this exercise set found")
        tampered = find_tampering(sub, pristine, exercises, course)
        for ex in exercises:
            reason = tampered.get(ex.name) or tampered.get("*")
            if reason and ex.name not in decided:
                decided[ex.name] = ("tampered", reason)
        answers = {i: _text(mine[i].get("source")) for ex in exercises for i in ex.answer_ids if i in mine}
        run_exercises(pristine, name, answers, exercises, decided, course, cell_timeout)
    except Invalid as exc:
        decided = {ex.name: ("invalid", str(exc)) for ex in exercises}
    except Exception as exc:  # a grader bug must not stop the other submissions
        decided = {ex.name: ("error", f"grader error ({type(exc).__name__}: {exc}); please report it")
                   for ex in exercises}
    for ex in exercises:
        status, reason = decided[ex.name]
        result.rows.append(Row(ex.name, status, ex.points if status == "pass" else 0, ex.points, reason))
    return result


def grade_all(paths, course: Course, cell_timeout=DEFAULT_TIMEOUT, jobs=1):
    """Grade several submissions, ``jobs`` at a time; yields results in the order of ``paths``.

    Each grading mostly waits on its own nbval subprocess, but its static scan
    parses Python, and CPython 3.11 can fail ("AST constructor recursion depth
    mismatch") when two threads parse or compile at once: so parallel grading
    uses processes, not threads.
    """
    if jobs <= 1:
        yield from (grade(path, course, cell_timeout) for path in paths)
        return
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(partial(grade, course=course, cell_timeout=cell_timeout), paths)


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


def write_csv(results, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["submission", "exercise_set", "exercise", "status", "points", "max_points"])
        for result in results:
            for r in result.rows:
                writer.writerow([result.submission, result.exercise_set, r.exercise, r.status,
                                 r.points, r.max_points])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.grade",
        description="Score exercise notebooks.  Only the answer cells of each submission are taken; "
                    "they run inside the course's own copy of the exercise notebook under nbval, in a "
                    "subprocess with time limits.  Prints a table per submission; the exit code is 0 "
                    "whenever every submission was graded, whatever the scores.",
        epilog="statuses: pass (the check's points), fail (the check said no, or still a stub), "
               "error (another exception, or the kernel died), timeout, tampered (edited check cells "
               "or outputs, or an answer that patches what the checks rely on), invalid (not a notebook "
               "of this course, or the answer cell is gone).  All but pass score 0.")
    parser.add_argument("submissions", nargs="+", type=Path, metavar="SUBMISSION.ipynb",
                        help="notebooks to grade (never modified)")
    parser.add_argument("--csv", type=Path, metavar="OUT",
                        help="also write submission,exercise_set,exercise,status,points,max_points rows")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="time limit per cell (default %(default)s); a cell that cannot be interrupted "
                             f"is stopped {STALL_GRACE} s later, and the whole run may take {STARTUP_ALLOWANCE} s "
                             "more than this times the number of code cells")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="grade N submissions at a time, each in its own kernel (default 1)")
    parser.add_argument("--course-root", type=Path, default=COURSE_ROOT, metavar="DIR",
                        help="the course folder whose exercises/ hold the pristine notebooks "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    course = Course(args.course_root)
    if not course.paths:
        parser.error(f"no exercise notebooks in {args.course_root / 'exercises'}; is --course-root right?")
    results = []
    for result in grade_all(args.submissions, course, args.timeout, args.jobs):
        results.append(result)
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
