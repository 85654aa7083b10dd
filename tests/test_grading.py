"""Grading: honest submissions score what they earn; broken ones never pass; attacks score nothing
and change nothing outside their own sandbox.

Each submission starts a sandbox (a fraction of a second) and its checks run in
the grader, so the synthetic submissions are graded in one batch, once, and
each test below reads its own submission's rows from that batch.
"""
from __future__ import annotations

import copy
import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_lib import checks
from course_lib.grading import cli, pipeline, sandbox
from course_lib.grading.submission import Course

import notebook_factory as nf
from conftest import REPO

REAL_SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))
TIMEOUT = 5  # seconds per exercise's answer cells, and again per check

pytestmark = pytest.mark.needs_sandbox

CRASH = "np.lib.stride_tricks.as_strided(np.zeros(1), shape=(10**9,), strides=(10**6,)).sum()"
MARKER = f"course-grade-attack-{os.getpid()}"  # in the command line of anything an attack leaves running


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return nf.make_course(tmp_path_factory.mktemp("course"), {nf.SYNTHETIC: nf.synthetic_solution()})


def _set_answer(nb, exercise, source):
    nf.cells(nb, "answer", exercise)[0].source = source
    return nb


def _solution_with(course, answers: dict):
    nb = nf.read(course / "solutions" / f"{nf.SYNTHETIC}.ipynb")
    for name, source in answers.items():
        _set_answer(nb, name, source)
    return nb


# -- what every attack below tries; each must score no pass ------------------------------

def attacks(course: Path, victim_pid: int) -> dict:
    """{name: {exercise: answer source}}: a student who wants marks without the work."""
    sol = course / "solutions" / f"{nf.SYNTHETIC}.ipynb"
    checks_py = REPO / "course_lib" / "checks.py"
    site = Path(np.__file__).resolve().parent.parent
    return {
        # the course's answers, read from disk and run
        "exec_solutions": {"1.1": f"import json\nnb = json.load(open({str(sol)!r}))\n"
                                  "for c in nb['cells']:\n    if 'answer' in c['metadata'].get('tags', []):\n"
                                  "        exec(''.join(c['source']))"},
        # the course's kernels and checks through sys.modules, reached from an allowed module
        "sys_modules": {"1.1": "import dataclasses\nref = dataclasses.sys.modules['course_lib.core.reference']\n"
                               "def scores(q, k):\n    return ref.attention_scores(q, k)",
                        "1.2": "import dataclasses\nc = dataclasses.sys.modules['course_lib.checks']\n"
                               "c.check_close = lambda *a, **k: print('PASS')\ndef softmax(x):\n    return x"},
        "import_course_lib": {"1.1": "from course_lib.core.reference import attention_scores as scores"},
        # values that read the expected answer from the caller's frame
        "frame_reading": {"1.1": "import sys\nclass Sneaky:\n"
                                 "    def __array__(self, *a, **k):\n"
                                 "        f = sys._getframe(1)\n"
                                 "        while f and 'expected' not in f.f_locals:\n            f = f.f_back\n"
                                 "        return f.f_locals['expected']\n"
                                 "    __float__ = __array__\n"
                                 "def scores(q, k):\n    return Sneaky()",
                          "1.3": "import sys\nclass N(float):\n    pass\nn_bytes = N(160)"},
        "frame_walk": {"1.1": "import sys\ndef scores(q, k):\n    f = sys._getframe()\n    while f:\n"
                              "        for v in f.f_locals.values():\n"
                              "            if isinstance(v, np.ndarray) and v.shape == (4, 5) and v is not q:\n"
                              "                return v\n        f = f.f_back\n    return np.zeros((4, 5))"},
        "subclass_and_objects": {"1.1": "def scores(q, k):\n    return np.asmatrix(q @ k.T)",
                                 "1.2": "def softmax(x):\n    return np.array([object()] * 3)"},
        # lines that look like verdicts, and bytes on the grader's channel
        "forged_output": {"1.1": "print('PASS 1.1 scores: 4x5 float64 within atol 1e-10, rtol 1e-09')\n"
                                 "def scores(q, k):\n    return 0",
                          "1.2": "import os, sys\nos.write(int(sys.argv[2]), b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02{}')\n"
                                 "def softmax(x):\n    return x",
                          "1.3": "import os, sys, json\n"
                                 "h = json.dumps({'seq': 3, 'ok': True, 'value': 160, 'sizes': []}).encode()\n"
                                 "os.write(int(sys.argv[2]), len(h).to_bytes(8, 'big') + h)\nn_bytes = 0"},
        "prompt_prefix": {"1.1": "In [1]: q = q * 0\ndef scores(q, k):\n    return 0"},
        # harm to the instructor: the checkout, .venv, other processes
        "poison_checkout": {"1.1": f"open({str(checks_py)!r}, 'a').write('\\nPOISON = 1\\n')\n"
                                   "def scores(q, k):\n    return q @ k.T + 1",
                            "1.2": f"open({str(course / 'exercises' / (nf.SYNTHETIC + '.ipynb'))!r}, 'w').write('{{}}')"},
        "pth_in_venv": {"1.1": f"open({str(site / 'zz_attack.pth')!r}, 'w').write('import os')\n"
                               "def scores(q, k):\n    return q @ k.T + 1"},
        "setsid_child": {"1.1": "import subprocess, sys\n"
                                f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # {MARKER}'],"
                                " start_new_session=True)\n"
                                "import os\nif os.fork() == 0:\n    os.setsid()\n"
                                "    os.execv(sys.executable,"
                                f" [sys.executable, '-c', 'import time; time.sleep(600)  # {MARKER}'])\n"
                                "def scores(q, k):\n    return q @ k.T + 1"},
        "kill_others": {"1.1": f"import os, signal\nfor pid in ({victim_pid}, -{victim_pid}, -1, 1):\n"
                               "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
                               f"print({victim_pid})\ndef scores(q, k):\n    return q @ k.T + 1"},
        "network": {"1.1": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\n"
                           "def scores(q, k):\n    return q @ k.T"},
        "fork_bomb": {"1.1": "import os, time\nkids = 0\nwhile kids < 5000:\n    pid = os.fork()\n"
                             "    if pid == 0:\n        time.sleep(600)\n        os._exit(0)\n    kids += 1"},
        "memory_bomb": {"1.1": "hog = np.ones(10**10)\ndef scores(q, k):\n    return q @ k.T"},
        "output_flood": {"1.1": "import sys\nwhile True:\n    sys.stdout.write('x' * 10**6)"},
        # 400 MB: over the 256 MiB message limit, well under memory
        "huge_return": {"1.1": "def scores(q, k):\n    return np.zeros(5 * 10**7)"},
        "swallow_everything": {"1.1": "def scores(q, k):\n    while True:\n        try:\n            time.sleep(1)\n"
                                      "        except BaseException:\n            pass\nimport time"},
    }


