"""Small course folders for the authoring and grading tests.

``synthetic_solution()`` is a three-exercise solution notebook that follows
CONTRIBUTING.md: a function answer (1.1), a function with two marker regions
(1.2) and a top-level value (1.3), each followed by its check cell.  It runs
in a second, so the grading tests can afford many kernels.  ``make_course``
lays out ``solutions/``, executes them and writes ``exercises/`` the way
``make notebooks`` does.
"""
from __future__ import annotations

import copy
import shutil
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_lib.grading import authoring

from conftest import REPO

SYNTHETIC = "90_synthetic"


def _answer(cell_id, exercise, source):
    return new_code_cell(source, id=cell_id, metadata={
        "tags": ["answer", "nbval-ignore-output"], "course": {"exercise": exercise}})


def _check(cell_id, exercise, points, source):
    return new_code_cell(source, id=cell_id, metadata={
        "tags": ["check"], "course": {"exercise": exercise, "points": points}})


def synthetic_solution(exercise_set=SYNTHETIC):
    cells = [
        new_markdown_cell("# A tiny exercise set\nScores, softmax and a byte count.", id="title"),
        new_code_cell("import numpy as np\nfrom course_lib import checks\n\n"
                      "rng = np.random.default_rng(0)\n"
                      "q = rng.standard_normal((4, 3))  # (Nq, d)\n"
                      "k = rng.standard_normal((5, 3))  # (Nk, d)", id="setup"),
        new_markdown_cell("## Exercise 1.1: scores\nWrite `scores(q, k)` = q k^T.", id="ex11-text"),
        _answer("ex11-answer", "1.1",
                "def scores(q, k):\n"
                "    ### BEGIN SOLUTION\n"
                "    # one matrix product\n"
                "    return q @ k.T\n"
                "    ### END SOLUTION"),
        _check("ex11-check", "1.1", 2, 'checks.check_close("1.1 scores", scores(q, k), q @ k.T)'),
        new_markdown_cell("## Exercise 1.2: a stable softmax", id="ex12-text"),
        _answer("ex12-answer", "1.2",
                "def softmax(x):\n"
                "    ### BEGIN SOLUTION\n"
                "    x = x - x.max(axis=-1, keepdims=True)\n"
                "\n"
                "    ### END SOLUTION\n"
                "    e = np.exp(x)\n"
                "    ### BEGIN SOLUTION\n"
                "    return e / e.sum(axis=-1, keepdims=True)\n"
                "    ### END SOLUTION"),
        _check("ex12-check", "1.2", 3,
               "s = q @ k.T\n"
               'checks.check_close("1.2 softmax", softmax(s), np.exp(s) / np.exp(s).sum(-1, keepdims=True))'),
        new_code_cell('print("S has", q.shape[0] * k.shape[0], "entries")', id="entries"),
        new_markdown_cell("## Exercise 1.3: bytes of S in float64", id="ex13-text"),
        _answer("ex13-answer", "1.3",
                "### BEGIN SOLUTION\n"
                "n_bytes = 8 * 4 * 5  # S is (4, 5) in float64\n"
                "### END SOLUTION"),
        _check("ex13-check", "1.3", 1,
               'checks.check_value("1.3 bytes of S", n_bytes, 8 * q.shape[0] * k.shape[0])'),
    ]
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "course": {"chapter": "90", "kind": "solution", "exercise_set": exercise_set}})
    return nb


def make_course(root: Path, notebooks: dict, execute=True) -> Path:
    """A course folder at ``root``: solutions/<name>.ipynb (executed), exercises/, tests/sanitize.cfg."""
    (root / "solutions").mkdir(parents=True, exist_ok=True)
    (root / "exercises").mkdir(exist_ok=True)
    (root / "tests").mkdir(exist_ok=True)
    shutil.copy(REPO / "tests" / "sanitize.cfg", root / "tests" / "sanitize.cfg")
    for name, nb in notebooks.items():
        path = root / "solutions" / f"{name}.ipynb"
        path.write_text(authoring.dumps(nb), encoding="utf-8")
        if execute:
            authoring.execute(path)
    assert authoring.main(["--course-root", str(root)]) == 0
    return root


def course_around(root: Path, solution: Path) -> Path:
    """A course at ``root`` that is the repository's, with exercises/ freshly made from ``solution``.

    Grading tests then test grading, whether or not someone forgot `make exercises`
    (test_authoring says so on its own).
    """
    root.mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.is_dir() and not entry.name.startswith(".") and entry.name not in ("solutions", "exercises"):
            (root / entry.name).symlink_to(entry)
    (root / "solutions").mkdir()
    shutil.copy(solution, root / "solutions" / solution.name)
    assert authoring.main(["--course-root", str(root)]) == 0
    return root


def read(path):
    return nbformat.read(path, as_version=4)


def write(nb, path) -> Path:
    Path(path).write_text(authoring.dumps(nb), encoding="utf-8")
    return Path(path)


def cell(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def cells(nb, tag, exercise=None):
    return [c for c in nb.cells if tag in c.metadata.get("tags", [])
            and (exercise is None or c.metadata.get("course", {}).get("exercise") == exercise)]


def exercise_names(nb):
    return list(dict.fromkeys(c.metadata["course"]["exercise"] for c in cells(nb, "check")))


def with_answers(exercise_nb, solution_nb, exercises):
    """A copy of the exercise notebook with the solution's answer cells for ``exercises``."""
    nb = copy.deepcopy(exercise_nb)
    for name in exercises:
        for answer in cells(nb, "answer", name):
            answer.source = cell(solution_nb, answer.id).source
    return nb
