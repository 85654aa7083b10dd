"""The class's work: collect each learner's set (with when it was saved), grade it, hand back
feedback, and keep one gradebook across sets and learners, with the written defences marked by hand.

The files, in the state folder (root's alone):

    collected/SET/submissions.csv  learner, status, saved_at, changed_at, deadline, late, bytes, sha256, reason
    grades/SET.csv                 one row per learner and exercise: the grader's verdicts
    manual.csv                     the instructor's marks: learner, exercise_set, exercise, points, max_points, comment
    gradebook.csv                 one row per learner: each set's points and late flag, the manual marks, the total

Times are UTC, written ``2026-12-02T16:59:07Z``.  A notebook is late when it *changed* after
the deadline: ``changed_at`` is the file's ctime, which its owner cannot set back (``touch -d``
moves ``saved_at``, the mtime, but sets the ctime to now), so a learner cannot backdate a save.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from machine import REPO, Failed, Place, as_learner, learners, need_root

MAX_NOTEBOOK_BYTES = 32 * 2**20
GRADE_COLUMNS = ["learner", "submission", "exercise_set", "exercise", "status", "points", "max_points", "reason"]
SUBMISSION_COLUMNS = ["learner", "status", "saved_at", "changed_at", "deadline", "late", "bytes", "sha256", "reason"]
MANUAL_COLUMNS = ["learner", "exercise_set", "exercise", "points", "max_points", "comment"]


class BadSheet(ValueError):
    """A sheet the instructor edits has a row that cannot be used; the message names the row."""


def utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_deadline(text: str) -> datetime:
    """An ISO date and time (``2026-12-02 17:00``); without a UTC offset it is this machine's local time."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadSheet(f"deadline {text!r} is not a date and time such as 2026-12-02T17:00 "
                       "(local time) or 2026-12-02T17:00+01:00") from None
    return when if when.tzinfo else when.astimezone()


def submission_row(learner: str, data: bytes | None, stat: dict | None, deadline: datetime | None,
                   reason: str = "") -> dict:
    """One learner's line of submissions.csv: the notebook collected (``data``, its ``stat`` times) or why not."""
    row = dict.fromkeys(SUBMISSION_COLUMNS, "")
    row.update(learner=learner, deadline=utc(deadline.timestamp()) if deadline else "")
    if data is None:
        row.update(status="missing", reason=reason)
        return row
    row.update(status="collected", saved_at=utc(stat["mtime"]), changed_at=utc(stat["ctime"]),
               bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    if deadline is not None:
        row["late"] = "yes" if stat["ctime"] > deadline.timestamp() else "no"
    return row


def read_csv(path: Path) -> list:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def write_csv(path: Path, columns: list, rows: list) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: spreadsheet_safe(str(v)) for k, v in row.items()} for row in rows)
    tmp.replace(path)


def spreadsheet_safe(text: str) -> str:
    """A reason can quote a learner's own error message: one a spreadsheet would run as a formula gets a '."""
    return "'" + text if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text


def manual_marks(rows: list, names: list, exercises: dict) -> list:
    """The usable rows of manual.csv; ``exercises`` is {set: {exercise: points}} of the sets there are.

    Raises BadSheet naming the first row (as a spreadsheet numbers it) that cannot be used.
    """
    marks = []
    for line, row in enumerate(rows, start=2):
        if not any((v or "").strip() for v in row.values()):
            continue
        where = f"manual.csv row {line}"
        name, exercise_set = (row.get("learner") or "").strip(), (row.get("exercise_set") or "").strip()
        if name not in names:
            raise BadSheet(f"{where}: {name!r} is not a learner")
        if exercise_set not in exercises:
            raise BadSheet(f"{where}: {exercise_set!r} is not an exercise set ({', '.join(sorted(exercises))})")
        try:
            points, out_of = float(row["points"]), float(row["max_points"])
        except (TypeError, ValueError):
            raise BadSheet(f"{where}: points and max_points must be numbers, got {row.get('points')!r} "
                           f"and {row.get('max_points')!r}") from None
        if not 0 <= points <= out_of:
            raise BadSheet(f"{where}: {points:g} points is not between 0 and max_points {out_of:g}")
        marks.append(dict(row, learner=name, exercise_set=exercise_set, points=points, max_points=out_of))
    return marks


