"""A solution notebook's exercises run one at a time, as they are or with a planted mistake.

Every exercise set has the same two tests (tests/test_exercise_NN_checks.py, and
test_exercise_checks_01_07.py for sets 01-07): the solution passes its check, and each plausible
wrong answer (an edit of the solution's own source) fails it.  ``check_tests`` makes both from a
set's ``ExerciseSet`` (or the ``ExerciseSets`` of several sets) and its table of wrong answers.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import nbformat
import pytest

from course_lib import checks

from conftest import REPO


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

    def run(self, namespace, exercise, edit=None):
        """Run exercise's answer (with ``edit`` = (old, new) applied) and its check in ``namespace``."""
        source = self.by_id[self.answers[exercise]]
        if edit is not None:
            old, new = edit
            assert old in source, f"the edit must change the solution: {old!r} not in it"
            source = source.replace(old, new)
        exec(source, namespace)
        exec(self.by_id[self.checks[exercise]], namespace)


class ExerciseSet:
    """One solution notebook's exercises, each run on its own with or without a planted mistake.

    ``solution``: the notebook's name in solutions/ ("08_numba_cpu").
    ``setup``: the cell ids every case runs first (the answers' imports, then the
    course cell the checks use); the answers' setup cell may switch numba to its
    simulator for the notebook (set 09), and this process keeps its own environment.
    ``before``: {exercise: cells it builds on}, each a cell id or an exercise whose
    answer runs first.  ``fresh``: run the setup again for every case (where a setup
    cell holds state the checks draw from, a generator); else once, and each case
    gets a copy of its names.
    """

    def __init__(self, solution, setup, before=None, fresh=False):
        self.path = REPO / "solutions" / f"{solution}.ipynb"
        self.setup, self.before, self.fresh = tuple(setup), dict(before or {}), fresh
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


class ExerciseSets:
    """Several sets' ``ExerciseSet``s as one: exercise "N.x" runs in set N's (sets 01-07 share a test module)."""

    def __init__(self, sets: dict):
        self.sets = dict(sets)

    def of(self, exercise) -> ExerciseSet:
        return self.sets[exercise.split(".")[0]]

    def prepared(self, exercise) -> dict:
        return self.of(exercise).prepared(exercise)

    def run(self, exercise, edit=None, namespace=None):
        self.of(exercise).run(exercise, edit, namespace)


def check_tests(exercises, wrong: dict, *, errors=None, flagged_prints=None):
    """The two tests every exercise set has, for a test module to bind at its top level:

        test_the_solution_passes_its_check, test_a_plausible_wrong_answer_fails_its_check = \\
            check_tests(EXERCISES, WRONG)

    ``exercises``: an ``ExerciseSet`` or ``ExerciseSets``.
    ``wrong``: {exercise: [edit, ...]}, an edit being (old, new), or ((old, new), flagged)
    where a flagged mistake's FAIL output must also hold ``flagged_prints`` (set 09's
    "cudacheck found": a race must be caught by the checker, not by luck in the numbers).
    The solution's answer and check print no FAIL line; a wrong answer's check raises
    ``checks.CheckFailed`` after printing its FAIL line, or, where ``errors`` ({exercise:
    exception types}) allows, another error the answer ran into.  Output of the setup and
    the cells an exercise builds on (a colleague's buggy cell prints FAIL) is left out.
    """
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
