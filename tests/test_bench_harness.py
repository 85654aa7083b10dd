"""The measuring harness every benchmark script shares (course_lib.bench), and the scripts themselves.

A script mostly needs a GPU, so the tests cannot run it; they hold what can be held without one:
every script parses ``--help`` and every import it makes (inside functions too) resolves, and a
record written through the harness keeps the keys of the committed records of its kind.
"""
import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from course_lib import bench
from course_lib.bench import cases, ncu

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RECORDS = ROOT / "notebooks" / "records"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def load_script(name):
    """benchmarks/<name>.py as a module (not run: ``__name__`` is not ``__main__``)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def top_level_names(path):
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def all_imports(path):
    """(module, [names]) of every absolute import in ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module, [a.name for a in node.names]))
    return found


def imports(path):
    """(module, [names]) of every import of course_lib or of a sibling script in ``path``, at any depth."""
    siblings = {p.stem for p in SCRIPTS}
    return [(m, names) for m, names in all_imports(path) if m.split(".")[0] == "course_lib" or m in siblings]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_script_parses_help_without_a_gpu(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=ROOT,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("usage:")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_import_a_benchmark_script_makes_resolves(script):
    """Imports inside functions too: a script imports most of what it runs lazily, after --help."""
    broken = []
    for module, names in imports(script):
        if module.split(".")[0] == "course_lib":
            try:
                mod = importlib.import_module(module)
            except ImportError as error:
                broken.append(f"{module}: {error}")
                continue
            broken += [f"{module}.{n}" for n in names if not hasattr(mod, n)
                       and not (hasattr(mod, "__path__") and importlib.util.find_spec(f"{module}.{n}"))]
        else:
            defined = top_level_names(BENCHMARKS / f"{module}.py")
            broken += [f"{module}.{n}" for n in names if n not in defined]
    assert not broken, f"{script.name} imports what is not there: {broken}"


def test_no_benchmark_reaches_into_tests_or_edits_the_import_path():
    test_modules = {p.stem for p in (ROOT / "tests").glob("*.py")}
    for script in SCRIPTS:
        assert "sys.path" not in script.read_text(), script.name
        assert not {m.split(".")[0] for m, _ in all_imports(script)} & test_modules, script.name


# -- the summary of rounds ---------------------------------------------------------------------

def test_spread_names_its_keys_after_the_unit_each_record_kind_already_uses():
    assert bench.spread([3.0, 1.0, 2.0, 10.0]) == {"min": 1.0, "median": 2.5, "max": 10.0}
    assert bench.spread([3, 1, 2], "s") == {"min_s": 1.0, "median_s": 2.0, "max_s": 3.0}
    assert bench.spread([3, 1, 2], "ms", every=True) == {"min_ms": 1.0, "median_ms": 2.0, "max_ms": 3.0,
                                                         "rounds": 3, "times_ms": [3.0, 1.0, 2.0]}
    with pytest.raises(ValueError, match="at least one"):
        bench.spread([])


def test_interleaved_rounds_alternate_the_calls_after_a_warm_up():
    order = []
    times = bench.interleaved_rounds({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3)
    assert order == ["a", "b"] * 4                      # one warm-up round, then three timed ones
    assert {name: len(ts) for name, ts in times.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for ts in times.values() for t in ts)


def test_verdict_is_one_line_pass_fail_or_error():
    def fails():
        raise AssertionError("max abs error 0.5\nworst at (0, 1)")

    assert bench.verdict(lambda: None) == "PASS"
    assert bench.verdict(fails) == "FAIL max abs error 0.5"
    assert bench.verdict(lambda: 1 / 0).startswith("ERROR ZeroDivisionError")


# -- the one record writer ---------------------------------------------------------------------

def test_record_file_appends_one_sorted_line_a_record_flushed_at_once_with_its_stamp(tmp_path):
    path = tmp_path / "sub" / "r.jsonl"
    with bench.RecordFile(path, run="r1", run_id="r1", environment={"gpu": "none"}) as out:
        out.write({"benchmark": "x", "z": 1, "a": 2})
        first = path.read_text()                        # readable before the file is closed
        out.write({"benchmark": "y", "run": "own"})     # a record's own field wins over the stamp
    lines = path.read_text().splitlines()
    assert first == lines[0] + "\n"
    assert lines[0] == json.dumps({"a": 2, "benchmark": "x", "environment": {"gpu": "none"}, "run": "r1",
                                   "run_id": "r1", "z": 1})
    assert json.loads(lines[1])["run"] == "own"
    bench.write_records(path, [{"benchmark": "z"}])
    assert len(path.read_text().splitlines()) == 3      # appended, never overwritten


def committed_keys(name, **match):
    """The key sets of the latest committed run's records of ``name`` matching ``match``: a record written
    now must have one of them (a record kind may have two, e.g. the error study's KL only up to 16K keys)."""
    records = bench.latest_run(bench.load_records(RECORDS / name, **match))
    assert records, f"no committed {name} records for {match}"
    return {frozenset(r) for r in records}


def new_keys(path, **match):
    found = {frozenset(r) for r in bench.load_records(path, **match)}
    assert found, f"nothing written to {path} for {match}"
    return found


def test_edge_dma_writes_the_committed_records_keys(tmp_path):
    out = tmp_path / "edge_dma.jsonl"
    load_script("edge_dma").main(["--seqlen-k", "2048", "--rounds", "2", "--bandwidth", "50e6", "--out", str(out)])
    assert new_keys(out) <= committed_keys("edge_dma.jsonl")


def test_lowp_error_study_writes_the_committed_records_keys(tmp_path):
    out = tmp_path / "lowp_error.jsonl"
    load_script("lowp_error_study").main(["--lengths", "256", "--scales", "1", "--outliers", "4", "--out", str(out)])
    for sweep in ("length", "scale", "outlier"):
        assert new_keys(out, sweep=sweep) <= committed_keys("lowp_error.jsonl", sweep=sweep), sweep


def test_capstone_writes_the_committed_records_keys(tmp_path, monkeypatch):
    """The conversion group at a small N, through the script's own main and writer."""
    capstone = load_script("capstone")
    monkeypatch.setattr(capstone, "bandwidth_group", lambda rounds: [])
    monkeypatch.setattr(capstone, "length_and_mask_groups", lambda rounds, lengths: [])
    monkeypatch.setattr(capstone, "conversion_group", partial(capstone.conversion_group, n=96))
    out = tmp_path / "capstone.jsonl"
    capstone.main(["--rounds", "2", "--out", str(out)])
    assert new_keys(out) <= committed_keys("capstone_cpu.jsonl", group="conversion")


# -- what the simulator tests and the GPU benchmarks share --------------------------------------

def test_the_awkward_cases_cover_what_they_claim():
    forward = cases.FORWARD_CASES
    assert any(c[2] < c[1] for c in forward.values())                      # GQA / MQA
    assert any(c[3] > c[4] for c in forward.values()) and any(c[3] < c[4] for c in forward.values())
    assert any(c[-1] > 1 for c in forward.values())                        # split-KV
    assert {"causal", "window_size", "softcap", "alibi_slopes"} <= {k for c in forward.values() for k in c[7]}
    assert set(cases.BACKWARD_CASES) <= set(forward)                       # the same names, backward's sizes
    assert cases.CUDA_IMPLS and "flash_numba_cuda" in cases.CUDA_IMPLS


def test_ncu_rows_are_the_profiled_kernels_in_launch_order():
    page = "\n".join([
        '"ID","Kernel Name","dram__bytes_read.sum","gpu__time_duration.sum"',
        '"","","byte","nsecond"',                                           # ncu's units line
        '"0","flash_kernel","1,024","2.5"',
        '"1","merge_kernel","512","n/a"',
        '"2","not_profiled","n/a","n/a"',                                   # no first metric: not a row
    ])
    rows = ncu.kernel_rows(page, ["dram__bytes_read.sum", "gpu__time_duration.sum"])
    assert rows == [{"kernel": "flash_kernel", "dram__bytes_read.sum": 1024.0, "gpu__time_duration.sum": 2.5},
                    {"kernel": "merge_kernel", "dram__bytes_read.sum": 512.0}]
    cmd = ncu.command("ncu", ["a", "b"], "x.py", ["--child"], tuned="t.jsonl")
    assert cmd[:2] == ["ncu", "--clock-control"] and "a,b" in cmd and cmd[-2:] == ["--tuned", "t.jsonl"]
