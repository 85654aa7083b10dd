"""Grading: honest submissions score what they earn; broken and tampered ones never pass.

Each graded submission starts a kernel (a few seconds), so the synthetic
submissions are graded in one batch, once, and each test below reads its
own submission's rows from that batch.
"""
from __future__ import annotations

import copy
import csv
import hashlib
import json
from pathlib import Path

import pytest
from nbformat.v4 import new_output

import notebook_factory as nf
from course_lib import grade
from course_lib.answer_scan import Context, parse, scan_answer

REAL_SOLUTIONS = sorted((nf.REPO / "solutions").glob("*.ipynb"))
CELL_TIMEOUT = 10  # seconds; the endless loop below waits this long once
STALL_GRACE = 5    # and the loop that ignores interrupts this much longer

CRASH = "np.lib.stride_tricks.as_strided(np.zeros(1), shape=(10**9,), strides=(10**6,)).sum()"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return nf.make_course(tmp_path_factory.mktemp("course"), {nf.SYNTHETIC: nf.synthetic_solution()})


def _set_answer(nb, exercise, source):
    nf.cells(nb, "answer", exercise)[0].source = source
    return nb


def _submissions(course: Path, folder: Path) -> dict:
    """{name: path} of every kind of submission the grader must handle."""
    solution = nf.read(course / "solutions" / f"{nf.SYNTHETIC}.ipynb")
    exercise = nf.read(course / "exercises" / f"{nf.SYNTHETIC}.ipynb")
    subs = {"solution": solution, "untouched": exercise,
            "partial": nf.with_answers(exercise, solution, ["1.1"])}

    edited = copy.deepcopy(solution)
    nf.cell(edited, "ex11-check").outputs[0]["text"] = "PASS 1.1 scores: all good\n"
    nf.cell(edited, "ex12-check").source = 'print("PASS 1.2 softmax")'
    subs["edited_checks"] = edited

    patches = copy.deepcopy(exercise)
    _set_answer(patches, "1.1", "import course_lib.checks as c\n"
                                'c.check_close = lambda *a, **k: print("PASS")\n'
                                "def scores(q, k):\n    return 0")
    _set_answer(patches, "1.2", "np.exp = lambda x: x\n"
                                "def softmax(x):\n    return x")
    _set_answer(patches, "1.3", "import course_lib\n"
                                "n_bytes = course_lib.attention(q[None, None], k[None, None], k[None, None]).nbytes")
    subs["patches"] = patches

    noisy = copy.deepcopy(solution)
    _set_answer(noisy, "1.1", "def scores(q, k):\n    np.log(np.zeros(1))  # warns on stderr\n    return q @ k.T")
    nf.cell(noisy, "ex11-check").outputs.insert(0, new_output(
        "stream", name="stderr", text="RuntimeWarning: divide by zero encountered in log\n"))
    cut_short = nf.cell(noisy, "ex12-check")
    cut_short.outputs = [cut_short.outputs[0]]
    cut_short.outputs[0]["text"] = "PASS 1.2 soft"  # the kernel died mid-print
    subs["noisy"] = noisy

    some_patched = copy.deepcopy(solution)
    _set_answer(some_patched, "1.1", "def scores(q, k):\n    return checks.reference_scores(q, k)")
    _set_answer(some_patched, "1.2", "np.allclose = lambda *a, **k: True\n" + nf.cell(solution, "ex12-answer").source)
    subs["some_patched"] = some_patched

    hang_crash = copy.deepcopy(solution)
    _set_answer(hang_crash, "1.1", "while True:\n    pass")
    _set_answer(hang_crash, "1.2", f"def softmax(x):\n    return {CRASH}")
    subs["hang_and_crash"] = hang_crash

    unstoppable = copy.deepcopy(solution)
    _set_answer(unstoppable, "1.1", "while True:\n    try:\n        print('still here')\n"
                                    "        sum(range(10**6))\n    except KeyboardInterrupt:\n        pass")
    subs["unstoppable"] = unstoppable

    no_metadata = copy.deepcopy(solution)
    del no_metadata.metadata["course"]
    no_metadata.cells = [c for c in no_metadata.cells if c.id != "ex12-answer"]
    subs["missing_answer"] = no_metadata

    prose = copy.deepcopy(solution)
    nf.cell(prose, "title").source += "\n(I changed the instructions)"
    subs["edited_prose"] = prose

    stranger = nf.synthetic_solution("99_elsewhere")
    for cell in stranger.cells:
        cell.id = "x" + cell.id
    subs["unknown_set"] = stranger

    paths = {name: nf.write(nb, folder / f"{name}.ipynb") for name, nb in subs.items()}
    paths["not_json"] = folder / "not_json.ipynb"
    paths["not_json"].write_bytes(b"\x00 this is { not JSON")
    paths["not_notebook"] = folder / "not_notebook.ipynb"
    paths["not_notebook"].write_text(json.dumps({"cells": "none", "nbformat": 4}))
    paths["old_format"] = folder / "old_format.ipynb"
    paths["old_format"].write_text(json.dumps({"worksheets": [], "nbformat": 3, "metadata": {}, "cells": []}))
    return paths


