"""An exercise set's two tests swept over salted gradings, as the grader draws them.

The grader (``course_lib.grading.pipeline.fresh_inputs``) draws every ``np.random.default_rng(seed)``
of a set's course cells from (seed, salt): the same cases on new values.  A wrong answer that fails
on the published inputs but passes on some salt scores points; an honest answer that passes on the
published inputs but fails (or raises) on some salt loses them.  ``salted_check_tests`` makes the
two tests of ``exercise_checks.check_tests`` run on every salt of ``SALTS`` (None: the published
inputs), the setup cells drawn afresh under each.
"""
from __future__ import annotations

import pytest

from course_lib import checks
from course_lib.grading.pipeline import fresh_inputs

SALTS = (None, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144)


def run_salted(exercises, exercise, salt, edit=None, capsys=None):
    """Run ``exercise`` (``edit`` applied) with its setup, the cells it builds on and its check, all
    drawing from ``salt``; with ``capsys``, what the setup and those cells print (a colleague's
    buggy cell prints FAIL) is dropped.  Returns the namespace it ran in."""
    one = exercises.of(exercise) if hasattr(exercises, "of") else exercises
    with fresh_inputs(salt):
        namespace = one._run_setup()
        for item in one.before.get(exercise, ()):
            exec(one.cells.by_id[one.cells.answers.get(item, item)], namespace)
        if capsys is not None:
            capsys.readouterr()
        one.cells.run(namespace, exercise, edit)
    return namespace


def salted_check_tests(exercises, wrong: dict, *, errors=None, salts=SALTS):
    """(test_the_solution_passes_on_every_salt, test_a_plausible_wrong_answer_fails_on_every_salt),
    for a test module to bind at its top level; ``wrong`` and ``errors`` as ``check_tests``'s."""
    errors = errors or {}
    cases = [(exercise, edit) for exercise, edits in wrong.items() for edit in edits]
    ids = [f"{exercise}-{i}" for exercise, edits in wrong.items() for i in range(len(edits))]

    @pytest.mark.parametrize("exercise", sorted(wrong))
    def test_the_solution_passes_on_every_salt(exercise, capsys):
        for salt in salts:
            run_salted(exercises, exercise, salt, capsys=capsys)
            out = capsys.readouterr().out
            assert "FAIL" not in out, f"salt {salt}:\n{out}"

    @pytest.mark.parametrize("exercise,edit", cases, ids=ids)
    def test_a_plausible_wrong_answer_fails_on_every_salt(exercise, edit, capsys):
        for salt in salts:
            try:
                run_salted(exercises, exercise, salt, edit, capsys)
            except checks.CheckFailed:
                assert "FAIL" in capsys.readouterr().out
                continue
            except errors.get(exercise, ()):
                capsys.readouterr()
                continue
            pytest.fail(f"the wrong answer {edit!r} passes {exercise}'s check on salt {salt}")

    return test_the_solution_passes_on_every_salt, test_a_plausible_wrong_answer_fails_on_every_salt
