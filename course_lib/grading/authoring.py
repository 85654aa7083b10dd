"""Write the student copies in ``exercises/`` from the solutions in ``solutions/``.

    python -m course_lib.authoring            # (re)write exercises/ from solutions/
    python -m course_lib.authoring --check    # exit 1 when exercises/ is out of step
    python -m course_lib.authoring --execute notebooks/*.ipynb solutions/*.ipynb

Each exercise set has one hand-written source, ``solutions/NN_topic.ipynb``, so
that a fix is made once and the student copy can never drift from it (the
scikit-learn MOOC and Neuromatch work the same way).  In an answer cell the code
between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes a stub::

    # YOUR CODE HERE (roughly 3 lines)
    raise NotImplementedError("Exercise 1.2: replace this line with your code")

A check cell keeps no output: a learner who opens a fresh set must not see the
solution's PASS lines under an unsolved stub.  Its passing output moves into the
cell's ``metadata.course.expected_outputs``, where the grader's tamper test reads
it and nbval can be handed it (tests run a solved exercise that way); an
untouched exercise still fails exactly at its check cells.  A course cell that
shows a measurement (tagged ``nbval-ignore-output``: a timing, a peak, a count a
check measured) keeps no output either: a "predict, then measure" exercise must
not show the measured value before the learner has predicted it.  Every other
cell keeps its stored outputs.
Cell ids are kept, because the grader matches a submission's cells by id.

The output is byte-identical from run to run, so ``--check`` (and a test) can
tell whether someone edited a solution and forgot to regenerate.
"""
from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

from .names import cell_names

COURSE_ROOT = Path(__file__).resolve().parent.parent.parent
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_MARKER = re.compile(r"^(\s*)(### BEGIN SOLUTION|### END SOLUTION)\s*$")


class AuthoringError(ValueError):
    """A solution notebook breaks the conventions in CONTRIBUTING.md."""


def _where(path, index, cell) -> str:
    return f"{path or 'notebook'}: cell {index} (id {cell.get('id', '?')!r})"


def course_meta(cell) -> dict:
    meta = cell.get("metadata", {}).get("course", {})
    return meta if isinstance(meta, dict) else {}


def tags(cell) -> list:
    return list(cell.get("metadata", {}).get("tags", []))


def stub_source(source: str, exercise: str, where: str = "") -> str:
    """Replace each BEGIN/END SOLUTION region of ``source`` by a stub.

    The stub is indented like the BEGIN line, so a region inside a function
    body leaves a function that raises when the learner's code is missing.
    """
    out, region, indent = [], None, ""
    for lineno, line in enumerate(source.splitlines(), 1):
        marker = _MARKER.match(line)
        if marker is None and ("BEGIN SOLUTION" in line or "END SOLUTION" in line):
            raise AuthoringError(f"{where} line {lineno}: write the marker exactly as "
                                 f"'{BEGIN}' or '{END}' on a line of its own, got {line.strip()!r}")
        if marker and marker.group(2) == BEGIN:
            if region is not None:
                raise AuthoringError(f"{where} line {lineno}: '{BEGIN}' inside an open region; "
                                     f"close the previous one with '{END}' first")
            region, indent = [], marker.group(1)
        elif marker:  # END
            if region is None:
                raise AuthoringError(f"{where} line {lineno}: '{END}' without a '{BEGIN}' before it")
            n = sum(1 for code in region if code.strip() and not code.strip().startswith("#"))
            out += [f"{indent}# YOUR CODE HERE (roughly {n} line{'s' if n != 1 else ''})",
                    f'{indent}raise NotImplementedError("Exercise {exercise}: replace this line with your code")']
            region = None
        elif region is not None:
            region.append(line)
        else:
            out.append(line)
    if region is not None:
        raise AuthoringError(f"{where}: '{BEGIN}' without its '{END}'")
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")


def make_exercise(nb, path=None):
    """The student copy of solution notebook ``nb`` (which is left unchanged)."""
    validate(nb, path)
    nb = copy.deepcopy(nb)
    for index, cell in enumerate(nb.cells):
        if "answer" in tags(cell):
            cell.source = stub_source(cell.source, course_meta(cell)["exercise"], _where(path, index, cell))
            cell.outputs, cell.execution_count = [], None
        elif "check" in tags(cell):  # no PASS on show before the learner has written a line
            cell.metadata.setdefault("course", {})["expected_outputs"] = cell.outputs
            cell.outputs, cell.execution_count = [], None
        elif shows_measurement(cell):  # the number to predict, on show before the prediction
            cell.outputs, cell.execution_count = [], None
    nb.metadata.setdefault("course", {})["kind"] = "exercise"
    return nb