def _submissions(course: Path, folder: Path, victim_pid: int) -> dict:
    """{name: path} of every kind of submission the grader must handle."""
    solution = nf.read(course / "solutions" / f"{nf.SYNTHETIC}.ipynb")
    exercise = nf.read(course / "exercises" / f"{nf.SYNTHETIC}.ipynb")
    subs = {"solution": solution, "untouched": exercise,
            "partial": nf.with_answers(exercise, solution, ["1.1"])}

    edited = copy.deepcopy(solution)
    nf.cell(edited, "ex11-check").outputs[0]["text"] = "PASS 1.1 scores: all good\n"
    nf.cell(edited, "ex12-check").source = 'print("PASS 1.2 softmax")'
    subs["edited_checks"] = edited

    noisy = copy.deepcopy(solution)
    _set_answer(noisy, "1.1", "def scores(q, k):\n    np.log(np.zeros(1))  # warns on stderr\n    return q @ k.T")
    nf.cell(noisy, "ex11-check").outputs.insert(0, new_output(
        "stream", name="stderr", text="RuntimeWarning: divide by zero encountered in log\n"))
    cut_short = nf.cell(noisy, "ex12-check")
    cut_short.outputs = [cut_short.outputs[0]]
    cut_short.outputs[0]["text"] = "PASS 1.2 soft"  # the kernel died mid-print
    subs["noisy"] = noisy

    # honest code that a static scan would call tampering
    subs["honest_odd"] = _solution_with(course, {
        "1.1": "import os\nrng = np.random.default_rng(0)\nnoise = rng.standard_normal(3)\n"
               "def scores(q, k):\n    return q @ k.T\nif __name__ == '__main__':\n    assert vars(np.random)",
        "1.2": "import importlib\nfrom types import SimpleNamespace\nns = SimpleNamespace(a=1)\nassert vars(ns)\n"
               "def softmax(x):\n    e = np.exp(x - x.max(axis=-1, keepdims=True))\n    return e / e.sum(-1, keepdims=True)",
    })
    # what a notebook accepts: display(...), numpy integers as slice bounds, a Fraction
    subs["honest_numpy_types"] = _solution_with(course, {
        "1.1": "def scores(q, k):\n    display(q.shape)\n"
               "    return np.concatenate([q[i:i + np.int64(1)] @ k.T for i in np.arange(q.shape[0])])",
        "1.3": "from fractions import Fraction\nn_bytes = Fraction(320, 2)\ndisplay(n_bytes)",
    })
    subs["monkeypatch_numpy"] = _solution_with(course, {"1.2": "np.exp = lambda x: x\nnp.allclose = lambda *a, **k: True\n"
                                                               "def softmax(x):\n    return x"})

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
    nf.cell(prose, "title").source += "\n(my notes on the instructions)"
    subs["edited_prose"] = prose

    extra = copy.deepcopy(solution)
    _set_answer(extra, "1.1", "def scores(q, k):\n    return helper(q, k)")
    extra.cells.insert(4, new_code_cell("def helper(q, k):\n    return q @ k.T", id="mine"))
    subs["extra_cell"] = extra

    stranger = nf.synthetic_solution("99_elsewhere")
    for cell in stranger.cells:
        cell.id = "x" + cell.id
        cell.metadata.pop("course", None)
        cell.metadata.pop("tags", None)
    subs["unknown_set"] = stranger

    for name, answers in attacks(course, victim_pid).items():
        subs["attack_" + name] = copy.deepcopy(exercise)
        for ex, source in answers.items():
            _set_answer(subs["attack_" + name], ex, source)

    paths = {name: nf.write(nb, folder / f"{name}.ipynb") for name, nb in subs.items()}
    no_ids = json.loads(paths["solution"].read_text())
    no_ids["nbformat_minor"] = 4
    for cell in no_ids["cells"]:
        cell.pop("id", None)
    paths["no_ids"] = folder / "no_ids.ipynb"
    paths["no_ids"].write_text(json.dumps(no_ids))
    paths["not_json"] = folder / "not_json.ipynb"
    paths["not_json"].write_bytes(b"\x00 this is { not JSON")
    paths["not_notebook"] = folder / "not_notebook.ipynb"
    paths["not_notebook"].write_text(json.dumps({"cells": "none", "nbformat": 4}))
    paths["old_format"] = folder / "old_format.ipynb"
    paths["old_format"].write_text(json.dumps({"worksheets": [], "nbformat": 3, "metadata": {}, "cells": []}))
    return paths


def _tree_digest(*roots) -> dict:
    """{path: sha256} of every file under ``roots`` (the course, the package, site-packages' top level)."""
    out = {}
    for root in roots:
        root = Path(root)
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        for p in files:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _left_running() -> list:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and MARKER.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def batch(course, tmp_path_factory):
    """Grade every submission once; keep the results, the CSV, the files' hashes and a bystander process."""
    folder = tmp_path_factory.mktemp("submissions")
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    paths = _submissions(course, folder, victim.pid)
    site = Path(np.__file__).resolve().parent.parent
    watched = (course, REPO / "course_lib", REPO / "solutions", REPO / "exercises")
    before = _tree_digest(folder, *watched)
    site_before = sorted(os.listdir(site))
    out_csv = folder / "grades.csv"
    try:
        listed = list(paths.values()) + [paths["solution"]]  # a path given twice is graded once
        results = pipeline.grade_all(listed, Course(course), pipeline.Options(timeout=TIMEOUT), jobs=2)
        time.sleep(0.5)
        survivors = _left_running()
        victim_alive = victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
        for pid in _left_running():
            os.kill(pid, signal.SIGKILL)
    after = _tree_digest(folder, *watched)
    cli.write_csv(results, out_csv)
    by_name = {name: result for name, result in zip(paths, results)}
    return {"results": by_name, "all": results, "paths": paths, "csv": out_csv, "before": before, "after": after,
            "site": (site_before, sorted(os.listdir(site))), "survivors": survivors, "victim_alive": victim_alive}


def statuses(batch, name) -> dict:
    return {row.exercise: row.status for row in batch["results"][name].rows}


def reasons(batch, name) -> dict:
    return {row.exercise: row.reason for row in batch["results"][name].rows}


def points(batch, name) -> tuple:
    return batch["results"][name].total


# -- honest work ---------------------------------------------------------------------

def test_the_solution_scores_full_points(batch):
    assert statuses(batch, "solution") == {"1.1": "pass", "1.2": "pass", "1.3": "pass"}
    assert points(batch, "solution") == (6, 6)


def test_warnings_and_cut_outputs_are_neither_wrong_nor_tampering(batch):
    assert statuses(batch, "noisy") == {"1.1": "pass", "1.2": "pass", "1.3": "pass"}


def test_an_untouched_exercise_scores_nothing(batch):
    assert statuses(batch, "untouched") == {"1.1": "fail", "1.2": "fail", "1.3": "fail"}
    assert set(reasons(batch, "untouched").values()) == {"not implemented yet"}
    assert points(batch, "untouched") == (0, 6)


def test_a_partial_submission_scores_exactly_what_it_solved(batch):
    assert statuses(batch, "partial") == {"1.1": "pass", "1.2": "fail", "1.3": "fail"}
    assert points(batch, "partial") == (2, 6)


def test_seeded_rngs_main_guards_vars_imports_are_honest_work(batch):
    assert statuses(batch, "honest_odd") == {"1.1": "pass", "1.2": "pass", "1.3": "pass"}


