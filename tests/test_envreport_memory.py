"""The environment report (chapter 00) and the memory wall (chapter 01)."""
import io
import platform

import numpy as np

import course_lib
from course_lib.bench import envreport
from course_lib.core import machine
from course_lib.models import memory

from conftest import make_qkv

# -- the environment report ------------------------------------------------------

def report_lines():
    """The printed report as {name: value}; a line that starts with blanks goes on with the value above."""
    text = io.StringIO()
    envreport.report(file=text)
    values, name = {}, None
    for line in text.getvalue().splitlines():
        assert len(line) <= envreport.WIDTH, line
        if line.startswith(" "):
            values[name] += " " + line.strip()
        else:
            name, value = (part.strip() for part in line.split(" : ", 1))
            values[name] = value
    return values


def test_report_names_python_and_every_pinned_package():
    lines = report_lines()
    assert lines["python"] == platform.python_version()
    assert lines["numpy"] == np.__version__
    assert lines["course_lib"] == course_lib.__version__
    for name in ("numba", "numba-cuda", "ml_dtypes"):
        assert lines[name] != ""


def test_report_names_the_cpu_cores_gpu_and_available_impls():
    lines = report_lines()
    assert lines["cpu"] and lines["cpu"] != "unknown"
    assert lines["cpu cores"].split()[0].isdigit()
    assert lines["gpu"].split("]")[0] in ("[cuda", "[simulator", "[none")
    assert lines["impls"].split(", ") == course_lib.available_impls()
    assert "reference" in lines["impls"]


def test_collect_gives_the_same_facts_as_a_dict():
    facts = envreport.collect()
    for key in ("python", "numpy", "numba", "numba-cuda", "ml_dtypes", "course_lib",
                "cpu", "cpu_cores", "gpu", "impls", "date"):
        assert key in facts
    assert facts["cpu_cores"]["usable"] <= facts["cpu_cores"]["logical"]
    assert facts["gpu"]["kind"] in ("cuda", "simulator", "none")


def test_simulator_is_reported_when_numba_runs_it(monkeypatch):
    monkeypatch.setattr(machine, "simulator_enabled", lambda: True)
    assert machine.gpu()["kind"] == "simulator"
    assert "NUMBA_ENABLE_CUDASIM" in machine.gpu()["name"]


def test_a_numpy_that_breaks_numba_cuda_gets_a_note():
    facts = {**envreport.collect(), "numpy": "2.5.2", "numba-cuda": "0.30.4"}
    assert any("numpy 2.5.2 breaks" in note for note in envreport.notes(facts))
    assert "note" in envreport.format_report(facts)
    facts = {**facts, "numpy": "2.4.6"}
    assert envreport.notes(facts) == []


def test_a_missing_package_is_reported_not_raised():
    assert envreport.package_version("surely-not-a-real-distribution") == "not installed"


# -- the memory model ----------------------------------------------------------------

def test_score_bytes_is_batch_heads_nq_nk_itemsize():
    assert memory.score_bytes(2, 3, 5, 7, "float16") == 2 * 3 * 5 * 7 * 2
    assert memory.score_bytes(1, 32, 1024, dtype=np.float32) == 32 * 1024 * 1024 * 4
    assert memory.score_bytes(1, 1, 10, dtype="bfloat16") == 200


def test_qkvo_bytes_is_linear_in_n_shared_kv_heads_once():
    assert memory.qkvo_bytes(1, 8, 100, 64, "float32") == 4 * 8 * 100 * 64 * 4
    assert memory.qkvo_bytes(1, 8, 200, 64, "float32") == 2 * memory.qkvo_bytes(1, 8, 100, 64, "float32")
    assert memory.qkvo_bytes(1, 8, 100, 64, "float32", heads_k=2) == (2 * 8 + 2 * 2) * 100 * 64 * 4


def test_format_bytes_uses_powers_of_1024():
    assert memory.format_bytes(512) == "512 B"
    assert memory.format_bytes(1536) == "1.5 KiB"
    assert memory.format_bytes(3 * 2**30) == "3 GiB"


# -- the measurement -------------------------------------------------------------------

def test_peak_bytes_sees_a_numpy_allocation():
    n = 1_000_000
    peak = memory.peak_bytes(np.ones, n)
    assert 8 * n <= peak < 8 * n + 64 * 1024


def test_naive_peak_bytes_grow_like_n_squared_as_modelled():
    rng = np.random.default_rng(0)
    heads, head_dim = 2, 16
    sizes = (256, 512, 1024)
    peaks = []
    for n in sizes:
        q, k, v = make_qkv(rng, 1, heads, heads, n, n, head_dim)
        peaks.append(memory.peak_bytes(course_lib.attention, q, k, v, impl="naive"))
    for n, peak in zip(sizes, peaks):
        s = memory.score_bytes(1, heads, n, dtype=np.float64)
        assert s <= peak <= 8 * s, f"N={n}: peak {peak} is not a small multiple of S's {s} bytes"
    for small, large in zip(peaks, peaks[1:]):
        growth = large / small  # the model says 4 when N doubles
        assert 3.0 <= growth <= 5.0, f"doubling N grew the peak {growth:.2f}x, the N^2 model says 4x"


def test_peak_bytes_leaves_tracing_as_it_found_it():
    import tracemalloc
    before = tracemalloc.is_tracing()
    memory.peak_bytes(np.zeros, 10)
    assert tracemalloc.is_tracing() == before
