"""Figures quoted outside the notebooks are their records' figures.

The impl registry's speed column (course_lib/kernels/__init__.py) is recomputed here, row by
row, from the run its letter names, and that run must be the newest that timed the row at the
quoted shape; benchmarks/README.md's results section must be what benchmarks/results.py
renders from the records now; the README's syllabus counts the exercises in solutions/, and
quotes no measurement of its own.
"""
from __future__ import annotations

import importlib.util
import json
import re
import statistics

import pytest

from course_lib import kernels

from conftest import REPO
from lectures import records as _records

_spec = importlib.util.spec_from_file_location("results", REPO / "benchmarks" / "results.py")
results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results)

# Where the registry's impls are timed at their defaults, by records file.
TIMING_BENCHMARKS = {"gpu_steps": "gpu_steps", "gpu_steps_chain": "gpu_steps_chain", "gpu_mma": "gpu_mma_time"}


def _quoted_rows(doc):
    """{impl: (TFLOP/s at D = 64, at D = 128, letter)} of the docstring's table, and its legend."""
    rows = dict(re.findall(r"^``(\w+)``\s.*?\s(\d+\.\d / \d+\.\d [a-z])$", doc, re.M))
    rows = {impl: (float(cell.split()[0]), float(cell.split()[2]), cell.split()[3]) for impl, cell in rows.items()}
    legend = {letter: (name, run, gpu) for letter, name, run, gpu in re.findall(
        r"\b([a-z]): notebooks/records/(\w+)\.jsonl, run (\S+), (NVIDIA [^;()]*?)\s*[;()]", re.sub(r"\s+", " ", doc))}
    return rows, legend


def _timed(impl, name):
    """The records of ``name`` that time ``impl`` at B*H = 64, N = 4096, not causal, in the registry's dtype."""
    dtype = "float16" if impl == "cuda_mma_f16" else "float32"
    return [r for r in _records(name) if r["benchmark"] == TIMING_BENCHMARKS[name] and r.get("impl") == impl
            and r["dtype"] == dtype and "tflops" in r and r["B"] * r["H"] == 64 and r["Nq"] == r["Nk"] == 4096
            and not r["causal"] and r.get("layer", "kernel") == "kernel"]


def _figure(records, run, d):
    return round(statistics.median(r["tflops"] for r in records if r["run"] == run and r["D"] == d), 1)


def _check_speed_column(doc):
    rows, legend = _quoted_rows(doc)
    assert len(rows) >= 16 and set(legend) == {letter for *_, letter in rows.values()}, (rows, legend)
    for impl in kernels.IMPLS:
        timed = {name: _timed(impl, name) for name in TIMING_BENCHMARKS}
        runs = [(r["run"], name) for name, recs in timed.items() for r in recs
                if {64, 128} <= {o["D"] for o in recs if o["run"] == r["run"]}]
        if not runs:
            assert impl not in rows, f"{impl}: quoted, but no run timed it at that shape"
            continue
        assert impl in rows, f"{impl}: timed in {sorted(set(runs))[-1]}, but the registry quotes no figure"
        d64, d128, letter = rows[impl]
        name, run, gpu = legend[letter]
        newest = max(runs, key=lambda rn: rn[0][:15])
        assert (run, name) == newest, f"{impl}: quotes run {run} of {name}; the newest that timed it is {newest}"
        assert {r["environment"]["gpu"] for r in timed[name] if r["run"] == run} == {gpu}
        assert (d64, d128) == (_figure(timed[name], run, 64), _figure(timed[name], run, 128)), \
            f"{impl}: the registry says {d64} / {d128}, run {run} of {name} measured " \
            f"{_figure(timed[name], run, 64)} / {_figure(timed[name], run, 128)}"


def test_every_speed_in_the_registry_is_its_newest_runs_figure():
    _check_speed_column(kernels.__doc__)