def test_display_numpy_slices_and_fractions_are_honest_work(batch):
    assert statuses(batch, "honest_numpy_types") == {"1.1": "pass", "1.2": "pass", "1.3": "pass"}, \
        reasons(batch, "honest_numpy_types")


def test_edited_prose_is_not_tampering(batch):
    assert points(batch, "edited_prose") == (6, 6)


def test_a_notebook_without_cell_ids_is_graded_and_told_what_to_do(batch):
    assert statuses(batch, "no_ids") == {"1.1": "pass", "1.2": "pass", "1.3": "pass"}
    assert all("without cell ids" in r and "JupyterLab" in r for r in reasons(batch, "no_ids").values())


def test_an_extra_cell_is_not_run_and_told_where_code_goes(batch):
    assert statuses(batch, "extra_cell") == {"1.1": "error", "1.2": "pass", "1.3": "pass"}
    why = reasons(batch, "extra_cell")["1.1"]
    assert "helper" in why and "extra code cell" in why and "answer cell" in why


def test_a_deleted_answer_cell_is_invalid_and_says_what_to_do(batch):
    result = batch["results"]["missing_answer"]
    assert result.exercise_set == nf.SYNTHETIC
    assert statuses(batch, "missing_answer") == {"1.1": "pass", "1.2": "invalid", "1.3": "pass"}
    assert "copy your code into the answer cell" in reasons(batch, "missing_answer")["1.2"]


# -- broken work -----------------------------------------------------------------------

def test_edited_checks_are_tampered_and_the_rest_still_graded(batch):
    assert statuses(batch, "edited_checks") == {"1.1": "tampered", "1.2": "tampered", "1.3": "pass"}
    assert "stored output" in reasons(batch, "edited_checks")["1.1"]
    assert "check cell of 1.2 was edited" in reasons(batch, "edited_checks")["1.2"]
    assert points(batch, "edited_checks") == (1, 6)


def test_endless_loops_time_out_crashes_cost_only_their_exercise(batch):
    assert statuses(batch, "hang_and_crash") == {"1.1": "timeout", "1.2": "error", "1.3": "pass"}
    why = reasons(batch, "hang_and_crash")
    assert f"longer than {TIMEOUT} s" in why["1.1"]
    assert "died" in why["1.2"]  # seen dying, not mistaken for a timeout
    assert points(batch, "hang_and_crash") == (1, 6)


def test_a_loop_swallowing_interrupts_is_stopped_and_timed_out(batch):
    assert statuses(batch, "unstoppable") == {"1.1": "timeout", "1.2": "pass", "1.3": "pass"}


def test_patching_numpy_in_the_sandbox_changes_no_check(batch):
    assert statuses(batch, "monkeypatch_numpy")["1.2"] == "fail"


@pytest.mark.parametrize("name", ["not_json", "not_notebook", "old_format", "unknown_set"])
def test_files_that_are_not_notebooks_of_this_course_are_invalid(batch, name):
    result = batch["results"][name]
    assert [(r.exercise, r.status, r.points) for r in result.rows] == [("*", "invalid", 0)]
    assert result.rows[0].reason


def test_an_unreadable_file_gets_a_row_per_exercise(batch, course):
    rows = pipeline.expand_unknown(batch["all"], Course(course), nf.SYNTHETIC)
    broken = rows[list(batch["paths"]).index("not_json")]
    assert [(r.exercise, r.status, r.points, r.max_points) for r in broken.rows] == [
        ("1.1", "invalid", 0, 2), ("1.2", "invalid", 0, 3), ("1.3", "invalid", 0, 1)]


@pytest.mark.parametrize("cells", [
    [1, "text", None, {"id": ["not", "a", "string"]}, {"id": "ex11-answer", "source": 42}],
    [{"id": "ex11-answer", "cell_type": "code", "source": ["def scores(q, k):\n", 7], "outputs": "x",
      "metadata": "not a dict"}],
])
def test_malformed_cells_never_crash_the_grader(course, tmp_path, cells):
    path = tmp_path / "odd.ipynb"
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": cells,
                                "metadata": {"course": {"exercise_set": nf.SYNTHETIC}}}))
    result = pipeline.grade(path, Course(course), pipeline.Options(timeout=TIMEOUT))
    assert result.total[0] == 0 and {r.status for r in result.rows} <= {"invalid", "error", "fail"}


# -- attacks -----------------------------------------------------------------------------

ATTACKS = sorted(attacks(Path("/nonexistent"), 0))


@pytest.mark.parametrize("name", ATTACKS)
def test_an_attack_scores_no_pass(batch, name):
    rows = batch["results"]["attack_" + name].rows
    attacked = attacks(Path("/nonexistent"), 0)[name]
    assert [r.status for r in rows if r.exercise in attacked and r.status == "pass"] == [], \
        cli.format_result(batch["results"]["attack_" + name])
    assert all(r.status != "pass" for r in rows), cli.format_result(batch["results"]["attack_" + name])


def test_attacks_change_no_file_outside_their_sandbox(batch):
    changed = {p for p in set(batch["before"]) | set(batch["after"]) if batch["before"].get(p) != batch["after"].get(p)}
    assert changed == set() and batch["site"][0] == batch["site"][1]


def test_no_process_an_answer_starts_outlives_its_sandbox(batch):
    assert batch["survivors"] == []


def test_the_grader_kills_only_its_own_runs(batch):
    assert batch["victim_alive"]


def test_the_reasons_say_what_stopped_an_attack(batch):
    why = {name: reasons(batch, "attack_" + name)["1.1"] for name in ATTACKS}
    assert "No such file" in why["exec_solutions"] or "FileNotFoundError" in why["exec_solutions"]
    assert "course_lib" in why["import_course_lib"] and "write the code yourself" in why["import_course_lib"]
    assert "not plain data" in why["frame_reading"] and "MiB" in why["huge_return"]
    assert "not plain data" in reasons(batch, "attack_frame_reading")["1.3"]
    assert "not plain data" in why["subclass_and_objects"]
    assert any(word in why["poison_checkout"] for word in ("FileNotFoundError", "PermissionError", "Read-only"))
    assert "timeout" == statuses(batch, "attack_swallow_everything")["1.1"]


# -- the batch and its reports ----------------------------------------------------------

def test_submissions_are_byte_identical_after_grading(batch):
    assert {p: h for p, h in batch["before"].items() if "submissions" in p} == \
           {p: h for p, h in batch["after"].items() if "submissions" in p}


def test_a_path_given_twice_is_graded_once(batch):
    assert len(batch["all"]) == len(batch["paths"])