@pytest.fixture(scope="module")
def batch(course, tmp_path_factory):
    """Grade every submission once; keep the results, the CSV and the files' hashes."""
    folder = tmp_path_factory.mktemp("submissions")
    paths = _submissions(course, folder)
    before = {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in paths.items()}
    out_csv = folder / "grades.csv"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grade, "STALL_GRACE", STALL_GRACE)
        results = list(grade.grade_all(paths.values(), grade.Course(course), CELL_TIMEOUT, jobs=3))
    grade.write_csv(results, out_csv)
    after = {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in paths.items()}
    by_name = {name: result for name, result in zip(paths, results)}
    return {"results": by_name, "paths": paths, "csv": out_csv, "before": before, "after": after}


def statuses(batch, name) -> dict:
    return {row.exercise: row.status for row in batch["results"][name].rows}


def reasons(batch, name) -> dict:
    return {row.exercise: row.reason for row in batch["results"][name].rows}


def points(batch, name) -> tuple:
    return batch["results"][name].total


def test_the_solution_scores_full_points(batch):
    assert statuses(batch, "solution") == {"1.1": "pass", "1.2": "pass", "1.3": "pass"}
    assert points(batch, "solution") == (6, 6)


def test_warnings_and_outputs_cut_short_are_neither_wrong_nor_tampering(batch):
    assert statuses(batch, "noisy") == {"1.1": "pass", "1.2": "pass", "1.3": "pass"}


def test_an_untouched_exercise_scores_nothing_and_fails_everywhere(batch):
    assert statuses(batch, "untouched") == {"1.1": "fail", "1.2": "fail", "1.3": "fail"}
    assert set(reasons(batch, "untouched").values()) == {"not implemented yet"}
    assert points(batch, "untouched") == (0, 6)


def test_a_partial_submission_scores_exactly_the_exercise_it_solved(batch):
    assert statuses(batch, "partial") == {"1.1": "pass", "1.2": "fail", "1.3": "fail"}
    assert points(batch, "partial") == (2, 6)


def test_edited_check_outputs_and_check_cells_are_tampered_and_the_rest_still_graded(batch):
    assert statuses(batch, "edited_checks") == {"1.1": "tampered", "1.2": "tampered", "1.3": "pass"}
    assert "stored output" in reasons(batch, "edited_checks")["1.1"]
    assert "check cell of 1.2 was edited" in reasons(batch, "edited_checks")["1.2"]
    assert points(batch, "edited_checks") == (1, 6)


def test_answers_that_patch_checks_or_numpy_or_call_the_course_are_tampered(batch):
    assert statuses(batch, "patches") == {"1.1": "tampered", "1.2": "tampered", "1.3": "tampered"}
    why = reasons(batch, "patches")
    assert "course_lib" in why["1.1"] and "c.check_close" in why["1.1"]
    assert "np.exp" in why["1.2"]
    assert "course_lib" in why["1.3"]
    assert statuses(batch, "some_patched") == {"1.1": "tampered", "1.2": "tampered", "1.3": "pass"}
    assert "checks from course_lib" in reasons(batch, "some_patched")["1.1"]
    assert "np.allclose" in reasons(batch, "some_patched")["1.2"]


def test_an_endless_loop_times_out_and_a_crash_is_an_error_that_costs_only_its_exercise(batch):
    assert statuses(batch, "hang_and_crash") == {"1.1": "timeout", "1.2": "error", "1.3": "pass"}
    why = reasons(batch, "hang_and_crash")
    assert f"longer than {CELL_TIMEOUT} s" in why["1.1"]
    assert "kernel died" in why["1.2"]  # seen dying, not mistaken for a timeout
    assert points(batch, "hang_and_crash") == (1, 6)


