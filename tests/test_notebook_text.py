"""What the notebooks' prose says agrees with their own outputs and the committed records.

Each test holds one kind of sentence that once contradicted a number the same
notebook prints, or a record it reads: the grading line a learner types, FA2's
head dims, chapter 01's overflow logit, chapter 08's and 10's ratios, chapter
09's and 10's local-memory bytes. They read JSON only: no notebook runs.
"""
import json
import math
import re

import pytest

from course_lib.core import conventions

import lectures
from conftest import REPO

NOTEBOOKS = sorted([*(REPO / "notebooks").glob("*.ipynb"), *(REPO / "solutions").glob("*.ipynb"),
                    *(REPO / "exercises").glob("*.ipynb")])


def cells(name):
    """The cells of notebooks/NAME.ipynb, as dicts with their source joined."""
    nb = json.loads((REPO / "notebooks" / f"{name}.ipynb").read_text())
    return [{**cell, "source": "".join(cell["source"])} for cell in nb["cells"]]


def markdown(name):
    return "\n".join(cell["source"] for cell in cells(name) if cell["cell_type"] == "markdown")


def printed(cell):
    """Everything a code cell printed (its stream outputs)."""
    return "".join("".join(out["text"]) for out in cell.get("outputs", []) if out["output_type"] == "stream")


def only(pattern, text):
    """The one match of pattern in text (the test fails if the sentence is gone or said twice)."""
    found = list(re.finditer(pattern, text))
    assert len(found) == 1, f"expected one sentence matching {pattern!r}, found {len(found)}"
    return found[0]


def records(name, **where):
    rows = [json.loads(line) for line in (REPO / "notebooks" / "records" / f"{name}.jsonl").read_text().splitlines()
            if line.strip()]
    rows = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    last = max(r.get("run_id") or r["run"] for r in rows)
    return [r for r in rows if (r.get("run_id") or r["run"]) == last]


# --- the grading line -------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_notebook_grades_with_its_own_python(path):
    """`!python` runs whichever python is first on the PATH (the wrong one outside `make lab`)."""
    nb = json.loads(path.read_text())
    bare = [cell["id"] for cell in nb["cells"] if re.search(r"!\s*python3? -m course_lib\.grade", "".join(cell["source"]))]
    assert bare == [], "write `!{sys.executable} -m course_lib.grade ...` (after `import sys`)"