def _number(x: float) -> str:
    return f"{x:g}"


def gradebook(names: list, grades: dict, submissions: dict, manual: list) -> tuple:
    """(columns, rows): one row per learner across every graded set.

    ``grades`` is {set: rows of grades/SET.csv}, ``submissions`` {set: rows of submissions.csv},
    ``manual`` the rows of manual_marks.  A set's column is the grader's points (out of the set's
    total, the same for everyone), its late column the flag of the notebook graded; the manual
    column adds the hand marks of every set; total and max_points are their sums.
    """
    sets = sorted(grades)
    set_max = {s: sum(float(p) for p in {r["exercise"]: r["max_points"] for r in grades[s]}.values()) for s in sets}
    columns = ["learner"]
    for s in sets:
        columns += [f"{s} (/{_number(set_max[s])})", f"{s} late"]
    columns += ["manual", "manual max", "total", "max_points"]
    rows = []
    for name in names:
        row, total, out_of = {"learner": name}, 0.0, 0.0
        for s in sets:
            mine = [r for r in grades[s] if r["learner"] == name]
            got = sum(float(r["points"]) for r in mine)
            row[f"{s} (/{_number(set_max[s])})"] = _number(got) if mine else ""
            late = {r["learner"]: r.get("late", "") for r in submissions.get(s, [])}
            row[f"{s} late"] = late.get(name, "")
            total, out_of = total + got, out_of + set_max[s]
        hand = [m for m in manual if m["learner"] == name]
        row["manual"] = _number(sum(m["points"] for m in hand))
        row["manual max"] = _number(sum(m["max_points"] for m in hand))
        row["total"] = _number(total + sum(m["points"] for m in hand))
        row["max_points"] = _number(out_of + sum(m["max_points"] for m in hand))
        rows.append(row)
    return columns, rows


def feedback_text(exercise_set: str, rows: list, when: str, manual: list = (), submission: dict | None = None) -> str:
    """A learner's feedback on a set: the grader's rows, the hand marks and comments, lateness."""
    got = sum(float(r["points"]) for r in rows) + sum(m["points"] for m in manual)
    of = sum(float(r["max_points"]) for r in rows) + sum(m["max_points"] for m in manual)
    width = max([8] + [len(r["exercise"]) for r in rows] + [len(m["exercise"]) for m in manual])
    lines = [f"Feedback on exercise set {exercise_set}: {_number(got)} / {_number(of)} points",
             f"(graded {when} from exercises/{exercise_set}.ipynb as it was saved when collected)"]
    if submission and submission.get("deadline") and submission.get("status") == "collected":
        lines.append(f"last changed {submission['changed_at']}, deadline {submission['deadline']}: "
                     + ("LATE" if submission["late"] == "yes" else "on time"))
    lines += ["", f"{'exercise':<{width}}  {'status':<8}  {'points':>7}  reason"]
    for r in rows:
        lines.append(f"{r['exercise']:<{width}}  {r['status']:<8}  {r['points'] + ' / ' + r['max_points']:>7}  "
                     f"{r['reason']}".rstrip())
    for m in manual:
        lines.append(f"{m['exercise']:<{width}}  {'by hand':<8}  "
                     f"{_number(m['points']) + ' / ' + _number(m['max_points']):>7}  {m.get('comment') or ''}".rstrip())
    lines += ["", "pass: the check's points. fail: the check said no (or the answer is still a stub). "
              "error / timeout: it raised or ran too long. tampered: a check cell was edited. "
              "by hand: your instructor's mark of a written answer. "
              "Run the check cell under an exercise to see where an answer goes wrong."]
    return "\n".join(lines) + "\n"


# Run as the learner: read one of their files, refusing anything but a regular file of bounded size.
# Prints a line of JSON (its mtime and ctime), then the file.
_READER = r"""
import json, os, stat, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
st = os.fstat(fd)
if not stat.S_ISREG(st.st_mode):
    sys.exit("not a regular file")
data = os.read(fd, int(sys.argv[2]) + 1)
if len(data) > int(sys.argv[2]):
    sys.exit("larger than %s bytes" % sys.argv[2])
sys.stdout.buffer.write(json.dumps({"mtime": st.st_mtime, "ctime": st.st_ctime}).encode() + b"\n" + data)
"""
# Run as the learner: write stdin to a file of theirs (a temporary file, then renamed over it).


