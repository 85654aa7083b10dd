"""A submission against the course's own copy: reading it, matching its cells, finding edits.

Only a submission's *answer cells* are ever run; everything else the grader runs is the
course's pristine exercise notebook in ``exercises/``.  This module finds those answer
cells (by cell id, or, in a notebook saved without ids, by their exercise metadata) and
reports check cells, or stored check outputs, that were edited (``tampered``): an edit
changes nothing, since the course's copy runs, but it tells the instructor something.
"""
from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import nbformat


@dataclass
class Exercise:
    name: str                  # "1.2"
    answer_ids: list
    check_id: str
    points: int


class Invalid(Exception):
    """The submission cannot be graded as a notebook of this course."""


# -- reading cells of untrusted JSON --------------------------------------------------------

def source_text(source) -> str:
    """A cell's source as one string, whether saved as a string or a list of lines."""
    return "".join(map(str, source)) if isinstance(source, list) else str(source or "")


def tags(cell) -> list:
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    found = meta.get("tags", []) if isinstance(meta, dict) else []
    return found if isinstance(found, list) else []


def course_meta(cell) -> dict:
    """A cell's ``metadata.course`` (exercise, points, expected outputs), or {}."""
    meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    meta = meta.get("course", {}) if isinstance(meta, dict) else {}
    return meta if isinstance(meta, dict) else {}


MAX_NOTEBOOK_BYTES = 100 * 2**20


def read_file(path: Path, limit=MAX_NOTEBOOK_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``Invalid`` for anything else (a FIFO,
    a device, a folder), without ever waiting on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise Invalid(f"not a readable notebook ({type(exc).__name__}: {str(exc)[:200]})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Invalid("not a notebook: not a regular file (a pipe, a device or a folder)")
        if info.st_size > limit:
            raise Invalid(f"not a notebook of this course: {info.st_size / 2**20:.0f} MiB, over the "
                          f"{limit // 2**20} MiB a notebook may have (clear its outputs and save it again)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise Invalid(f"not a notebook of this course: over the {limit // 2**20} MiB a notebook may have")
        return data
    except OSError as exc:
        raise Invalid(f"not a readable notebook ({type(exc).__name__}: {str(exc)[:200]})") from None
    finally:
        os.close(fd)


def load_submission(path: Path) -> dict:
    """The submission as plain JSON (no repair, no validation beyond what grading needs)."""
    data = read_file(Path(path))
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
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
        name = course_meta(cell).get("exercise")
        if "answer" in tags(cell):
            found.setdefault(name, Exercise(name, [], "", 0)).answer_ids.append(cell.id)
        elif "check" in tags(cell):
            ex = found.setdefault(name, Exercise(name, [], "", 0))
            ex.check_id, ex.points = cell.id, int(course_meta(cell).get("points", 0))
    return list(found.values())


def refusal(path) -> str:
    """Why ``path`` is refused as a learner's submission ("" if it is not): a symbolic link or a
    hard link, another name of a file that may be anyone's (the course's solutions/ included)."""
    try:
        info = os.lstat(path)
    except OSError:
        return ""   # reading it says what is wrong
    if stat.S_ISLNK(info.st_mode):
        return ("refused: a symbolic link, not a submission; submissions must be regular files: "
                "put a copy of the notebook itself among them")
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return (f"refused: a hard link (this file has {info.st_nlink} names), not a submission of its own; "
                "put a copy of the notebook itself among the submissions")
    return ""


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
        names = {course_meta(c).get("exercise") for c in cells if "answer" in tags(c)}
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


# -- matching a submission's cells to the course's -----------------------------------------

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
            if "answer" in tags(c):
                pending.setdefault(course_meta(c).get("exercise"), []).append(c)
        for cell in pristine.cells:
            exercise = course_meta(cell).get("exercise")
            if "answer" in tags(cell):
                mine = pending.get(exercise, [])
                if mine:
                    matched[cell.id] = mine.pop(0)
            elif "check" in tags(cell):
                twin = [c for c in cells if "check" in tags(c) and course_meta(c).get("exercise") == exercise]
                if twin:
                    matched[cell.id] = twin[0]
    sources = {c.source for c in pristine.cells}
    extra = [i for i, c in enumerate(cells) if c.get("cell_type") == "code" and c.get("id") not in known
             and not any(c is m for m in matched.values()) and source_text(c.get("source")).strip()
             and source_text(c.get("source")) not in sources]
    if extra:
        where = ", ".join(str(i) for i in extra[:5])
        notes.append(f"extra code cell{'s' if len(extra) > 1 else ''} {where} not run by the grader: "
                     "put code an answer needs in that exercise's answer cell")
    return matched, notes


# -- tampering -------------------------------------------------------------------------------

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
            texts[streams[name]] += source_text(out.get("text"))
        elif out.get("output_type") == "error":
            texts.append(f"error:{out.get('ename')}")
        else:
            data = out.get("data", {})
            texts.append(source_text(data.get("text/plain")) if isinstance(data, dict) else "")
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
    expected = pristine.outputs or course_meta(pristine).get("expected_outputs") or []
    ours = "\x00".join(_output_text(expected, course))
    return ours.startswith(theirs)


def find_tampering(matched, pristine, course) -> dict:
    """{exercise: reason} for check cells, or their stored outputs, that were edited."""
    found = {}
    for cell in pristine.cells:
        if "check" not in tags(cell):
            continue
        owner = course_meta(cell).get("exercise")
        theirs = matched.get(cell.id)
        if theirs is None:
            continue  # deleted: the course's copy runs anyway
        if theirs.get("cell_type") != "code" or source_text(theirs.get("source")) != cell.source:
            found[owner] = f"the check cell of {owner} was edited"
        elif not _stored_output_ok(theirs, cell, course):
            found[owner] = f"the stored output of the check cell of {owner} was edited"
    return found