@pytest.mark.parametrize("wrong", [
    ("181.6 / 229.4 d", "58.9 / 80.4 d"),         # an old run's figure, still under the new run's letter
    ("42.1 / 44.1 c", "8.6 / 7.3 c"),             # the right figures of an older run
    ("run 20261206T074745+0000, NVIDIA H100", "run 20261206T074745+0000, NVIDIA H200"),   # the wrong card
])
def test_a_wrong_speed_in_the_registry_fails(wrong):
    doc = kernels.__doc__
    assert wrong[0] in doc
    with pytest.raises(AssertionError):
        _check_speed_column(doc.replace(wrong[0], wrong[1]))


def test_the_committed_results_are_a_fresh_rendering_of_the_records():
    """To change a figure, add its record and run ``python benchmarks/results.py``."""
    readme = results.README.read_text()
    assert results.BEGIN in readme and results.END in readme
    assert results.render_readme(readme) == readme, "benchmarks/README.md: run python benchmarks/results.py"
    registry = results.REGISTRY.read_text()
    assert results.render_registry(registry) == registry, "the registry's speed column: run python benchmarks/results.py"


def test_the_results_hold_the_figures_the_chapters_are_built_on():
    """A spot check of the rendering against records read here: cuda_tuned's ratios in chapter 10's run."""
    section = results.render_results()
    steps = [r for r in _records("gpu_steps") if r["benchmark"] == "gpu_steps" and r["D"] == 64
             and r["dtype"] == "float32" and r["B"] * r["H"] == 64 and r["Nq"] == 4096 and not r["causal"]]
    rate = {r["impl"]: r["tflops"] for r in steps}
    row = next(line for line in section.splitlines() if line.startswith("| `cuda_tuned` | float32 | 30.6"))
    assert f"{rate['cuda_tuned'] / rate['torch_naive']:.2f}x /" in row
    assert f"{rate['cuda_tuned'] / rate['torch_sdpa_efficient']:.2f}x /" in row


def _exercises():
    """{set number: exercises} from the check cells of solutions/."""
    counts = {}
    for path in sorted((REPO / "solutions").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        exercises = {c["metadata"]["course"]["exercise"] for c in cells
                     if "exercise" in c.get("metadata", {}).get("course", {})}
        counts[int(path.name[:2])] = len(exercises)
    return counts


def test_the_readmes_syllabus_counts_the_exercises_in_solutions():
    readme = (REPO / "README.md").read_text()
    table = dict(re.findall(r"^\| (\d\d) \|.*\| (\d+|-) \|$", readme, re.M))
    assert sorted(table) == [f"{n:02d}" for n in range(17)], table
    counts = _exercises()
    assert {int(k): int(v) for k, v in table.items() if v != "-"} == counts and table["00"] == "-"
    total = re.search(r"(\d+) graded exercises in (\d+) sets", readme)
    assert total and (int(total[1]), int(total[2])) == (sum(counts.values()), len(counts))
    per_set = re.search(r"graded exercises in \d+ sets, (\d+) to (\d+) a set", readme)
    assert per_set and (int(per_set[1]), int(per_set[2])) == (min(counts.values()), max(counts.values()))


def test_chapter_00_orients_a_newcomer_to_every_chapter_and_set():
    from lectures import text

    orientation = text("00", "l00-02")
    rows = re.findall(r"\| (\d\d) \| ", orientation)
    assert rows == [f"{n:02d}" for n in range(17)]
    counts = _exercises()
    sets = re.search(r"one exercise set per chapter (\d\d)-(\d\d) \((\d+) graded exercises\)", orientation)
    assert sets and (int(sets[1]), int(sets[2]), int(sets[3])) == (min(counts), max(counts), sum(counts.values()))
    assert "lecture only" not in orientation


def test_the_readme_quotes_no_measurement():
    """Measured figures live in benchmarks/README.md, rendered from the records, not in the README."""
    readme = (REPO / "README.md").read_text()
    assert not re.findall(r"\b2026\d{4}T\d{6}|\b\d+(?:\.\d+)?x\b|TFLOP/s|TB/s", readme)


def test_benchmarks_readme_quotes_figures_only_in_its_rendered_section():
    text = results.README.read_text()
    written_by_hand = text.split(results.BEGIN)[0] + text.split(results.END)[1]
    assert not re.findall(r"\b2026\d{4}T\d{6}|\b\d+(?:\.\d+)?x\b|\d TFLOP/s|TB/s", written_by_hand)