# Run as the learner: write stdin to a file of theirs (a temporary file, then renamed over it).
_WRITER = r"""
import os, sys
path = sys.argv[1]
os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
tmp = path + ".tmp-%d" % os.getpid()
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
with os.fdopen(fd, "wb") as f:
    f.write(sys.stdin.buffer.read())
os.replace(tmp, path)
"""


def _set_name(exercise_set: str) -> str:
    if not re.fullmatch(r"\d\d_[a-z0-9_]+", exercise_set) or not (REPO / "exercises" / f"{exercise_set}.ipynb").exists():
        known = ", ".join(p.stem for p in sorted((REPO / "exercises").glob("*.ipynb")))
        raise Failed(f"no exercise set {exercise_set!r}; the sets are: {known}")
    return exercise_set


def _deadline(text: str | None):
    try:
        return parse_deadline(text) if text else None
    except BadSheet as exc:
        raise Failed(str(exc)) from None


def collect(place: Place, exercise_set: str, deadline: str | None = None) -> dict:
    """Copy each learner's ~/flash-course/exercises/SET.ipynb, read as that learner, to state/collected/SET/,
    with when each was last saved and changed (and, given a deadline, whether that was late) in
    submissions.csv there.

    Returns {learner: path collected, or None with the reason printed}.
    """
    need_root()
    exercise_set, due = _set_name(exercise_set), _deadline(deadline)
    out = place.state / "collected" / exercise_set
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, mode=0o700)
    found, rows = {}, []
    for name in learners(place.settings()["group"]):
        path = Path(pwd.getpwnam(name).pw_dir) / "flash-course" / "exercises" / f"{exercise_set}.ipynb"
        try:
            rc, data, err = as_learner(place, name, _READER, [path, MAX_NOTEBOOK_BYTES])
        except subprocess.TimeoutExpired:
            rc, data, err = 1, b"", "reading it took too long"
        if rc:
            found[name] = None
            why = err.splitlines()[-1] if err else "unreadable"
            rows.append(submission_row(name, None, None, due, why))
            print(f"{name}: nothing collected ({why})")
            continue
        header, data = data.split(b"\n", 1)
        row = submission_row(name, data, json.loads(header), due)
        rows.append(row)
        target = out / f"{name}.ipynb"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        found[name] = target
        if row["late"] == "yes":
            print(f"{name}: late (last changed {row['changed_at']}, deadline {row['deadline']})")
    write_csv(out / "submissions.csv", SUBMISSION_COLUMNS, rows)
    late = sum(r["late"] == "yes" for r in rows)
    print(f"collected {sum(1 for p in found.values() if p)} of {len(found)} learners' {exercise_set} "
          f"into {out}" + (f" ({late} late)" if due else "") + f"; times in {out / 'submissions.csv'}")
    return found