@pytest.mark.parametrize("path", sorted((REPO / "exercises").glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_set_tells_the_learner_how_to_grade_it(path):
    text = "".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"])
    assert f"!{{sys.executable}} -m course_lib.grade {path.name}" in text and "import sys" in text


# --- facts about FlashAttention ---------------------------------------------------------------

def test_fa2_compiles_no_head_dim_224_or_160():
    assert conventions.FA2_HEAD_DIMS == (32, 64, 96, 128, 192, 256)
    assert conventions.fa2_head_dim(200) == 256 and conventions.fa2_head_dim(160) == 192


@pytest.mark.parametrize("name", ["06_masks", "07_tails_varlen_bad_input"])
def test_fa2_head_dims_in_chapters_are_the_conventions(name):
    listed = only(r"compiles (?:head dims )?((?:\d+, )+\d+ and \d+)", markdown(name)).group(1)
    dims = tuple(int(d) for d in re.findall(r"\d+", listed))
    assert 224 not in dims and dims == conventions.FA2_HEAD_DIMS


# --- chapter 01 -------------------------------------------------------------------------------

def test_chapter_01_names_the_float16_overflow_its_cell_prints():
    """exp(11) = 59,874 fits in float16 (max 65,504); the first integer logit that overflows is 12."""
    out = next(printed(c) for c in cells("01_naive_attention") if "so exp(s) overflows for s >" in printed(c))
    threshold = float(only(r"float16: max \S+, so exp\(s\) overflows for s > ([\d.]+)", out).group(1))
    text = markdown("01_naive_attention")
    summary = int(only(r"float16 overflows at a logit of (\d+)", text).group(1))
    lecture = int(only(r"A float16 logit of (\d+) is already too big", text).group(1))
    assert summary == lecture == math.ceil(threshold)


def test_chapter_01_leaves_exercise_1_7s_peak_multiple_unsaid():
    """Exercise 1.7 asks the learner to predict naive attention's peak as a multiple of the bytes of S,
    and to name the S-sized arrays alive at it: the lecture's prose states neither (its printed
    column of measurements may show the number, after the learner has read the code)."""
    sentences = re.split(r"(?<=[.;:])\s+", markdown("01_naive_attention"))
    told = [s for s in sentences if re.search(r"\bpeak", s) and re.search(
        r"\b(three|3(\.\d+)?)\s*(x\b|×|times|arrays|\$?S\$?-sized)|exp\(S - m\)|scaled scores", s, re.I)]
    assert told == [], "leave the peak's multiple of S, and which arrays make it, to exercise 1.7"


# --- chapter 08 -------------------------------------------------------------------------------

def _cpu_times():
    sweep = records("cpu_attention", benchmark="cpu_attention")
    return {(r["impl"], r["shape"][2], r["shape"][4], r["causal"]): r["time_s"] for r in sweep}


def test_chapter_08_quotes_the_speed_ups_its_record_holds():
    t = _cpu_times()
    ratios = {n: [t["naive", n, d, False] / t["flash_numba_cpu", n, d, False] for d in (64, 128)]
              for (impl, n, _, _) in t if impl == "naive"}
    text = markdown("08_numba_cpu")
    low = only(r"below \$N = 4096\$ the compiled kernel is only ([\d.]+)-([\d.]+)x", text)
    high = only(r"from \$N = 4096\$, where naive's time grows \d+x for 4x the work, it is\s+([\d.]+)-([\d.]+)x", text)
    below = [x for n, rs in ratios.items() if n < 4096 for x in rs]
    above = [x for n, rs in ratios.items() if n >= 4096 for x in rs]
    assert (float(low.group(1)), float(low.group(2))) == (round(min(below), 1), round(max(below), 1))
    assert (float(high.group(1)), float(high.group(2))) == (round(min(above), 1), round(max(above), 1))


def test_chapter_08_quotes_the_head_dim_cost_its_record_holds():
    t = _cpu_times()
    text = markdown("08_numba_cpu")
    found = only(r"`flash_numba_cpu` differ by ([\d.]+)-([\d.]+)x and PyTorch's by ([\d.]+)-([\d.]+)x", text)
    for impl, (lo, hi) in (("flash_numba_cpu", found.group(1, 2)), ("torch_sdpa_flash", found.group(3, 4))):
        r = [t[impl, n, 128, False] / t[impl, n, 64, False] for (i, n, d, c) in t
             if i == impl and d == 64 and not c and (impl, n, 128, False) in t]
        assert float(lo) == pytest.approx(min(r), abs=0.05) and float(hi) == pytest.approx(max(r), abs=0.05)


# --- chapters 09 and 10: the GPU records -------------------------------------------------------

def test_chapter_10_gives_the_floor_factor_its_cell_prints():
    cs = cells("10_gpu_performance")
    at = next(i for i, c in enumerate(cs) if "floor by a factor of about" in c["source"])
    out = next(printed(c) for c in reversed(cs[:at]) if c["cell_type"] == "code")
    flops_ms, bytes_ms = (float(x) for x in re.search(r"TFLOP in\s+([\d.]+) ms.*MB in\s+([\d.]+) ms", out).groups())
    said = int(only(r"floor by a factor of about (\d+)", cs[at]["source"]).group(1))
    assert said == pytest.approx(flops_ms / bytes_ms, rel=0.05)


def test_chapter_10_gives_the_intensity_as_n_over_element_size():
    """4 B H N^2 D FLOPs over 4 B H N D b bytes: N / b for every D, 1024 at N = 4096 in fp32."""
    cs = cells("10_gpu_performance")
    out = next(printed(c) for c in cs if "intensity" in printed(c) and "FLOP/byte" in printed(c))
    assert [int(x) for x in re.findall(r"intensity (\d+) FLOP/byte", out)] == [4096 // 4, 4096 // 4]
    text = markdown("10_gpu_performance")
    assert "$N / b$" in text and not re.search(r"N\s*/\s*2\b", text)


def test_chapter_10_counts_the_tilings_timed_per_head_dim():
    words = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "ten": 10}
    said = only(r"the autotuner timed (\w+) tilings of `tiled_staged` per head dim", markdown("10_gpu_performance"))
    tuned = records("gpu_steps", benchmark="gpu_steps_tune")
    assert {d: sum(r["D"] == d for r in tuned) for d in (64, 128)} == {64: words[said.group(1)], 128: words[said.group(1)]}


def test_chapter_10_names_tileds_micro_tile_as_recorded():
    """A thread of a (threads / tx) x tx block owns Br / (threads / tx) rows and Bc / tx keys of S."""
    said = only(r"`tiled`'s \$(\d+) \\times (\d+)\$ micro-tile issues (\d+)\s+scalar loads for (\d+) FMAs",
                markdown("10_gpu_performance"))
    tiling = next(r["tiling"] for r in records("gpu_steps", benchmark="gpu_steps", impl="cuda_tiled", D=64))
    rm, rn = tiling["Br"] // (tiling["threads"] // tiling["tx"]), tiling["Bc"] // tiling["tx"]
    assert [int(x) for x in said.groups()] == [rm, rn, rm + rn, rm * rn]


def test_chapter_09_splits_local_bytes_into_scores_and_spills():
    """s_i is 4 * Bc bytes of local memory by design; only what is left is spilled registers."""
    text = markdown("09_numba_cuda")
    row = {r["shape"][4]: r for r in records("gpu_attention", benchmark="gpu_attention", impl="flash_numba_cuda")}
    at64 = only(r"At \$D = 64\$ \(\$B_c = (\d+)\$\) the (\d+) bytes are \$s_i\$ alone: nothing\s+spills", text)
    at128 = only(r"At \$D = 128\$ \(\$B_c = (\d+)\$\) the (\d+) bytes are \$s_i\$'s (\d+) and (\d+) bytes", text)
    bc, local = (int(x) for x in at64.groups())
    assert (bc, local) == (row[64]["block_k"], row[64]["resources"]["local_mem_per_thread"]) and local == 4 * bc
    bc, local, scores, spilled = (int(x) for x in at128.groups())
    assert (bc, local) == (row[128]["block_k"], row[128]["resources"]["local_mem_per_thread"])
    assert scores == 4 * bc and spilled == local - scores


def test_sdpas_efficient_fp32_kernel_is_called_tensor_core():
    """allow_tf32 = False leaves it on the tensor cores (CUTLASS 3xTF32); the ncu record names it."""
    traffic = records("gpu_traffic", impl="torch_sdpa_efficient")
    assert traffic and all(any("cutlassF_f32" in k for k in r["kernels"]) for r in traffic)
    said_simt = re.compile(r"every fp32 number is on the SIMT|all three compute in\s+float32 on the SIMT")
    texts = {name: markdown(name) for name in ("09_numba_cuda", "10_gpu_performance")}
    texts |= {p.name: p.read_text() for p in (REPO / "benchmarks").glob("gpu_*.py")}
    assert [name for name, text in texts.items() if said_simt.search(text)] == []
    assert all("3xTF32" in texts[name] for name in ("09_numba_cuda", "10_gpu_performance"))


# --- every lecture with an exercise set points to it ------------------------------------------

@pytest.mark.parametrize("path", sorted((REPO / "exercises").glob("*.ipynb")), ids=lambda p: p.stem)
def test_a_lecture_ends_by_pointing_to_its_exercise_set(path):
    last = [c for c in cells(path.stem) if c["cell_type"] == "markdown"][-1]["source"]
    assert f"`exercises/{path.name}`" in last


# --- what nbval compares ----------------------------------------------------------------------

def sanitized(text):
    from nbval.plugin import get_sanitize_patterns
    for regex, replace in get_sanitize_patterns((REPO / "tests" / "sanitize.cfg").read_text()):
        text = re.sub(regex, replace, text)
    return text


def test_the_sanitizer_hides_only_lines_that_describe_the_machine():
    """Lines that start "this CPU's ... :" (or machine's, process's) differ from machine to machine and are not
    compared; a number in any other line is, even one a "this CPU" line would hide."""
    assert sanitized("this CPU's caches per core: {'L1': '48 KiB'}\nD = 64\n") == "this CPU's caches per core: MACHINE\nD = 64\n"
    assert sanitized("this process's OpenBLAS runs: Haswell kernels") == "this process's OpenBLAS runs: MACHINE"
    for kept in ("an L2 of 1024 KiB: tiles (Br, Bc) at D = 64, 128: [(128, 256), (64, 256)]",
                 "  this CPU's tiles: (64, 64)", "max diff below 1e-6: True", "relative gap 3.4e-07"):
        assert sanitized(kept) == kept


# --- what fits JupyterLab's output area -------------------------------------------------------

WIDTH = 110   # characters of an output line JupyterLab shows before it wraps the line mid-word
NARROW_CHAPTERS = tuple(f"{n:02d}" for n in range(17))      # every lecture
# (chapter, cell id, the line's start, why): the few lines that cannot be shorter.
VERDICT = "a check's verdict is one line by contract: the CLI and the tests read it whole"
WIDE_ALLOWED = (
    ("12", "l12-10", "PASS ", VERDICT),
    ("12", "l12-13", "PASS ", VERDICT),
    ("12", "l12-17", "PASS ", VERDICT),
    ("14", "e3281dca", "PASS ", VERDICT),
    ("14", "2988b8cc", "PASS ", VERDICT),
    ("14", "b928b518", "PASS ", VERDICT),
)


def wide_lines(nb, width=WIDTH):
    """(cell id, line) of every stored output line of notebook JSON ``nb`` wider than ``width``: what a cell
    printed (streams) and the plain text of its results and displays."""
    out = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            text = "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
            out += [(cell.get("id"), line) for line in text.splitlines() if len(line) > width]
    return out


@pytest.mark.parametrize("chapter", NARROW_CHAPTERS)
def test_no_stored_output_line_is_wider_than_jupyterlab_shows(chapter):
    wide = [(cid, line) for cid, line in wide_lines({"cells": lectures.cells(chapter)})
            if not any((chapter, cid) == (ch, c) and line.startswith(start) for ch, c, start, _why in WIDE_ALLOWED)]
    assert wide == [], "print narrower (views.text.say wraps a sentence; a table wants fewer columns):\n" + \
        "\n".join(f"{cid}: {line[:120]}" for cid, line in wide[:20])


def test_the_width_rule_catches_a_wide_line():
    nb = {"cells": [{"id": "x", "outputs": [{"output_type": "stream", "text": ["a" * 111 + "\n", "b" * 110]}]}]}
    assert wide_lines(nb) == [("x", "a" * 111)]