def test_a_loop_that_swallows_interrupts_is_stopped_from_outside_and_scored_timeout(batch):
    assert statuses(batch, "unstoppable") == {"1.1": "timeout", "1.2": "pass", "1.3": "pass"}
    assert "could not be interrupted" in reasons(batch, "unstoppable")["1.1"]


def test_a_deleted_answer_cell_is_invalid_and_the_set_is_found_by_cell_ids(batch):
    result = batch["results"]["missing_answer"]
    assert result.exercise_set == nf.SYNTHETIC
    assert statuses(batch, "missing_answer") == {"1.1": "pass", "1.2": "invalid", "1.3": "pass"}


def test_edited_instructions_taint_every_exercise(batch):
    assert statuses(batch, "edited_prose") == {"1.1": "tampered", "1.2": "tampered", "1.3": "tampered"}
    assert points(batch, "edited_prose") == (0, 6)


@pytest.mark.parametrize("name", ["not_json", "not_notebook", "old_format", "unknown_set"])
def test_files_that_are_not_notebooks_of_this_course_are_invalid(batch, name):
    result = batch["results"][name]
    assert [(r.exercise, r.status, r.points) for r in result.rows] == [("*", "invalid", 0)]
    assert result.rows[0].reason


@pytest.mark.parametrize("cells", [
    [1, "text", None, {"id": ["not", "a", "string"]}, {"id": "ex11-answer", "source": 42}],
    [{"id": "ex11-answer", "cell_type": "code", "source": ["def scores(q, k):\n", 7], "outputs": "x",
      "metadata": "not a dict"}],
])
def test_malformed_cells_never_crash_the_grader(course, tmp_path, cells):
    path = tmp_path / "odd.ipynb"
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": cells,
                                "metadata": {"course": {"exercise_set": nf.SYNTHETIC}}}))
    result = grade.grade(path, grade.Course(course), CELL_TIMEOUT)
    assert result.total[0] == 0 and {r.status for r in result.rows} <= {"invalid", "tampered"}


def test_submissions_are_byte_identical_after_grading(batch):
    assert batch["before"] == batch["after"]