def shows_measurement(cell) -> bool:
    """A course code cell whose output is a measurement: its output depends on the machine or on
    what a check measured, so it is tagged ``nbval-ignore-output`` (``validate`` holds a cell that
    reads a check's names to that)."""
    return (cell.cell_type == "code" and "nbval-ignore-output" in tags(cell)
            and not {"answer", "check"} & set(tags(cell)))


def _validate_measurements(nb, path) -> None:
    """A course cell that prints what a check cell bound (its measurement) must be tagged
    ``nbval-ignore-output``, so that the student copy does not show it."""
    bound_by_check = {}  # name -> id of the check cell that bound it last
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        names = cell_names(cell.source)
        if "check" in tags(cell):
            bound_by_check.update(dict.fromkeys(names.bound, cell.id))
            continue
        read = sorted(n for n in names.free if n in bound_by_check)
        if read and "answer" not in tags(cell) and not shows_measurement(cell):
            raise AuthoringError(f"{_where(path, index, cell)}: reads {', '.join(read)}, measured by check cell "
                                 f"{bound_by_check[read[0]]!r}; tag it 'nbval-ignore-output' so that the "
                                 "exercise does not show the measurement before the learner predicts it")
        for name in names.bound:
            bound_by_check.pop(name, None)


def _validate_setup(cell, where) -> None:
    """A ``setup`` cell runs in the grader's sandbox too, where there is no course_lib."""
    import ast

    if cell.cell_type != "code" or {"answer", "check"} & set(tags(cell)):
        raise AuthoringError(f"{where}: a cell tagged 'setup' must be a code cell, neither answer nor check")
    try:
        tree = ast.parse(cell.source)
    except SyntaxError as exc:
        raise AuthoringError(f"{where}: a 'setup' cell must be plain Python (no magics): {exc}") from None
    for node in ast.walk(tree):
        modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                   else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(m.split(".")[0] == "course_lib" for m in modules):
            raise AuthoringError(f"{where}: a 'setup' cell runs in the grader's sandbox, which has no course_lib; "
                                 "import course_lib in an untagged cell after it")


def validate(nb, path=None) -> None:
    """Raise AuthoringError unless ``nb`` follows CONTRIBUTING.md's exercise conventions."""
    answers, checks = {}, {}  # exercise -> cell indices
    for index, cell in enumerate(nb.cells):
        where = _where(path, index, cell)
        if not cell.get("id"):
            raise AuthoringError(f"{where}: the cell has no id; save the notebook with nbformat >= 4.5 "
                                 "(JupyterLab 3+) so that ids are stored")
        if "setup" in tags(cell):
            _validate_setup(cell, where)
        kind = "answer" if "answer" in tags(cell) else "check" if "check" in tags(cell) else None
        has_markers = BEGIN in cell.source or END in cell.source
        if kind is None:
            if has_markers and cell.cell_type == "code":
                raise AuthoringError(f"{where}: solution markers in a cell without the 'answer' tag "
                                     "would give the solution away; tag it 'answer'")
            continue
        exercise = course_meta(cell).get("exercise")
        if cell.cell_type != "code" or not isinstance(exercise, str) or not exercise:
            raise AuthoringError(f"{where}: a cell tagged {kind!r} must be a code cell with "
                                 "metadata.course.exercise set, e.g. \"1.2\"")
        if kind == "answer":
            if not has_markers:
                raise AuthoringError(f"{where}: answer cell without '{BEGIN}' / '{END}' markers")
            stub_source(cell.source, exercise, where)  # raises on unpaired markers
            answers.setdefault(exercise, []).append(index)
        else:
            points = course_meta(cell).get("points")
            if not isinstance(points, int) or isinstance(points, bool) or points < 0:
                raise AuthoringError(f"{where}: check cell needs metadata.course.points, an int >= 0, "
                                     f"got {points!r}")
            checks.setdefault(exercise, []).append(index)
    for exercise in sorted(set(answers) | set(checks)):
        found = checks.get(exercise, [])
        if not answers.get(exercise):
            raise AuthoringError(f"{path}: exercise {exercise} has a check cell but no answer cell")
        if len(found) != 1:
            raise AuthoringError(f"{path}: exercise {exercise} needs exactly one check cell "
                                 f"(tag 'check'), found {len(found)}")
        if found[0] < max(answers[exercise]):
            raise AuthoringError(f"{path}: the check cell of exercise {exercise} (cell {found[0]}) "
                                 f"must come after its answer cells (last one: cell {max(answers[exercise])})")
    _validate_measurements(nb, path)
    exercise_set = nb.metadata.get("course", {}).get("exercise_set")
    if path is not None and exercise_set != Path(path).stem:
        raise AuthoringError(f"{path}: metadata.course.exercise_set must be the file stem "
                             f"{Path(path).stem!r}, got {exercise_set!r}")


