"""Small course folders for the authoring and grading tests.

``synthetic_solution()`` is a three-exercise solution notebook that follows
CONTRIBUTING.md: a function answer (1.1), a function with two marker regions
(1.2) and a top-level value (1.3), each followed by its check cell.  It runs
in a second, so the grading tests can afford many kernels.  ``make_course``
lays out ``solutions/``, executes them and writes ``exercises/`` the way
``make notebooks`` does.  ``ExerciseSet`` and ``check_tests`` run a real
solution's exercises with planted mistakes (tests/test_exercise_NN_checks.py).
"""
from __future__ import annotations

import copy
import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_lib.grading import authoring

REPO = Path(__file__).resolve().parent.parent
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


# -- running one exercise of a real solution, with a planted mistake ----------------------

@dataclass(frozen=True)
class SolutionCells:
    """A solution notebook's code cells by id, and its answer and check cell ids by exercise."""

    by_id: dict
    answers: dict
    checks: dict

    @classmethod
    def read(cls, path):
        nb = nbformat.read(path, as_version=4)
        by_exercise = {tag: {cell.metadata["course"]["exercise"]: cell.id for cell in nb.cells
                             if tag in cell.metadata.get("tags", [])} for tag in ("answer", "check")}
        return cls({cell.id: cell.source for cell in nb.cells if cell.cell_type == "code"},
                   by_exercise["answer"], by_exercise["check"])

    def run(self, namespace, exercise, edit=None, before=()):
        """Run ``before`` cells, exercise's answer (with ``edit`` = (old, new) applied) and its check in ``namespace``."""
        for cell_id in before:  # cells the exercise builds on
            exec(self.by_id[cell_id], namespace)
        source = self.by_id[self.answers[exercise]]
        if edit is not None:
            old, new = edit
            assert old in source, f"the edit must change the solution: {old!r} not in it"
            source = source.replace(old, new)
        exec(source, namespace)
        exec(self.by_id[self.checks[exercise]], namespace)


class ExerciseSet:
    """One solution notebook's exercises, each run on its own with or without a planted mistake.

    ``setup``: the cell ids every case runs first (the answers' imports, then the
    course cell the checks use); the answers' setup cell may switch numba to its
    simulator for the notebook (set 09), and this process keeps its own environment.
    ``before``: {exercise: cells it builds on}, each a cell id or an exercise whose
    answer runs first.  ``fresh``: run the setup again for every case (where a setup
    cell holds state the checks draw from, a generator); else once, and each case
    gets a copy of its names.
    """

    def __init__(self, path, setup, before=None, fresh=False):
        self.path, self.setup, self.before, self.fresh = Path(path), tuple(setup), dict(before or {}), fresh
        self._namespace = None

    @functools.cached_property
    def cells(self) -> SolutionCells:
        return SolutionCells.read(self.path)

    def _run_setup(self):
        namespace, keep = {}, os.environ.get("NUMBA_ENABLE_CUDASIM")
        for cell_id in self.setup:
            try:
                exec(self.cells.by_id[cell_id], namespace)
            finally:
                if keep is None:
                    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
                else:
                    os.environ["NUMBA_ENABLE_CUDASIM"] = keep
        return namespace

    def namespace(self) -> dict:
        """The names the setup cells leave, fresh or a copy of the first run's."""
        if self.fresh:
            return self._run_setup()
        if self._namespace is None:
            self._namespace = self._run_setup()
        return dict(self._namespace)

    def prepared(self, exercise) -> dict:
        """A namespace with the setup and the cells ``exercise`` builds on run."""
        namespace = self.namespace()
        for item in self.before.get(exercise, ()):
            exec(self.cells.by_id[self.cells.answers.get(item, item)], namespace)
        return namespace

    def run(self, exercise, edit=None, namespace=None):
        """``exercise``'s answer (``edit`` = (old, new) applied) and its check, in ``namespace`` or a prepared one."""
        self.cells.run(self.prepared(exercise) if namespace is None else namespace, exercise, edit)


def check_tests(exercises: ExerciseSet, wrong: dict, *, errors=None, flagged_prints=None):
    """The two tests every exercise set has, for a test module to bind at its top level:

        test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check = \\
            nf.check_tests(EXERCISES, WRONG)

    ``wrong``: {exercise: [edit, ...]}, an edit being (old, new), or ((old, new), flagged)
    where a flagged mistake's FAIL output must also hold ``flagged_prints`` (set 09's
    "cudacheck found": a race must be caught by the checker, not by luck in the numbers).
    The solution's answer and check print no FAIL line; a wrong answer's check raises
    ``checks.CheckFailed`` after printing its FAIL line, or, where ``errors`` ({exercise:
    exception types}) allows, another error the answer ran into.  Output of the setup and
    the cells an exercise builds on (a colleague's buggy cell prints FAIL) is left out.
    """
    import pytest

    from course_lib import checks

    errors = errors or {}
    cases = [(exercise, edit) for exercise, edits in wrong.items() for edit in edits]
    ids = [f"{exercise}-{i}" for exercise, edits in wrong.items() for i in range(len(edits))]

    @pytest.mark.parametrize("exercise", sorted(wrong))
    def test_the_solution_passes_its_check(exercise, capsys):
        namespace = exercises.prepared(exercise)
        capsys.readouterr()
        exercises.run(exercise, namespace=namespace)
        assert "FAIL" not in capsys.readouterr().out

    @pytest.mark.parametrize("exercise,edit", cases, ids=ids)
    def test_a_plausible_wrong_answer_fails_its_check(exercise, edit, capsys):
        edit, flagged = edit if isinstance(edit[0], tuple) else (edit, False)
        namespace = exercises.prepared(exercise)
        capsys.readouterr()
        with pytest.raises((checks.CheckFailed, *errors.get(exercise, ()))) as caught:
            exercises.run(exercise, edit, namespace=namespace)
        out = capsys.readouterr().out
        if caught.type is checks.CheckFailed:
            assert "FAIL" in out, out
        if flagged:
            assert flagged_prints in out, out

    return test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check
