"""An untouched exercise notebook fails at its check cells (and stubbed answer cells), nowhere else.

That is what makes nbval a grader: a learner who changes nothing scores
nothing, and a failure elsewhere (a setup cell, a plot after the checks) would
mean the student copy does not run the way the solution does.  Each notebook
runs under nbval in a subprocess, with course_lib.grading.nbval_record saying which
cells failed and why.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import notebook_factory as nf
from conftest import REPO

REAL_EXERCISES = sorted((REPO / "exercises").glob("*.ipynb"))


def cell_outcomes(notebook: Path, records: Path) -> dict:
    """{cell id: end record} from running ``notebook`` under nbval with the course's sanitize rules."""
    cmd = [sys.executable, "-m", "pytest", str(notebook), "-p", "course_lib.grading.nbval_record", "-p", "nbval.plugin",
           "-p", "no:cacheprovider", "--nbval", "--nbval-current-env", "--nbval-cell-timeout=600",
           "--nbval-sanitize-with", str(REPO / "tests" / "sanitize.cfg"),
           "--cell-records", str(records), "-q", "--tb=no", "--color=no", "-o", "addopts="]
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTEST_ADDOPTS="")
    run = subprocess.run(cmd, cwd=notebook.parent, env=env, capture_output=True, text=True, timeout=1800)
    lines = [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else []
    ends = {r["id"]: r for r in lines if r["event"] == "end"}
    assert ends, f"nbval recorded nothing:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return ends


def assert_fails_only_at_answers(notebook: Path, records: Path):
    nb = nf.read(notebook)
    outcomes = cell_outcomes(notebook, records)
    answers = {c.id for c in nf.cells(nb, "answer")}
    checks = {c.id for c in nf.cells(nb, "check")}
    code = [c.id for c in nb.cells if c.cell_type == "code"]
    assert set(outcomes) == set(code), "every code cell ran"
    failed = {i for i, r in outcomes.items() if r["outcome"] == "failed"}
    assert failed - answers - checks == set(), {i: outcomes[i] for i in failed - answers - checks}
    assert checks <= failed, f"check cells that pass on an untouched stub: {sorted(checks - failed)}"
    for cell_id in failed:
        record = outcomes[cell_id]
        assert record["kind"] == "exception", record  # not a timeout, a crash or an output mismatch
        if cell_id in answers:
            assert record["ename"] == "NotImplementedError", record


@pytest.mark.parametrize("notebook", REAL_EXERCISES, ids=lambda p: p.stem)
def test_untouched_exercise_fails_only_at_answer_and_check_cells(notebook, tmp_path):
    assert_fails_only_at_answers(notebook, tmp_path / "records.jsonl")


def test_the_rule_holds_for_the_synthetic_exercise_set(tmp_path):
    """Keeps the rule (and the recording plugin) tested while exercises/ is still empty."""
    root = nf.make_course(tmp_path / "course", {nf.SYNTHETIC: nf.synthetic_solution()})
    assert_fails_only_at_answers(root / "exercises" / f"{nf.SYNTHETIC}.ipynb", tmp_path / "records.jsonl")


def test_solved_exercise_passes_nbval_against_its_kept_verdicts(tmp_path):
    """The other half of nbval as a grader: the set's answers in, the kept verdicts as the expected outputs,
    and every cell passes.  (The exercise shows no verdict; its check cells keep them in
    metadata.course.expected_outputs, the solution's own passing output.)"""
    name = "01_naive_attention.ipynb"
    exercise, solution = nf.read(REPO / "exercises" / name), nf.read(REPO / "solutions" / name)
    nb = nf.with_answers(exercise, solution, nf.exercise_names(solution))
    for check in nf.cells(nb, "check"):
        assert check.outputs == [] and check.metadata.course.expected_outputs
        check.outputs, check.execution_count = check.metadata.course.expected_outputs, 1  # as if run
    outcomes = cell_outcomes(nf.write(nb, tmp_path / name), tmp_path / "records.jsonl")
    assert {i: r for i, r in outcomes.items() if r["outcome"] != "passed"} == {}