def test_the_csv_has_one_row_per_exercise_with_a_reason_column(batch):
    with open(batch["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["submission", "exercise_set", "exercise", "status", "points", "max_points", "reason"]
    assert len({r["submission"] for r in rows}) == len(batch["paths"])
    untouched = [r for r in rows if r["submission"].endswith("untouched.ipynb")]
    assert [(r["exercise"], r["status"], r["points"], r["max_points"], r["reason"]) for r in untouched] == [
        ("1.1", "fail", "0", "2", "not implemented yet"), ("1.2", "fail", "0", "3", "not implemented yet"),
        ("1.3", "fail", "0", "1", "not implemented yet")]


def test_the_table_is_plain_deterministic_text(batch):
    text = cli.format_result(batch["results"]["partial"])
    assert text.splitlines()[1].split() == ["exercise", "status", "points", "reason"]
    assert "0x" not in text and text == cli.format_result(batch["results"]["partial"])
    assert text.splitlines()[-1].split() == ["total", "2", "/", "6"]


def test_the_cli_grades_several_submissions_into_one_csv(course, tmp_path, capsys):
    exercise = course / "exercises" / f"{nf.SYNTHETIC}.ipynb"
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{}")
    out = tmp_path / "grades.csv"
    assert cli.main([str(bad), str(exercise), str(bad), "--csv", str(out),
                       "--course-root", str(course), "--timeout", str(TIMEOUT)]) == 0
    text = capsys.readouterr().out
    assert text.count("invalid") == 3 and "graded 2 submissions: 0 / 12 points in all" in text
    assert len(out.read_text().splitlines()) == 1 + 3 + 3


def test_without_a_sandbox_others_work_is_refused_unless_trusted(course, tmp_path, capsys, monkeypatch):
    solution = course / "solutions" / f"{nf.SYNTHETIC}.ipynb"
    monkeypatch.setattr(sandbox, "available", lambda: False)
    assert cli.main([str(solution), "--course-root", str(course)]) == 2
    err = capsys.readouterr().err
    assert "no sandbox" in err and "apt-get install bubblewrap" in err and "--trusted" in err
    assert cli.main([str(solution), "--course-root", str(course), "--trusted"]) == 0
    assert "6 / 6 points" in capsys.readouterr().out


def test_without_a_sandbox_ones_own_notebook_is_graded_with_a_note(course, capsys, monkeypatch):
    own = course / "exercises" / f"{nf.SYNTHETIC}.ipynb"
    monkeypatch.setattr(sandbox, "available", lambda: False)
    assert cli.main([str(own), "--course-root", str(course), "--timeout", str(TIMEOUT)]) == 0
    out, err = capsys.readouterr()
    assert "graded 1 submission: 0 / 6 points" in out
    assert len(err.splitlines()) == 1 and "without a sandbox" in err and "your own notebook" in err
    solution = course / "solutions" / f"{nf.SYNTHETIC}.ipynb"
    assert cli.main([str(own), str(solution), "--course-root", str(course)]) == 2  # one's own is one notebook
    assert "no sandbox" in capsys.readouterr().err


def test_a_python_named_through_a_folder_the_sandbox_lacks_starts(tmp_path, monkeypatch):
    """``../.venv/bin/python`` run in exercises/: a path through a folder not bound in the sandbox."""
    folder = tmp_path / "exercises"
    folder.mkdir()
    monkeypatch.setattr(sys, "executable", os.path.join(folder, os.path.relpath(sys.executable, folder)))
    with sandbox.Session(sandbox.Limits()) as session:
        assert session.exec(["x = 1"], timeout=60) == {"x": "data"}


def test_why_no_sandbox_names_the_python_that_did_not_start(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/nowhere/bin/python")
    why = sandbox.why_unavailable()
    assert "bubblewrap starts" in why and "(/nowhere/bin/python) does not start inside it" in why
    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    assert sandbox.why_unavailable() == "bubblewrap (bwrap) is not installed"


def test_help_explains_the_statuses(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    for word in ("--csv", "--timeout", "--trusted", "--course-root", "sandbox", "tampered", "invalid", "never modified"):
        assert word in text


@pytest.mark.parametrize("argv", [[], ["x.ipynb", "--timeout", "0"], ["x.ipynb", "--course-root", "/nonexistent"]])
def test_usage_errors_exit_nonzero(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2


# -- the learner's check and the grader agree -----------------------------------------

AGREEMENT = {  # (answer to 1.1, does it pass?)
    "right": ("def scores(q, k):\n    return q @ k.T", True),
    "right in float32": ("def scores(q, k):\n    return (q @ k.T).astype(np.float32)", False),  # float64 case
    "off by a little": ("def scores(q, k):\n    return q @ k.T * (1 + 1e-6)", False),
    "wrong shape": ("def scores(q, k):\n    return k @ q.T", False),
    "a list": ("def scores(q, k):\n    return (q @ k.T).tolist()", True),
}


def _in_kernel(course, answer) -> bool:
    """What the learner's notebook says: the cells run in one namespace, as a kernel runs them."""
    nb = nf.read(course / "exercises" / f"{nf.SYNTHETIC}.ipynb")
    namespace = {"__name__": "__main__"}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.id == "ex11-answer":
            exec(answer, namespace)
        elif cell.id == "ex11-check":
            try:
                exec(cell.source, namespace)
            except checks.CheckFailed:
                return False
            return True
        elif "answer" not in cell.metadata.get("tags", []):
            exec(cell.source, namespace)


def test_the_learners_check_and_the_grader_agree(course, tmp_path):
    paths = {}
    for label, (answer, _) in AGREEMENT.items():
        paths[label] = nf.write(_solution_with(course, {"1.1": answer}), tmp_path / f"{label.replace(' ', '_')}.ipynb")
    results = pipeline.grade_all(paths.values(), Course(course), pipeline.Options(timeout=TIMEOUT), jobs=2)
    for (label, (answer, passes)), result in zip(AGREEMENT.items(), results):
        graded = result.rows[0].status == "pass"
        assert _in_kernel(course, answer) == graded == passes, (label, result.rows[0])


def test_tolerance_comes_from_the_expected_dtype():
    rng = np.random.default_rng(0)
    expected = rng.standard_normal(50)
    checks.check_close("float64 expected, exact answer", expected.copy(), expected)
    with pytest.raises(checks.CheckFailed):  # float32 rounding is far outside float64's bounds
        checks.check_close("float64 expected, float32 answer", expected.astype(np.float32), expected)
    checks.check_close("float32 expected, float32 answer", expected.astype(np.float32), expected, dtype=np.float32)
    checks.check_close("float32 expected, float64 answer", expected, expected, dtype=np.float32)
    with pytest.raises(checks.CheckFailed):  # a float16 answer is not a float32 one
        checks.check_close("float32 expected, float16 answer", expected.astype(np.float16), expected, dtype=np.float32)


# -- the real exercise sets ------------------------------------------------------------

@pytest.fixture(scope="module")
def real_sets(tmp_path_factory):
    """Every real set's solution, its untouched exercise and a submission with only its first answer."""
    folder = tmp_path_factory.mktemp("real")
    subs, meta = {}, {}
    for path in REAL_SOLUTIONS:
        solution, exercise = nf.read(path), nf.read(REPO / "exercises" / path.name)
        names = nf.exercise_names(solution)
        points = {n: nf.cells(solution, "check", n)[0].metadata["course"]["points"] for n in names}
        meta[path.stem] = (names, points)
        subs[(path.stem, "solution")] = nf.write(solution, folder / f"{path.stem}-solution.ipynb")
        subs[(path.stem, "untouched")] = nf.write(exercise, folder / f"{path.stem}-untouched.ipynb")
        subs[(path.stem, "partial")] = nf.write(nf.with_answers(exercise, solution, names[:1]),
                                                folder / f"{path.stem}-partial.ipynb")
    results = pipeline.grade_all(subs.values(), Course(REPO), pipeline.Options(timeout=300), jobs=2)
    return dict(zip(subs, results)), meta


@pytest.mark.parametrize("path", REAL_SOLUTIONS, ids=lambda p: p.stem)
def test_solution_full_marks_untouched_zero_partial_its_part(real_sets, path):
    results, meta = real_sets
    names, points = meta[path.stem]
    solution, untouched, partial = (results[(path.stem, kind)] for kind in ("solution", "untouched", "partial"))
    total = sum(points.values())
    assert solution.total == (total, total), cli.format_result(solution)
    assert untouched.total == (0, total) and {r.status for r in untouched.rows} == {"fail"}, cli.format_result(untouched)
    assert [r.status for r in partial.rows] == ["pass"] + ["fail"] * (len(names) - 1), cli.format_result(partial)
    assert partial.total == (points[names[0]], total)


# -- exercises that ask for an algorithm check the algorithm -----------------------------

# Each is a right output computed the wrong way: every one passed before its check counted.
WRONG_ALGORITHMS = {
    "03_tiling_and_sram": {"3.3": '''def blocks_per_sm(shared_bytes, regs_per_thread, threads, sm):
    if shared_bytes > sm["smem_per_block"] or regs_per_thread > sm["max_regs_per_thread"]:
        return 0
    return min(sm["smem_per_sm"] // (shared_bytes + sm["reserved_per_block"]),
               sm["regs_per_sm"] // (regs_per_thread * threads), sm["max_blocks"])  # no threads-per-SM cap'''},
    "06_masks": {"6.4": None},  # the solution with `left > 0` for `left >= 0`, below
    "04_online_softmax": {
        "4.2": '''def online_softmax(s, Bc):  # three passes: max, then sum, then normalise
    rows, n = s.shape
    m = np.full(rows, -np.inf)
    for j in range(0, n, Bc):
        m = np.maximum(m, s[:, j:j + Bc].max(axis=1))
    shift = np.where(np.isneginf(m), 0.0, m)
    l = np.zeros(rows)
    for j in range(0, n, Bc):
        l += np.exp(s[:, j:j + Bc] - shift[:, None]).sum(axis=1)
    l = np.where(l > 0, l, 1.0)
    return np.concatenate([np.exp(s[:, j:j + Bc] - shift[:, None]) / l[:, None] for j in range(0, n, Bc)], axis=1)''',
        "4.6": '''def split_kv_attention(q, k, v, n_splits):  # one chunk, whatever n_splits says
    s = np.einsum("hd,hnd->hn", q, k[:, 0:k.shape[1]]) / math.sqrt(q.shape[1])
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=1)
    return np.einsum("hn,hnd->hd", p, v[:, 0:v.shape[1]]) / l[:, None], m[:, 0] + np.log(l)'''},
    "05_flash_forward": {
        "5.4": '''def flash_fa1(q, k, v, Br, Bc, scale=None):  # FA2's loop order: K and V read once per query tile
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    O, lse = np.zeros((B, H, Nq, v.shape[3])), np.zeros((B, H, Nq))
    for b in range(B):
        for h in range(H):
            for i in range(0, Nq, Br):
                Qi = q[b, h, i:i + Br]
                Oi, li, mi = np.zeros((len(Qi), v.shape[3])), np.zeros(len(Qi)), np.full(len(Qi), -np.inf)
                for j in range(0, Nk, Bc):
                    Oi, li, mi = fa1_step(Qi, k[b, h, j:j + Bc], v[b, h, j:j + Bc], Oi, li, mi, scale)
                O[b, h, i:i + Br], lse[b, h, i:i + Br] = Oi, mi + np.log(li)
    return O, lse''',
        "5.5": None},  # the solution without its `break`, below
}


@pytest.fixture(scope="module")
def wrong_algorithms(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wrong")
    paths = {}
    for stem, answers in WRONG_ALGORITHMS.items():
        solution = nf.read(REPO / "solutions" / f"{stem}.ipynb")
        for name, source in answers.items():
            nb = copy.deepcopy(solution)
            cell = nf.cells(nb, "answer", name)[0]
            if source is None and name == "6.4":
                assert cell.source.count("left >= 0") == 2
                source = cell.source.replace("left >= 0", "left > 0")
            elif source is None and name == "5.5":
                source = cell.source.replace("break  # this tile", "pass  # no skipping: this tile")
                assert source != cell.source
            cell.source = source
            paths[(stem, name)] = nf.write(nb, folder / f"{stem}-{name}.ipynb")
    results = pipeline.grade_all(paths.values(), Course(REPO), pipeline.Options(timeout=300), jobs=2)
    return dict(zip(paths, results))


@pytest.mark.parametrize("stem, name", [(s, n) for s, answers in WRONG_ALGORITHMS.items() for n in answers])
def test_a_right_output_by_the_wrong_algorithm_does_not_pass(wrong_algorithms, stem, name):
    result = wrong_algorithms[(stem, name)]
    rows = {r.exercise: r for r in result.rows}
    assert rows[name].status in ("fail", "error"), cli.format_result(result)
    assert all(r.status == "pass" for n, r in rows.items() if n != name), cli.format_result(result)


def test_a_float64_answer_to_a_float32_case_passes_everywhere(tmp_path):
    """Set 01's 1.1 has a float32 case; an answer computed (more exactly) in float64 passes both,
    because the tolerance is the float32 case's, not the answer's."""
    answer = ("def scores(q, k, scale=None):\n    if scale is None:\n        scale = 1 / math.sqrt(q.shape[-1])\n"
              "    return scale * (q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64))")
    exercise = nf.read(REPO / "exercises" / "01_naive_attention.ipynb")
    namespace = {"__name__": "__main__"}
    for cell in exercise.cells:  # the learner's kernel, up to the check of 1.1
        if cell.cell_type == "code":
            exec(answer if cell.id == "ex1-1-answer" else cell.source, namespace)
            if cell.id == "ex1-1-check":
                break
    nb = copy.deepcopy(exercise)
    _set_answer(nb, "1.1", answer)
    result = pipeline.grade(nf.write(nb, tmp_path / "float64.ipynb"), Course(REPO), pipeline.Options(timeout=60))
    assert result.rows[0].status == "pass", cli.format_result(result)


PROBE = """import os, socket, sys
site = [p for p in sys.path if p.endswith('site-packages')][0]
seen = {'uid': os.getuid(), 'pid': os.getpid(), 'root': sorted(os.listdir('/'))}
try:
    import course_lib
    seen['course_lib'] = course_lib.__file__
except ImportError:
    seen['course_lib'] = None
for target in (site + '/x.pth', '/usr/x', '/grader/x'):
    try:
        open(target, 'w')
        seen[target] = 'written'
    except OSError:
        pass
open('/tmp/mine', 'w').write('ok')
try:
    socket.create_connection(('1.1.1.1', 80), timeout=1)
    seen['net'] = True
except OSError:
    seen['net'] = False
"""


@pytest.mark.parametrize("userns", [True, False] if os.geteuid() == 0 else [True], ids=lambda u: "userns" if u else "setpriv")
def test_the_sandbox_is_unprivileged_read_only_offline_courseless(userns):
    with sandbox.Session(sandbox.Limits(), userns=userns) as session:
        session.exec([PROBE], timeout=60)
        seen = session.get("seen", timeout=60)
    assert seen["uid"] in ([sandbox.SANDBOX_UID] if userns else sandbox.SANDBOX_UIDS)   # as root: a uid of its own
    assert seen["pid"] < 10  # its own PID namespace
    assert seen["course_lib"] is None and seen["net"] is False
    assert not [k for k, v in seen.items() if v == "written"]
    assert set(seen["root"]) <= {"bin", "dev", "etc", "grader", "lib", "lib32", "lib64", "libx32", "proc", "sbin",
                                 "tmp", "usr", *(p.split("/")[1] for p in map(str, sandbox._python_roots()))}


def test_a_table_of_published_outputs_fails_on_fresh_inputs(course, tmp_path):
    """The notebook's inputs are seeded and public: outputs computed elsewhere and pasted in pass
    the checks as published, and fail when the grader draws the same cases from a secret salt."""
    rng = np.random.default_rng(0)  # the synthetic set's setup cell
    q, k = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    table = f"TABLE = np.array({(q @ k.T).tolist()!r})\ndef scores(q, k):\n    return TABLE"
    path = nf.write(_solution_with(course, {"1.1": table}), tmp_path / "table.ipynb")
    same = pipeline.grade(path, Course(course), pipeline.Options(timeout=TIMEOUT))
    fresh = pipeline.grade(path, Course(course), pipeline.Options(timeout=TIMEOUT, fresh_inputs=12345))
    assert same.rows[0].status == "pass" and fresh.rows[0].status == "fail"
    assert [r.status for r in fresh.rows[1:]] == ["pass", "pass"]


def test_the_cli_grades_on_fresh_inputs_unless_told_otherwise(course, tmp_path, capsys):
    rng = np.random.default_rng(0)  # the synthetic set's setup cell
    q, k = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    table = f"TABLE = np.array({(q @ k.T).tolist()!r})\ndef scores(q, k):\n    return TABLE"
    path = nf.write(_solution_with(course, {"1.1": table}), tmp_path / "table.ipynb")
    common = [str(path), "--course-root", str(course), "--timeout", str(TIMEOUT)]
    assert cli.main(common) == 0
    assert "graded 1 submission: 4 / 6 points in all" in capsys.readouterr().out
    assert cli.main(common + ["--published-inputs"]) == 0
    assert "graded 1 submission: 6 / 6 points in all" in capsys.readouterr().out


@pytest.mark.parametrize("salt", [7919])  # 30 salts were tried by hand: every solution full marks
def test_every_real_solution_scores_full_marks_on_fresh_inputs(salt):
    results = pipeline.grade_all(REAL_SOLUTIONS, Course(REPO), pipeline.Options(timeout=300, fresh_inputs=salt), jobs=2)
    for result in results:
        assert result.total[0] == result.total[1], cli.format_result(result)


def test_a_table_of_fixed_case_outputs_fails_on_fresh_inputs(tmp_path):
    """1.5's cases are a fixed list and a few seeded draws: a table of their outputs, recorded by
    running the published check, passes as published and fails on fresh inputs."""
    from course_lib.models import memory
    exercise = nf.read(REPO / "exercises" / "01_naive_attention.ipynb")
    table = {}

    def recording(batch, heads, nq, nk, dtype):
        table[(batch, heads, nq, nk, np.dtype(dtype).name)] = memory.score_bytes(batch, heads, nq, nk, dtype)
        return table[(batch, heads, nq, nk, np.dtype(dtype).name)]

    namespace = {"__name__": "__main__"}
    for cell in exercise.cells:
        if cell.cell_type == "code" and "answer" not in cell.metadata.get("tags", []):
            if cell.id == "ex1-5-check":
                namespace["score_bytes"] = recording
                exec(cell.source, namespace)
                break
            if "check" not in cell.metadata.get("tags", []):
                exec(cell.source, namespace)
    answer = f"TABLE = {table!r}\ndef score_bytes(batch, heads, nq, nk, dtype):\n" \
             "    return TABLE[(batch, heads, nq, nk, np.dtype(dtype).name)]"
    nb = copy.deepcopy(exercise)
    _set_answer(nb, "1.5", answer)
    path = nf.write(nb, tmp_path / "table.ipynb")
    course = Course(REPO)
    same = {r.exercise: r.status for r in pipeline.grade(path, course, pipeline.Options(timeout=60)).rows}
    fresh = {r.exercise: r.status for r in pipeline.grade(path, course, pipeline.Options(timeout=60, fresh_inputs=99)).rows}
    assert same["1.5"] == "pass" and fresh["1.5"] == "error"  # a KeyError: the table has no such case


def test_numba_answers_compile_in_the_sandbox():
    """Set 08's answers are numba kernels: cache=True needs the cell in a real file, prange a lock."""
    cell = ("from numba import njit, prange\n\n@njit(parallel=True, cache=True)\ndef twice(x):\n"
            "    out = np.empty_like(x)\n    for i in prange(x.shape[0]):\n        out[i] = 2 * x[i]\n    return out")
    with sandbox.Session(sandbox.Limits()) as session:
        session.exec(["import numpy as np"], timeout=60)
        assert session.exec([cell], timeout=120) == {"twice": "callable", "njit": "callable", "prange": "callable"}
        assert session.call("twice", [np.arange(4.0)], {}, timeout=120).tolist() == [0.0, 2.0, 4.0, 6.0]


class _Reader:
    """A tile reader as sets 03 and 05 define them: slices only."""
    __module__ = "__course__"

    def __init__(self):
        self.shape, self.rows = (10,), 0

    def __len__(self):
        return 10

    def __getitem__(self, rows):
        if not isinstance(rows, slice):
            raise TypeError("one tile at a time")
        self.rows += len(range(*rows.indices(10)))
        return np.arange(10.0)[rows]


HONEST_TYPES = """from fractions import Fraction
def tiles(x):
    display(x.shape)
    bounds = np.array_split(np.arange(len(x)), 3)
    return np.concatenate([x[b[0]:b[-1] + 1] for b in bounds] + [x[j0:j0 + np.int64(2)] for j0 in np.arange(0, 4, 2)])
label = np.str_("memory-bound")
prediction = Fraction(3, 7)
"""


def test_numpy_scalars_fractions_and_display_cross_as_in_notebook():
    from fractions import Fraction
    reader = _Reader()
    with sandbox.Session(sandbox.Limits()) as session:
        session.exec(["import numpy as np"], timeout=60)
        session.exec([HONEST_TYPES], timeout=60)
        got = session.call("tiles", [reader], {}, timeout=60)
        label, prediction = session.get("label", timeout=60), session.get("prediction", timeout=60)
    assert got.tolist() == list(np.arange(10.0)) + [0.0, 1.0, 2.0, 3.0] and reader.rows == 14
    assert type(label) is str and label == "memory-bound"
    assert type(prediction) is Fraction and prediction == Fraction(3, 7)


def test_a_compiled_answer_may_use_the_course_cells_constants():
    """Set 08's course cell defines EMPTY, PARTIAL, FULL = 0, 1, 2; a kernel that names them runs
    in the learner's notebook, and so in the sandbox."""
    from course_lib.grading import names
    setup = names.sandbox_setup(nf.read(REPO / "exercises" / "08_numba_cpu.ipynb"))
    assert "EMPTY, PARTIAL, FULL = 0, 1, 2" in setup[-1]
    kernel = ("@numba.njit\ndef computed(tiles):\n    n = 0\n    for t in tiles.ravel():\n"
              "        if t != EMPTY:\n            n += 1\n    return n")
    with sandbox.Session(sandbox.Limits()) as session:
        for cell in setup:
            session.exec([cell], timeout=60)
        session.exec([kernel], timeout=60)
        assert session.call("computed", [np.array([[0, 1], [2, 0]], np.int8)], {}, timeout=120) == 2


# -- what may cross from the answers into a check ------------------------------------------------

BUILTINS_SET = "91_builtins"
SHADOWED = ("range = lambda *args: []\nlen = lambda x: 0\nmin = lambda *args: 0.0\nfloat = lambda x=0: 0.0\n"
            "TypeError = ValueError\nint = lambda x=0: 0\n")


def _builtins_solution():
    """One exercise whose check reads builtins: range, len, min and float decide its verdict."""
    def meta(tags, **course):
        return {"tags": tags, "course": dict(course, exercise="1.1")}

    return new_notebook(cells=[
        new_markdown_cell("# Squares\nWrite `squares(xs)`: the square of each number.", id="title"),
        new_code_cell("import numpy as np\nfrom course_lib import checks", id="setup"),
        new_code_cell("def squares(xs):\n    ### BEGIN SOLUTION\n    return [x * x for x in xs]\n    ### END SOLUTION",
                      id="ex11-answer", metadata=meta(["answer", "nbval-ignore-output"])),
        new_code_cell("cases = [3, 1, 4, 1, 5]\n"
                      "expected = [float(c * c) for c in cases]\n"
                      "got = [float(v) for v in squares(cases)]\n"
                      'checks.check_value("1.1 how many squares", len(got), len(expected), rtol=0)\n'
                      "for i in range(len(expected)):\n"
                      '    checks.check_value(f"1.1 square {i}", got[i], expected[i])\n'
                      'checks.check_value("1.1 the smallest", min(got), min(expected))',
                      id="ex11-check", metadata=meta(["check"], points=2)),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                 "course": {"chapter": "91", "kind": "solution", "exercise_set": BUILTINS_SET}})


def test_an_answer_defining_builtins_leaves_the_checks_builtins(tmp_path_factory):
    """A check reads range, len, min and float from the grader's builtins, whatever the answer binds:
    only the names an exercise asks for cross from the sandbox (here `squares`)."""
    root = nf.make_course(tmp_path_factory.mktemp("builtins"), {BUILTINS_SET: _builtins_solution()})
    solution = nf.read(root / "solutions" / f"{BUILTINS_SET}.ipynb")
    shadowing = copy.deepcopy(solution)
    _set_answer(shadowing, "1.1", SHADOWED + "def squares(xs):\n    return []")
    honest = copy.deepcopy(solution)  # an answer's own helpers named like builtins are its own business
    _set_answer(honest, "1.1", "def len(xs):\n    return sum(1 for _ in xs)\n"
                               "def squares(xs):\n    return [x * x for x in xs[:len(xs)]]")
    folder = tmp_path_factory.mktemp("builtins-submissions")
    paths = [nf.write(nb, folder / f"{name}.ipynb")
             for name, nb in (("solution", solution), ("shadowing", shadowing), ("honest", honest))]
    results = pipeline.grade_all(paths, Course(root), pipeline.Options(timeout=TIMEOUT), jobs=2)
    assert [r.rows[0].status for r in results] == ["pass", "fail", "pass"], \
        "\n".join(cli.format_result(r) for r in results)


# -- denial of service: each fails fast, with its reason, and costs only its own submission --------

LOOPS_SET = "92_loops"


def _loops_solution():
    """Two exercises; 1.1's check loops as many times as the answer says, in the grader."""
    def meta(exercise, tags, **course):
        return {"tags": tags, "course": dict(course, exercise=exercise)}

    return new_notebook(cells=[
        new_markdown_cell("# Counting\nWrite `count()` and `two()`.", id="title"),
        new_code_cell("import numpy as np\nfrom course_lib import checks", id="setup"),
        new_code_cell("def count():\n    ### BEGIN SOLUTION\n    return 3\n    ### END SOLUTION",
                      id="ex11-answer", metadata=meta("1.1", ["answer", "nbval-ignore-output"])),
        new_code_cell("total = 0\nfor i in range(min(count(), 10**15)):\n    total += 1\n"
                      'checks.check_value("1.1 count", total, 3, rtol=0)',
                      id="ex11-check", metadata=meta("1.1", ["check"], points=1)),
        new_code_cell("def two():\n    ### BEGIN SOLUTION\n    return 2\n    ### END SOLUTION",
                      id="ex12-answer", metadata=meta("1.2", ["answer", "nbval-ignore-output"])),
        new_code_cell('checks.check_value("1.2 two", two(), 2, rtol=0)',
                      id="ex12-check", metadata=meta("1.2", ["check"], points=1)),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                 "course": {"chapter": "92", "kind": "solution", "exercise_set": LOOPS_SET}})


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    root = nf.make_course(tmp_path_factory.mktemp("loops"), {LOOPS_SET: _loops_solution()})
    solution = nf.read(root / "solutions" / f"{LOOPS_SET}.ipynb")
    looping = _set_answer(copy.deepcopy(solution), "1.1", "def count():\n    return 10**15")
    folder = tmp_path_factory.mktemp("loops-submissions")
    paths = [nf.write(nb, folder / f"{name}.ipynb") for name, nb in (("solution", solution), ("looping", looping))]
    return root, paths


def test_a_check_cells_own_loop_stops_at_the_checks_deadline(loops):
    """The check runs in the grader; an answer that makes its loop endless costs that check's time."""
    root, paths = loops
    start = time.monotonic()
    solution, looping = pipeline.grade_all(paths, Course(root), pipeline.Options(timeout=3), jobs=2)
    assert time.monotonic() - start < 60
    assert [r.status for r in solution.rows] == ["pass", "pass"]
    assert [(r.status, r.reason) for r in looping.rows] == [("timeout", "the check ran longer than 3 s"), ("pass", "")]


def test_a_submission_stops_at_its_deadline_others_keep_marks(loops):
    root, paths = loops
    solution, looping = pipeline.grade_all(paths, Course(root), pipeline.Options(timeout=30, submission_timeout=4),
                                           jobs=2)
    assert solution.total == (2, 2)
    assert [r.status for r in looping.rows] == ["timeout", "timeout"]
    assert all("the submission ran past its 4 s in all" in r.reason for r in looping.rows), looping.rows


FLOOD = """import json, os, struct, sys
def flood():
    fd = int(sys.argv[2])
    header = json.dumps({"seq": 2, "ok": True, "value": None, "sizes": [250 * 2**20]}).encode()
    os.write(fd, struct.pack("!Q", len(header)) + header)
    chunk = bytes(2**20)
    while True:
        os.write(fd, chunk)
"""


def test_a_reply_that_keeps_arriving_stops_at_its_deadline():
    with sandbox.Session(sandbox.Limits()) as session:
        session.exec([FLOOD], timeout=60)
        start = time.monotonic()
        try:
            session.call("flood", [], {}, timeout=2)
        except (sandbox.Timeout, sandbox.wire.WireError):
            pass
        assert time.monotonic() - start < 20   # 250 MB read at the speed of a pipe; before, over 200 s


HOG = """import os, time
def hog(wait):
    for _ in range(3):
        if os.fork() == 0:
            block = np.ones(50 * 10**6)   # 400 MB each, written
            time.sleep(20)
            os._exit(0)
    time.sleep(wait)
    return 0
"""


@pytest.mark.parametrize("wait", [20, 0], ids=["while-the-grader-waits", "while-the-grader-runs-a-check"])
def test_the_memory_of_a_sandboxs_processes_together_is_limited(wait):
    with sandbox.Session(sandbox.Limits(memory_bytes=2**30)) as session:
        session.exec(["import numpy as np", HOG], timeout=60)
        start = time.monotonic()
        with pytest.raises(sandbox.Died, match=r"held \d+\.\d GB together, over the sandbox's limit of 1 GB \(--memory\)"):
            session.call("hog", [wait], {}, timeout=60)
            time.sleep(5)   # the grader's own work: no request to the sandbox
            session.call("hog", [0], {}, timeout=60)
        assert time.monotonic() - start < 15


THREADS = """import threading
hold = threading.Event()
def start(n):
    threads = [threading.Thread(target=hold.wait, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return n
"""


@pytest.mark.needs_root("a uid per sandbox needs a grader running as root")
def test_each_sandbox_has_its_own_process_limit_named_in_reasons():
    from course_lib.grading import session as grading_session
    limits = sandbox.Limits(processes=48)
    with sandbox.Session(limits) as greedy, sandbox.Session(limits) as other:
        for s in (greedy, other):
            s.exec([THREADS], timeout=60)
        assert greedy.call("start", [36], {}, timeout=60) == 36    # held while the other one works
        assert other.call("start", [36], {}, timeout=60) == 36
        with pytest.raises(sandbox.AnswerRaised) as raised:
            greedy.call("start", [36], {}, timeout=60)
    status, reason = grading_session.answer_outcome(raised.value.error, "answer")
    assert status == "error" and "can't start new thread" in reason and "--processes" in reason


def test_the_sandbox_leaves_no_file_of_its_output_behind(tmp_path, monkeypatch):
    """Its output went to a log in the grader's /tmp, which a killed grader left there, up to 64 MiB."""
    import tempfile

    from course_lib.grading import session as grading_session
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    nb = nf.read(REPO / "exercises" / "01_naive_attention.ipynb")
    run = grading_session.Run(nb, {}, sandbox.Limits(), 30, trusted=False)
    try:
        run.start()
        run.session.exec(["import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 10**5)"], timeout=60)
        assert list(tmp_path.iterdir()) == []
    finally:
        run.close()


def test_a_fifo_named_like_a_notebook_is_invalid_at_once(course, tmp_path):
    import threading
    fifo = tmp_path / "pipe.ipynb"
    os.mkfifo(fifo)
    solution = course / "solutions" / f"{nf.SYNTHETIC}.ipynb"
    results = []
    worker = threading.Thread(target=lambda: results.extend(
        pipeline.grade_all([fifo, solution], Course(course), pipeline.Options(timeout=TIMEOUT))), daemon=True)
    worker.start()
    worker.join(120)
    assert results, "the grader waited on the FIFO"
    assert [(r.status, r.reason) for r in results[0].rows] == [("invalid", "not a notebook: not a regular file "
                                                                           "(a pipe, a device or a folder)")]
    assert results[1].total == (6, 6)


HOLD = """import subprocess, sys
print("ready", flush=True)
sys.stdin.readline()            # the test says when to start
started = []
try:
    for _ in range(int(sys.argv[1])):
        started.append(subprocess.Popen(["sleep", sys.argv[2]]))
except OSError:
    pass
print(len(started), flush=True)
"""


def _readable_by_others(path):
    """Whether a user who is neither the owner nor in the group can reach ``path``."""
    path = Path(path)
    for p in [path, *path.parents]:
        try:
            mode = p.stat().st_mode
        except OSError:
            return False
        if not mode & (0o001 if p != path else 0o004 | (0o001 if p.is_dir() else 0)):
            return False
    return True


@pytest.mark.needs_root("this test drops to nobody itself")
def test_the_sandboxes_of_a_grader_that_is_not_root_each_have_their_own_process_limit(monkeypatch):
    """A grader that is not root runs each sandbox in a user namespace of its own. Its process limit
    must be set inside that namespace, where the kernel counts the sandbox's processes alone: set
    before bwrap, it counted every process of the grader's user, so one sandbox holding its limit
    starved the next. The sandboxes here are the grader's own bwrap command line, run as nobody."""
    limits = sandbox.Limits(processes=20)
    argv = sandbox._bwrap_argv(0, 1, limits, userns=True)
    prefix, drop, i = argv[:argv.index(sandbox.interpreter())], set(), 0
    while i < len(prefix):   # binds nobody cannot reach (a checkout or Python under /root) are not needed here
        if prefix[i] in ("--ro-bind", "--bind") and not _readable_by_others(prefix[i + 1]):
            drop.update((i, i + 1, i + 2))
        i += 3 if prefix[i] in ("--ro-bind", "--bind") else 1
    prefix = [a for j, a in enumerate(prefix) if j not in drop]
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *prefix, "/usr/bin/python3", "-c", HOLD]
    # the limits a grader running as nobody sets in each sandbox's first process, before bwrap
    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    monkeypatch.setattr(os, "getuid", lambda: 65534)
    session = sandbox.Session.__new__(sandbox.Session)
    session.limits = limits
    def start(*args):
        p = subprocess.Popen(nobody + list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             preexec_fn=session._child_limits)
        assert p.stdout.readline() == "ready\n"
        return p

    def go(p):
        p.stdin.write("\n")
        p.stdin.flush()
        return int(p.stdout.readline())

    other = start("10", "0")        # started first, so a limit counted per user left it no room
    greedy = start("40", "30")
    try:
        held = go(greedy)
        got = go(other)
    finally:
        for p in (greedy, other):
            p.kill()
            p.wait()
    assert 10 <= held < 20          # the greedy sandbox met its own limit (bwrap and python count too) ...
    assert got == 10                # ... and the other one still had all of its own
