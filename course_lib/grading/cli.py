"""``python -m course_lib.grade SUBMISSION.ipynb...``: the grader's command line and its reports.

One table per submission on stdout (plain, deterministic text) and, with ``--csv``, one row
per submission and exercise; the grading itself is ``pipeline.py``'s.
"""
from __future__ import annotations

import argparse
import csv
import os
import stat
import sys
from pathlib import Path

from . import sandbox
from .pipeline import DEFAULT_TIMEOUT, NoSandbox, Options, Result, expand_unknown, grade_all, plain_line
from .submission import Course

COURSE_ROOT = Path(__file__).resolve().parent.parent.parent


def own_notebook(paths, course: Course) -> bool:
    """Whether ``paths`` is the learner grading their own work: one notebook, in the checkout's
    ``exercises/`` (where a learner works, and where no one puts another's submission: those files are
    the course's own), owned and writable by whoever runs the grader."""
    unique = {Path(p).resolve() for p in paths}
    if len(unique) != 1:
        return False
    path = unique.pop()
    try:
        info = path.stat()
    except OSError:
        return False
    return (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and os.access(path, os.W_OK)
            and path.parent == (course.root / "exercises").resolve())


def format_result(result: Result) -> str:
    """The submission's table: one row per exercise, then the total; plain, deterministic text."""
    width = max([8] + [len(r.exercise) for r in result.rows])

    def line(exercise, status, points, reason=""):
        return f"  {exercise:<{width}}  {status:<8}  {points:>9}  {plain_line(reason)}".rstrip()

    got, out_of = result.total
    return "\n".join(
        [f"{plain_line(result.submission)}  [{result.exercise_set or 'unknown exercise set'}]",
         line("exercise", "status", "points", "reason")]
        + [line(r.exercise, r.status, f"{r.points} / {r.max_points}", r.reason) for r in result.rows]
        + [line("total", "", f"{got} / {out_of}")])


CSV_COLUMNS = ["submission", "exercise_set", "exercise", "status", "points", "max_points", "reason"]
FORMULA_START = ("=", "+", "-", "@")   # what makes a spreadsheet read a cell as a formula


def csv_cell(value):
    """A value for the CSV: text as one plain line, and one a spreadsheet would read as a formula
    (``=HYPERLINK(...)``, a submission named ``-1+1.ipynb``) behind a quote, as OWASP advises."""
    if type(value) is not str:
        return value
    text = plain_line(value, width=1000)
    return "'" + text if text.startswith(FORMULA_START) else text


def write_csv(results, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for result in results:
            for r in result.rows:
                writer.writerow([csv_cell(v) for v in (result.submission, result.exercise_set, r.exercise, r.status,
                                                         r.points, r.max_points, r.reason)])


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
               "cell or stored check output), invalid (not a notebook of this course, the answer cell is "
               "gone or over 64 KiB, or the file is a symbolic or hard link: refused).  All but pass score 0.")
    parser.add_argument("submissions", nargs="+", type=Path, metavar="SUBMISSION.ipynb",
                        help="notebooks to grade (never modified; a path given twice is graded once)")
    parser.add_argument("--csv", type=Path, metavar="OUT",
                        help="also write " + ",".join(CSV_COLUMNS) + " rows")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="time limit for each exercise's answer cells, and again for its check "
                             "(default %(default)s)")
    parser.add_argument("--submission-timeout", type=float, metavar="SECONDS",
                        help="time limit for all of one submission, the grader's own work on it included "
                             "(default: the timeout x (2 x the set's checks + 2)); what is left then scores timeout")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="grade N submissions at a time, each in its own sandbox (default 1)")
    parser.add_argument("--memory", type=float, default=4, metavar="GB",
                        help="memory each sandbox may use: the address space of each of its processes, and "
                             "the resident memory of all of them together (default %(default)s GB)")
    parser.add_argument("--processes", type=int, default=sandbox.Limits.processes, metavar="N",
                        help="processes and threads each sandbox may run (default %(default)s; a grader running "
                             "as root gives each sandbox a uid of its own, so one submission's threads never "
                             "count against another's; the CUDA simulator runs a thread per CUDA thread: raise "
                             "it for set 09)")
    parser.add_argument("--set", dest="exercise_set", metavar="NN_topic",
                        help="the exercise set, for files too broken to tell (default: the batch's)")
    parser.add_argument("--published-inputs", action="store_true",
                        help="check on the notebook's own inputs, as the learner's check cells did; by default "
                             "the checks' random inputs are drawn from a secret salt (the same cases, new values), "
                             "so that outputs computed for the published inputs and pasted in are worth nothing")
    parser.add_argument("--trusted", action="store_true",
                        help="the submissions are trusted: where no sandbox is available, run them in a plain "
                             "subprocess instead of refusing (one notebook of your own, in the checkout's "
                             "exercises/ and yours to write, runs so without it, with a note)")
    parser.add_argument("--course-root", type=Path, default=COURSE_ROOT, metavar="DIR",
                        help="the course folder whose exercises/ hold the pristine notebooks "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    if args.submission_timeout is not None and args.submission_timeout <= 0:
        parser.error("--submission-timeout must be a positive number of seconds")
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
    trusted = args.trusted
    if not trusted and not sandbox.available() and own_notebook(args.submissions, course):
        print(f"note: graded without a sandbox ({sandbox.why_unavailable()}), as it is your own notebook; "
              "others' need a sandbox or --trusted", file=sys.stderr, flush=True)
        trusted = True
    options = Options(args.timeout, trusted, sandbox.Limits(memory_bytes=int(args.memory * 2**30),
                                                                 processes=args.processes), not args.published_inputs,
                      args.submission_timeout)
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

