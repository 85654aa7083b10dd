"""Authoring: exercises/ is solutions/ with the marked answers stubbed out, and nothing else changed."""
from __future__ import annotations

import copy

import pytest
from nbformat.v4 import new_code_cell, new_output

from course_lib.grading import authoring
from course_lib.grading.authoring import AuthoringError, make_exercise, stub_source

import notebook_factory as nf
from conftest import REPO

REAL_SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))


def with_fake_outputs(nb):
    """The synthetic solution as if executed, without starting a kernel."""
    nb = copy.deepcopy(nb)
    for n, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = n + 1
        cell.outputs = [new_output("stream", name="stdout", text=f"output of {cell.id}\n")]
    return nb


def test_stub_replaces_exactly_the_marker_regions_indented():
    source = ("def f(x):\n"
              "    y = 1  # given\n"
              "    ### BEGIN SOLUTION\n"
              "    # a comment does not count\n"
              "    z = x + y\n"
              "\n"
              "    return z\n"
              "    ### END SOLUTION\n"
              "\n"
              "### BEGIN SOLUTION\n"
              "answer = f(2)\n"
              "### END SOLUTION\n"
              "print('given code after')")
    assert stub_source(source, "2.3") == (
        "def f(x):\n"
        "    y = 1  # given\n"
        "    # YOUR CODE HERE (roughly 2 lines)\n"
        '    raise NotImplementedError("Exercise 2.3: replace this line with your code")\n'
        "\n"
        "# YOUR CODE HERE (roughly 1 line)\n"
        'raise NotImplementedError("Exercise 2.3: replace this line with your code")\n'
        "print('given code after')")