def grade(place: Place, exercise_set: str, jobs: int, timeout: float | None, processes: int | None = None,
          deadline: str | None = None) -> Path:
    """Collect, then grade with the sandboxed grader into state/grades/SET.csv (one row per learner and exercise)."""
    found = collect(place, exercise_set, deadline)
    python = REPO / ".venv" / "bin" / "python"
    if not python.exists():
        raise Failed(f"{python} is missing: run `make venv` in {REPO} first (the grader runs from it)")
    grades = place.state / "grades"
    grades.mkdir(mode=0o700, exist_ok=True)
    raw = grades / f"{exercise_set}.grader.csv"
    paths = [p for p in found.values() if p]
    rows = []
    if paths:
        argv = [python, "-m", "course_lib.grade", *paths, "--set", exercise_set, "--csv", raw, "--jobs", jobs]
        if timeout:
            argv += ["--timeout", timeout]
        if processes:
            argv += ["--processes", processes]
        done = subprocess.run([str(a) for a in argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        (grades / f"{exercise_set}.grader.log").write_text(done.stdout)
        if done.returncode:
            raise Failed(f"the grader exited with {done.returncode}:\n{done.stdout[-3000:]}")
        for row in read_csv(raw):
            row["learner"] = Path(row["submission"]).stem
            rows.append(row)
    exercises = _exercises(exercise_set)
    for name, path in found.items():
        if path is None:
            rows += [dict(learner=name, submission="", exercise_set=exercise_set, exercise=ex, status="missing",
                          points=0, max_points=pts, reason=f"no readable exercises/{exercise_set}.ipynb in the "
                                                           "learner's course folder when it was collected")
                     for ex, pts in exercises]
    rows.sort(key=lambda r: r["learner"])
    out = grades / f"{exercise_set}.csv"
    write_csv(out, GRADE_COLUMNS, rows)
    for name in found:
        got = sum(int(r["points"]) for r in rows if r["learner"] == name)
        of = sum(int(r["max_points"]) for r in rows if r["learner"] == name)
        print(f"{name}: {got} / {of}")
    print(f"grades of {exercise_set}: {out}")
    return out


def _exercises(exercise_set: str) -> list:
    """[(exercise, points)] of a set, read from its pristine notebook's check cells."""
    nb = json.loads((REPO / "exercises" / f"{exercise_set}.ipynb").read_text())
    out = []
    for cell in nb["cells"]:
        course = cell.get("metadata", {}).get("course", {})
        if "check" in cell.get("metadata", {}).get("tags", []):
            out.append((course.get("exercise", "?"), int(course.get("points", 0))))
    return out


def _manual_marks(place: Place, group: str) -> list:
    """The instructor's hand marks (state/manual.csv; a header-only sheet is written if there is none)."""
    sheet = place.state / "manual.csv"
    if not sheet.exists():
        write_csv(sheet, MANUAL_COLUMNS, [])
    sets = {p.stem: dict(_exercises(p.stem)) for p in sorted((REPO / "exercises").glob("*.ipynb"))}
    try:
        return manual_marks(read_csv(sheet), learners(group), sets)
    except BadSheet as exc:
        raise Failed(str(exc)) from None


def feedback(place: Place, exercise_set: str) -> dict:
    """Write each learner's rows of state/grades/SET.csv, their hand marks and whether they were late, to
    ~/flash-course/feedback/SET.txt, as the learner."""
    need_root()
    exercise_set = _set_name(exercise_set)
    group = place.settings()["group"]
    sheet = place.state / "grades" / f"{exercise_set}.csv"
    if not sheet.exists():
        raise Failed(f"no grades for {exercise_set}: run `workshop.py grade {exercise_set}` first")
    rows = read_csv(sheet)
    manual = [m for m in _manual_marks(place, group) if m["exercise_set"] == exercise_set]
    submissions = {r["learner"]: r for r in read_csv(place.state / "collected" / exercise_set / "submissions.csv")}
    when = datetime.fromtimestamp(sheet.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    written = {}
    for name in sorted({r["learner"] for r in rows}):
        if name not in learners(group):
            continue  # an account removed since grading
        text = feedback_text(exercise_set, [r for r in rows if r["learner"] == name], when,
                                  [m for m in manual if m["learner"] == name], submissions.get(name))
        path = Path(pwd.getpwnam(name).pw_dir) / "flash-course" / "feedback" / f"{exercise_set}.txt"
        rc, _, err = as_learner(place, name, _WRITER, [path], text.encode())
        if rc:
            print(f"{name}: feedback not written ({err.splitlines()[-1] if err else rc})")
        else:
            written[name] = path
            print(f"{name}: {path}")
    return written


def write_gradebook(place: Place) -> Path:
    """state/gradebook.csv: one row per learner, every graded set's points and late flag, the hand marks
    of state/manual.csv, the total."""
    need_root()
    group = place.settings()["group"]
    grades = {p.stem: read_csv(p) for p in sorted((place.state / "grades").glob("[0-9][0-9]_*.csv"))
              if not p.name.endswith(".grader.csv")}
    submissions = {s: read_csv(place.state / "collected" / s / "submissions.csv") for s in grades}
    manual = _manual_marks(place, group)
    columns, rows = gradebook(learners(group), grades, submissions, manual)
    out = place.state / "gradebook.csv"
    write_csv(out, columns, rows)
    print(f"gradebook of {len(rows)} learners over {len(grades)} set(s) "
          f"({', '.join(grades) or 'none graded yet'}) and {len(manual)} hand mark(s): {out}\n"
          f"(hand marks go in {place.state / 'manual.csv'}: {', '.join(MANUAL_COLUMNS)})")
    return out