def dumps(nb) -> str:
    """The notebook as it is committed: nbformat's sorted JSON plus a final newline."""
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def generate(root: Path = COURSE_ROOT) -> dict:
    """{exercise path: text} for every solutions/*.ipynb under ``root``."""
    out = {}
    for src in sorted((root / "solutions").glob("*.ipynb")):
        nb = nbformat.read(src, as_version=4)
        out[root / "exercises" / src.name] = dumps(make_exercise(nb, src.relative_to(root)))
    return out


def stale(root: Path = COURSE_ROOT) -> list:
    """Files in exercises/ that differ from what ``generate`` would write (or are missing)."""
    wanted = generate(root)
    bad = [p for p, text in wanted.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    orphans = [p for p in (root / "exercises").glob("*.ipynb") if p not in wanted]
    return sorted(bad + orphans)


def merge_streams(outputs):
    """Join consecutive prints to one stream: the kernel splits them into
    chunks that differ from run to run, the text does not."""
    merged = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (output.get("output_type") == "stream" and last is not None
                and last.get("output_type") == "stream" and last.get("name") == output.get("name")):
            last["text"] = "".join(last["text"]) + "".join(output["text"])
        else:
            merged.append(output)
    return merged


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def strip_widget_views(nb) -> None:
    """Drop the live-widget reference from outputs that carry a static twin (an image/png).

    No widget state is stored, so the reference can never render from the file:
    JupyterLab shows "Error displaying widget: model not found" in its place
    until the cell is run.  The course's widgets put their figure beside it
    (``widgets.figure_box_class``): that is what the stored notebook shows.
    """
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data and "image/png" in data:
                del data[WIDGET_VIEW]


def execute(path: Path) -> None:
    """Run a notebook in place (kernel python3, in its own folder) and keep only what is stable.

    Cell ids and outputs stay.  What changes on every run without meaning
    anything goes: per-cell timings, how prints were split into chunks, and the random ids of widget models
    (numbered in order instead; widgets have static twins, so no widget state
    is stored).  Re-executing an unchanged notebook then gives a clean diff.
    """
    from nbclient import NotebookClient  # only needed here; keeps `--check` light

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False, store_widget_state=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)
    strip_widget_views(nb)
    widget_ids = {}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("ExecuteTime", None)
        if "outputs" in cell:
            cell.outputs = merge_streams(cell.outputs)
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            if isinstance(view, dict) and "model_id" in view:
                view["model_id"] = widget_ids.setdefault(view["model_id"], f"widget-{len(widget_ids)}")
    path.write_text(dumps(nb), encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.authoring",
        description="Write exercises/*.ipynb from solutions/*.ipynb (answers replaced by stubs), "
                    "check that they are in step, or execute notebooks in place.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 and list the files when exercises/ is out of step")
    parser.add_argument("--execute", nargs="+", metavar="NB", type=Path,
                        help="execute these notebooks in place (outputs kept, timings stripped)")
    parser.add_argument("--course-root", type=Path, default=COURSE_ROOT, metavar="DIR",
                        help="folder holding solutions/ and exercises/ (default: %(default)s)")
    args = parser.parse_args(argv)
    root = args.course_root
    try:
        if args.execute:
            failed = []
            for path in args.execute:
                print(f"executing {path}", flush=True)
                try:
                    execute(path)
                except Exception as exc:  # noqa: BLE001 -- report every broken notebook, not just the first
                    failed.append(path)
                    print(f"FAILED {path}:\n{exc}", file=sys.stderr)
            return 1 if failed else 0
        if args.check:
            bad = stale(root)
            for path in bad:
                source = root / "solutions" / path.name
                why = "" if source.exists() else " (no solutions/ source: delete it?)"
                print(f"out of step: {path.relative_to(root)}{why}")
            if bad:
                print("run `make exercises` (python -m course_lib.authoring) and commit exercises/")
            return 1 if bad else 0
        (root / "exercises").mkdir(exist_ok=True)
        for path, text in generate(root).items():
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.relative_to(root)}")
        return 0
    except AuthoringError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