@pytest.mark.parametrize("source, message", [
    ("### BEGIN SOLUTION\nx = 1", "without its '### END SOLUTION'"),
    ("x = 1\n### END SOLUTION", "without a '### BEGIN SOLUTION' before it"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION", "inside an open region"),
    ("## BEGIN SOLUTION\nx = 1\n### END SOLUTION", "write the marker exactly"),
    ("### BEGIN SOLUTION  please\nx = 1\n### END SOLUTION", "write the marker exactly"),
])
def test_unpaired_or_misspelled_markers_raise_clear_errors(source, message):
    with pytest.raises(AuthoringError) as err:
        stub_source(source, "1.1", "sol.ipynb: cell 3")
    assert message in str(err.value) and "sol.ipynb: cell 3" in str(err.value)


def test_exercise_keeps_ids_tags_metadata_and_other_outputs():
    solution = with_fake_outputs(nf.synthetic_solution())
    exercise = make_exercise(solution, "solutions/90_synthetic.ipynb")
    assert [c.id for c in exercise.cells] == [c.id for c in solution.cells]
    assert exercise.metadata.course.kind == "exercise" and solution.metadata.course.kind == "solution"
    for mine, theirs in zip(exercise.cells, solution.cells):
        def without_kept_verdicts(md):
            return {**md, "course": {k: v for k, v in md.get("course", {}).items() if k != "expected_outputs"}}

        assert without_kept_verdicts(mine.metadata) == without_kept_verdicts(theirs.metadata)
        if "answer" in theirs.metadata.get("tags", []):
            assert mine.outputs == [] and mine.execution_count is None
            assert "### BEGIN SOLUTION" not in mine.source and "NotImplementedError" in mine.source
        elif "check" in theirs.metadata.get("tags", []):  # no verdict on show; kept for the grader
            assert mine.source == theirs.source and mine.outputs == [] and mine.execution_count is None
            assert mine.metadata.course.expected_outputs == theirs.outputs and theirs.outputs
        else:
            assert mine == theirs  # every other cell with its stored outputs
    answer = nf.cell(exercise, "ex12-answer").source
    assert answer.count("raise NotImplementedError") == 2 and "    e = np.exp(x)" in answer


def _second_check(nb):
    again = copy.deepcopy(nf.cell(nb, "ex13-check"))
    again.id = "again"
    nb.cells.append(again)


def _broken(edit):
    nb = nf.synthetic_solution()
    edit(nb)
    return nb


@pytest.mark.parametrize("edit, message", [
    (lambda nb: nf.cell(nb, "ex11-answer").metadata.course.pop("exercise"), "metadata.course.exercise"),
    (lambda nb: nb.cells.remove(nf.cell(nb, "ex12-check")), "exercise 1.2 needs exactly one check cell"),
    (_second_check, "exercise 1.3 needs exactly one check cell"),
    (lambda nb: nb.cells.insert(1, nb.cells.pop(nb.cells.index(nf.cell(nb, "ex11-check")))),
     "must come after its answer cells"),
    (lambda nb: nf.cell(nb, "ex13-check").metadata.course.update(points="1"), "points"),
    (lambda nb: nb.cells.remove(nf.cell(nb, "ex13-answer")), "exercise 1.3 has a check cell but no answer cell"),
    (lambda nb: nf.cell(nb, "setup").update(source="### BEGIN SOLUTION\nx = 1\n### END SOLUTION"),
     "without the 'answer' tag"),
    (lambda nb: nf.cell(nb, "ex11-answer").update(source="def scores(q, k):\n    return q @ k.T"),
     "without '### BEGIN SOLUTION'"),
    (lambda nb: nb.metadata.course.update(exercise_set="other"), "exercise_set"),
    (lambda nb: nf.cell(nb, "setup").metadata.update(tags=["setup"]), "has no course_lib"),
])
def test_broken_solutions_are_rejected_with_a_clear_error(edit, message):
    with pytest.raises(AuthoringError) as err:
        make_exercise(_broken(edit), "solutions/90_synthetic.ipynb")
    assert message in str(err.value)


def test_a_setup_cell_of_plain_imports_is_accepted():
    nb = nf.synthetic_solution()
    nb.cells.insert(1, new_code_cell("import math\nimport numpy as np", id="setup-answers", metadata={"tags": ["setup"]}))
    make_exercise(nb, "solutions/90_synthetic.ipynb")


def test_generating_twice_gives_the_same_bytes(tmp_path):
    root = nf.make_course(tmp_path, {nf.SYNTHETIC: with_fake_outputs(nf.synthetic_solution())}, execute=False)
    first = (root / "exercises" / f"{nf.SYNTHETIC}.ipynb").read_bytes()
    assert authoring.main(["--course-root", str(root)]) == 0
    assert (root / "exercises" / f"{nf.SYNTHETIC}.ipynb").read_bytes() == first
    assert first.endswith(b"}\n") and authoring.generate(root) == authoring.generate(root)


def test_check_detects_a_stale_missing_or_orphaned_exercise(tmp_path, capsys):
    root = nf.make_course(tmp_path, {nf.SYNTHETIC: with_fake_outputs(nf.synthetic_solution())}, execute=False)
    exercise = root / "exercises" / f"{nf.SYNTHETIC}.ipynb"
    assert authoring.main(["--check", "--course-root", str(root)]) == 0

    solution = nf.read(root / "solutions" / f"{nf.SYNTHETIC}.ipynb")
    nf.cell(solution, "title").source += "\nA new sentence."
    nf.write(solution, root / "solutions" / f"{nf.SYNTHETIC}.ipynb")
    before = exercise.read_bytes()
    capsys.readouterr()
    assert authoring.main(["--check", "--course-root", str(root)]) == 1
    assert f"exercises/{nf.SYNTHETIC}.ipynb" in capsys.readouterr().out
    assert exercise.read_bytes() == before  # --check writes nothing

    assert authoring.main(["--course-root", str(root)]) == 0
    assert authoring.main(["--check", "--course-root", str(root)]) == 0
    exercise.unlink()
    assert authoring.main(["--check", "--course-root", str(root)]) == 1
    authoring.main(["--course-root", str(root)])
    (root / "exercises" / "00_orphan.ipynb").write_text(exercise.read_text())
    capsys.readouterr()
    assert authoring.main(["--check", "--course-root", str(root)]) == 1
    assert "00_orphan.ipynb (no solutions/ source" in capsys.readouterr().out


def test_a_broken_solution_fails_the_command_with_its_reason(tmp_path, capsys):
    root = nf.make_course(tmp_path, {}, execute=False)
    nb = nf.synthetic_solution()
    nf.cell(nb, "ex11-answer").source = "### BEGIN SOLUTION\nx = 1"
    nf.write(nb, root / "solutions" / f"{nf.SYNTHETIC}.ipynb")
    assert authoring.main(["--course-root", str(root)]) == 2
    assert "ex11-answer" in capsys.readouterr().err


def test_execute_keeps_ids_and_outputs_byte_for_byte(tmp_path):
    nb = nf.synthetic_solution()
    nb.cells.append(new_code_cell("import ipywidgets\nipywidgets.IntSlider(3)", id="widget"))
    path = nf.write(nb, tmp_path / f"{nf.SYNTHETIC}.ipynb")
    assert authoring.main(["--execute", str(path)]) == 0
    first = path.read_bytes()
    executed = nf.read(path)
    assert [c.id for c in executed.cells] == [c.id for c in nb.cells]
    assert nf.cell(executed, "entries").outputs[0]["text"] == "S has 20 entries\n"
    assert nf.cell(executed, "ex13-check").outputs
    assert not any("execution" in c.metadata for c in executed.cells)
    view = nf.cell(executed, "widget").outputs[0]["data"]["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == "widget-0"  # not a fresh random id on every run
    assert authoring.main(["--execute", str(path)]) == 0
    assert path.read_bytes() == first and first.endswith(b"}\n")


def test_execute_reports_a_failing_notebook(tmp_path, capsys):
    nb = nf.synthetic_solution()
    nf.cell(nb, "entries").source = "1 / 0"
    path = nf.write(nb, tmp_path / "broken.ipynb")
    before = path.read_bytes()
    assert authoring.main(["--execute", str(path)]) == 1
    assert "ZeroDivisionError" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_exercises_are_in_step_with_solutions():
    """`make exercises` was run and committed after the last change to solutions/."""
    stale = [str(p.relative_to(REPO)) for p in authoring.stale(REPO)]
    assert stale == [], f"out of step with solutions/: {stale}; run `make exercises` and commit exercises/"


@pytest.mark.parametrize("path", REAL_SOLUTIONS, ids=lambda p: p.stem)
def test_real_solutions_follow_the_conventions(path):
    solution = nf.read(path)
    exercise = make_exercise(solution, path.relative_to(REPO))
    assert len(nf.cells(exercise, "answer")) >= 1
    for cell in nf.cells(exercise, "answer"):
        assert "NotImplementedError" in cell.source and "BEGIN SOLUTION" not in cell.source
        assert "nbval-ignore-output" in cell.metadata.tags
    for cell in nf.cells(solution, "check"):
        assert cell.outputs and cell.execution_count, f"check cell {cell.id} has no stored output: execute the solution"


REAL_EXERCISES = sorted((REPO / "exercises").glob("*.ipynb"))


def measurement_cells(nb):
    """Course code cells whose output is a measurement: tagged nbval-ignore-output (a timing, a peak),
    or reading a name a check cell bound last (what the check measured)."""
    from course_lib.grading.names import cell_names

    bound_by_check, found = set(), []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        names, cell_tags = cell_names(cell.source), cell.metadata.get("tags", [])
        if "check" in cell_tags:
            bound_by_check |= names.bound
            continue
        if "answer" not in cell_tags and ("nbval-ignore-output" in cell_tags or names.free & bound_by_check):
            found.append(cell)
        bound_by_check -= names.bound
    return found


@pytest.mark.parametrize("path", REAL_EXERCISES, ids=lambda p: p.stem)
def test_no_exercise_shows_a_measurement_before_the_prediction(path):
    shown = {c.id: c.outputs for c in measurement_cells(nf.read(path)) if c.outputs}
    assert shown == {}, f"{path.name} stores the measured value a learner is asked to predict"


def test_measurements_keep_no_output_untagged_ones_are_refused():
    solution = with_fake_outputs(nf.synthetic_solution())
    measured = new_code_cell('print("measured", n_bytes)', id="measured", metadata={"tags": ["nbval-ignore-output"]},
                             execution_count=9, outputs=[new_output("stream", name="stdout", text="measured 160\n")])
    solution.cells.append(measured)
    exercise = make_exercise(solution, "solutions/90_synthetic.ipynb")
    assert nf.cell(exercise, "measured").outputs == [] and nf.cell(solution, "measured").outputs
    assert nf.cell(exercise, "entries").outputs == nf.cell(solution, "entries").outputs  # a demonstration stays
    nf.cell(solution, "ex13-check").source += "\nmeasured_bytes = 8 * q.shape[0] * k.shape[0]"
    solution.cells.append(new_code_cell("print(measured_bytes)", id="shows-it"))
    with pytest.raises(AuthoringError) as err:
        make_exercise(solution, "solutions/90_synthetic.ipynb")
    assert "reads measured_bytes, measured by check cell 'ex13-check'" in str(err.value)