def test_the_csv_has_one_row_per_exercise_of_every_submission(batch):
    with open(batch["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["submission", "exercise_set", "exercise", "status", "points", "max_points"]
    assert len({r["submission"] for r in rows}) == len(batch["paths"])
    solution = [r for r in rows if r["submission"].endswith("solution.ipynb")]
    assert [(r["exercise"], r["status"], r["points"], r["max_points"]) for r in solution] == [
        ("1.1", "pass", "2", "2"), ("1.2", "pass", "3", "3"), ("1.3", "pass", "1", "1")]


def test_the_table_is_plain_deterministic_text(batch):
    text = grade.format_result(batch["results"]["partial"])
    assert text.splitlines()[1].split() == ["exercise", "status", "points", "reason"]
    assert "0x" not in text and text == grade.format_result(batch["results"]["partial"])
    assert text.splitlines()[-1].split() == ["total", "2", "/", "6"]


def test_the_command_line_grades_several_submissions_into_one_csv(course, tmp_path, capsys):
    exercise = course / "exercises" / f"{nf.SYNTHETIC}.ipynb"
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{}")
    out = tmp_path / "grades.csv"
    assert grade.main([str(bad), str(exercise), str(bad), "--csv", str(out),
                       "--course-root", str(course), "--timeout", str(CELL_TIMEOUT)]) == 0
    text = capsys.readouterr().out
    assert text.count("invalid") == 2 and "graded 3 submissions: 0 / 6 points in all" in text
    assert len(out.read_text().splitlines()) == 1 + 1 + 3 + 1


def test_help_explains_the_statuses(capsys):
    with pytest.raises(SystemExit) as exit:
        grade.main(["--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    for word in ("--csv", "--timeout", "--course-root", "tampered", "invalid", "never modified"):
        assert word in text


@pytest.mark.parametrize("argv", [[], ["x.ipynb", "--timeout", "0"], ["x.ipynb", "--course-root", "/nonexistent"]])
def test_usage_errors_exit_nonzero(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        grade.main(argv)
    assert exit.value.code == 2


# -- the static scan of answer cells ----------------------------------------------

CONTEXT = Context.of(
    other_cells=["import numpy as np\nfrom course_lib import checks\nfrom course_lib.reference import attention_reference\n"
                 "q = np.ones((2, 3))\nscale = 0.5\n%matplotlib inline"],
    check_cells=["cases = [checks.readonly(q)]\nfor case in cases:\n"
                 "    checks.check_close('x', my_attention(case, scale), attention_reference(case))"],
    answer_cells=[])

HONEST = [
    "def my_attention(q, scale):\n    q = q * scale\n    s = q @ q.T\n    s = s - s.max(-1, keepdims=True)\n"
    "    p = np.exp(s)\n    return p / p.sum(-1, keepdims=True) @ q",
    "import math\nfrom functools import reduce\nimport numpy as np\nfrom numba import njit\n\n"
    "@njit\ndef f(x):\n    out = np.empty_like(x)\n    out[0] = math.exp(x[0])\n    return out",
    "from dataclasses import dataclass\n@dataclass\nclass Tile:\n    rows: int\n    def area(self):\n        return self.rows",
    "exp = np.exp\nn_bytes = 8 * q.shape[0]\nresult = [i * i for i in range(3)]",
    "def check(cu):\n    if cu.ndim != 1:\n        raise TypeError(f'got {type(cu).__name__}')",
    "class Acc(dict):\n    def __init__(self):\n        super().__init__()\n    def __len__(self):\n        return 0",
    "def kind(cu):\n    return getattr(cu, 'dtype', None)",
    "def area(cases):\n    return [c * 2 for c in cases]",  # a parameter named like a check's global
    "def broken(:\n    pass",  # not Python: it runs, fails, and scores error, not tampered
]

TAMPERING = [
    ("np.exp = lambda x: x", "np.exp"),
    ("e = np.linalg\ne.norm = None", "e.norm"),
    ("del np.sum", "np.sum"),
    ("import course_lib.checks as c\nc.check_close = print", "course_lib"),
    ("checks.check_close = print", "checks"),
    ("def my_attention(q, scale):\n    return attention_reference(q)", "attention_reference"),
    ("from course_lib import attention", "course_lib"),
    ("import course_lib.kernels", "course_lib"),
    ("import os\nos.system('true')", "imports os"),
    ("import importlib", "imports importlib"),
    ("setattr(np, 'exp', abs)", "setattr"),
    ("exec('x = 1')", "exec"),
    ("f = eval", "eval"),
    ("x = np.__dict__", ".__dict__"),
    ("x = getattr(np, '__dict__')", "'__dict__'"),
    ("__builtins__.len = None", "__builtins__"),
    ("f = np.sum\nf.__name__ = 'x'", ".__name__"),
    ("g = scores.__globals__", ".__globals__"),
    ("g = globals()", "globals"),
    ("data = open('/etc/passwd').read()", "open"),
    ("%timeit 1 + 1", "IPython"),
    ("!ls", "IPython"),
    ("q = np.zeros((2, 3))", "rebinds q"),
    ("q[:] = 0", "modifies q"),
    ("scale *= 0", "rebinds scale"),
    ("np = None", "rebinds the imported name np"),
    ("def attention_reference(q):\n    return q", "redefines attention_reference"),
    ("def f(a):\n    a.setflags(write=True)", "flags"),
    ("def f(a):\n    a.flags['WRITEABLE'] = True", "flags"),
    ("def f(a):\n    getattr(a, 'setf' + 'lags')(write=True)", "getattr"),
    ("def f(a):\n    getattr(a, 'flags')['WRITEABLE'] = True", "flags"),
    ("def f(a):\n    global n_cases\n    n_cases = 0", "global"),
    ("def my_attention(q, scale):\n    cases.clear()\n    return q", "reads cases"),
]


@pytest.mark.parametrize("source", HONEST)
def test_honest_answers_pass_the_scan(source):
    assert scan_answer(source, CONTEXT) == []


@pytest.mark.parametrize("source, reason", TAMPERING)
def test_tampering_answers_are_caught_by_the_scan(source, reason):
    found = scan_answer(source, CONTEXT)
    assert found and any(reason in r for r in found), found


@pytest.mark.parametrize("path", REAL_SOLUTIONS, ids=lambda p: p.stem)
def test_the_real_solutions_answer_cells_pass_the_scan(path):
    nb = nf.read(path)
    answers = [c.source for c in nf.cells(nb, "answer")]
    checks = [c.source for c in nf.cells(nb, "check")]
    others = [c.source for c in nb.cells if c.cell_type == "code"
              and not {"answer", "check"} & set(c.metadata.get("tags", []))]
    context = Context.of(others, checks, answers)
    for cell in nf.cells(nb, "answer"):
        assert parse(cell.source) is not None, f"answer cell {cell.id} is not plain Python"
        assert scan_answer(cell.source, context) == [], f"answer cell {cell.id}"


# -- the real exercise sets ----------------------------------------------------------

@pytest.mark.parametrize("path", REAL_SOLUTIONS, ids=lambda p: p.stem)
def test_real_solution_scores_full_points_and_a_partial_one_exactly_its_part(path, tmp_path):
    """The solution as a submission passes everything; with only the first answer, only that passes.

    (The untouched real exercises fail at every check: test_exercises_fail_only_at_answers.)
    """
    root = nf.course_around(tmp_path / "course", path)
    solution = nf.read(path)
    exercise = nf.read(root / "exercises" / path.name)
    names = nf.exercise_names(solution)
    subs = {"solution": nf.write(solution, tmp_path / "solution.ipynb"),
            "partial": nf.write(nf.with_answers(exercise, solution, names[:1]), tmp_path / "partial.ipynb")}
    before = {k: p.read_bytes() for k, p in subs.items()}
    course = grade.Course(root)
    results = dict(zip(subs, grade.grade_all(subs.values(), course, 300, jobs=2)))
    first_points = nf.cells(solution, "check", names[0])[0].metadata["course"]["points"]
    total = sum(c.metadata["course"]["points"] for c in nf.cells(solution, "check"))

    assert {r.exercise: r.status for r in results["solution"].rows} == {n: "pass" for n in names}, \
        grade.format_result(results["solution"])
    assert results["solution"].total == (total, total)
    assert [r.status for r in results["partial"].rows] == ["pass"] + ["fail"] * (len(names) - 1), \
        grade.format_result(results["partial"])
    assert results["partial"].total == (first_points, total)
    assert before == {k: p.read_bytes() for k, p in subs.items()}


# An answer that writes into its inputs: zeroing q, k, v in place made the expected
# value the check computes afterwards from the same arrays zero too, so zeros of the
# right shape and dtype passed, with the very PASS lines of the solution (1.1 and 1.3
# scored pass against the check cells before they used checks.readonly).  Now the
# check cells hand answers read-only arrays, and the write itself raises.
ZEROING_ANSWERS = {
    "1.1": "def scores(q, k, scale=None):\n    q[...] = 0\n    k[...] = 0\n"
           "    return np.zeros(q.shape[:-1] + k.shape[-2:-1], dtype=q.dtype)",
    "1.3": "def naive_attention(q, k, v, causal=False, scale=None):\n    q[...] = 0\n    k[...] = 0\n    v[...] = 0\n"
           "    return np.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)",
}


def grade_zeroing_submission(solution_path, tmp_path) -> dict:
    """{exercise: (status, reason)} of set 01's solution with ZEROING_ANSWERS in place of 1.1 and 1.3."""
    root = nf.course_around(tmp_path / "course", solution_path)
    solution = nf.read(solution_path)
    exercise = nf.read(root / "exercises" / solution_path.name)
    submission = nf.with_answers(exercise, solution, nf.exercise_names(solution))
    for name, source in ZEROING_ANSWERS.items():
        _set_answer(submission, name, source)
    path = nf.write(submission, tmp_path / "zeroing.ipynb")
    result = grade.grade(path, grade.Course(root), 300)
    return {row.exercise: (row.status, row.reason) for row in result.rows}


def test_an_answer_that_zeroes_its_inputs_in_place_does_not_pass(tmp_path):
    rows = grade_zeroing_submission(nf.REPO / "solutions" / "01_naive_attention.ipynb", tmp_path)
    status = {name: s for name, (s, _) in rows.items()}
    for name in ("1.1", "1.3", "1.4"):  # 1.4's solution calls the zeroing naive_attention
        assert status[name] in ("fail", "error"), rows
    assert [status[name] for name in ("1.2", "1.5", "1.6")] == ["pass"] * 3, rows
