"""cudacheck: every planted bug is named, every fixed twin passes, and the verdicts are deterministic."""
import importlib.util
import json
import math
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from numba import cuda, float32

from course_lib import cudacheck
from course_lib.cudacheck.corpus import CASES
from course_lib.cudacheck.sanitizer_record import RECORD, TOOLS, comparison_table, load_record

from conftest import REPO


def run(c, variant):
    args = c.args()
    return cudacheck.check(getattr(c, variant), c.griddim, c.blockdim, *args), args


# --------------------------------------------------------------- the corpus


def test_the_corpus_has_at_least_12_bugs_of_every_kind():
    assert len(CASES) >= 12
    assert {c.expect for c in CASES} == set(cudacheck.KINDS)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_every_planted_bug_is_flagged_with_its_kind(c):
    report, _ = run(c, "buggy")
    assert not report.ok
    assert c.expect in report.kinds, str(report)
    assert str(report).startswith(f"cudacheck {report.launch()}: ")


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_every_fixed_twin_passes_and_gives_the_spec_answer(c):
    report, args = run(c, "fixed")
    assert report.ok, str(report)
    assert "no races, barrier errors, out-of-bounds or uninitialized reads" in str(report)
    results = [a.copy_to_host() if hasattr(a, "copy_to_host") else a for a in args]
    fresh = [np.zeros(a.shape, a.dtype) if isinstance(a, cudacheck.Uninitialized) else a for a in c.args()]
    for pos, want in c.spec(*fresh).items():
        np.testing.assert_allclose(results[pos], want, rtol=1e-5, atol=1e-5)


def test_verdicts_are_deterministic():
    c = next(c for c in CASES if c.name == "tile_loop_no_second_barrier")
    assert str(run(c, "buggy")[0]) == str(run(c, "buggy")[0])


# ------------------------------------------------ what a finding says


@cuda.jit
def neighbour_sum(a, out):
    tile = cuda.shared.array(64, float32)
    t, i = cuda.threadIdx.x, cuda.grid(1)
    tile[t] = a[i]
    out[i] = tile[t] + tile[(t + 1) % 64]


def test_a_race_names_block_threads_array_index_and_both_lines():
    report = cudacheck.check(neighbour_sum, 2, 64, np.ones(128, np.float32), np.zeros(128, np.float32))
    first = report.findings[0]   # thread 0 runs first and reads tile[1]; thread 1 then overwrites it
    assert first.kind == "race" and first.array == "shared array `tile`"
    assert first.block == (0,) and first.thread == (1,) and first.index == (1,)
    code = neighbour_sum.py_func.__code__
    write_line, read_line = code.co_firstlineno + 4, code.co_firstlineno + 5  # from the @cuda.jit line
    assert first.line == write_line
    text = first.message
    assert "thread 1 of block 0 writes tile[1]" in text and "which thread 0 read" in text
    assert f"line {read_line} of neighbour_sum (`out[i] = tile[t] + tile[(t + 1) % 64]`)" in text
    assert f"line {write_line} of neighbour_sum (`tile[t] = a[i]`)" in text
    assert "cuda.syncthreads()" in text
    assert first.count == 2 * 63   # every slot but the one thread 63 reads after thread 0 wrote it, per block


def test_an_out_of_bounds_read_names_the_axis_and_the_fix():
    c = next(c for c in CASES if c.name == "no_tail_guard")
    report, _ = run(c, "buggy")
    f = report.findings[0]
    assert (f.kind, f.block, f.thread, f.index, f.array) == ("out_of_bounds", (1,), (36,), (100,), "`a`")
    assert "index 100 is outside axis 0 of length 100" in f.message and "if i < a.shape[0]:" in f.message
    assert f.count == 28   # threads 36..63 of block 1


def test_a_negative_index_is_flagged_though_numba_wraps_it():
    c = next(c for c in CASES if c.name == "stencil_negative_index")
    f = run(c, "buggy")[0].findings[0]
    assert f.index == (-1,) and "numba wraps it to 63" in f.message


def test_a_2d_index_past_its_row_is_out_of_bounds():
    @cuda.jit
    def row_overrun(a, out):
        r, c = cuda.grid(2)
        if r < a.shape[0] and c < a.shape[0]:   # wrong axis: a is (4, 2)
            out[r, c] = a[r, c]
    report = cudacheck.check(row_overrun, 1, (4, 4), np.ones((4, 2), np.float32), np.zeros((4, 2), np.float32))
    assert report.kinds == {"out_of_bounds"}
    assert "index 2 is outside axis 1 of length 2" in report.findings[0].message
    assert report.findings[0].thread == (0, 2)


def test_a_skipped_barrier_names_who_waits_and_who_left():
    c = next(c for c in CASES if c.name == "early_return_before_barrier")
    f = run(c, "buggy")[0].findings[0]
    assert f.kind == "barrier"
    assert "in block 1, threads 36-63 finished the kernel without reaching" in f.message
    assert "that threads 0-35 wait at" in f.message


def test_threads_at_two_different_barriers_are_flagged():
    c = next(c for c in CASES if c.name == "a_barrier_per_branch")
    f = run(c, "buggy")[0].findings[0]
    assert "threads 0-31 wait at cuda.syncthreads()" in f.message and "threads 32-63 wait at the one" in f.message


def test_reading_a_slot_written_later_between_barriers_is_a_race():
    c = next(c for c in CASES if c.name == "reverse_no_barrier")
    assert run(c, "buggy")[0].kinds == {"race"}


def test_a_race_between_blocks_on_global_memory_is_flagged():
    c = next(c for c in CASES if c.name == "blocks_add_to_one_element")
    report = run(c, "buggy")[0]
    assert any("(another block)" in f.message and "cuda.atomic" in f.message for f in report.findings)


# ------------------------------------------- what a kernel may use


@cuda.jit(device=True)
def scaled_exp(x, m):
    return math.exp(x - m)


@cuda.jit
def softmax_rows(s, out):
    # one thread per row; the row's scores staged in local memory
    r = cuda.grid(1)
    if r < s.shape[0]:
        row = cuda.local.array(8, numba.float32)
        m = numba.float32(-math.inf)
        for j in range(s.shape[1]):
            row[j] = s[r, j]
            m = max(m, row[j])
        total = numba.float32(0)
        for j in range(s.shape[1]):
            row[j] = scaled_exp(row[j], m)
            total += row[j]
        for j in range(s.shape[1]):
            out[r, j] = row[j] / total


def test_device_functions_local_arrays_math_and_float32_run():
    s = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    out = np.zeros_like(s)
    report = cudacheck.check(softmax_rows, 1, 8, s, out)
    assert report.ok, str(report)
    want = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, want / want.sum(axis=1, keepdims=True), rtol=1e-5)
    assert report.traffic["global reads"] == 40 and report.traffic["global writes"] == 40


def test_atomics_do_not_race_with_each_other():
    c = next(c for c in CASES if c.name == "blocks_add_to_one_element")
    report, args = run(c, "fixed")
    assert report.ok and args[1][0] == pytest.approx(c.args()[0].sum())


def test_a_kernel_that_raises_names_the_thread_and_line():
    @cuda.jit
    def divide(a, out):
        i = cuda.grid(1)
        out[i] = a[i] + 1 // (i - 3)
    with pytest.raises(cudacheck.KernelError, match=r"thread 3 of block 0 raised ZeroDivisionError at line"):
        cudacheck.check(divide, 1, 8, np.ones(8, np.int64), np.zeros(8, np.int64))


def test_an_unmodelled_api_is_refused_with_what_is_modelled():
    @cuda.jit
    def sleepy(out):
        cuda.nanosleep(100)
        out[0] = 1
    with pytest.raises(cudacheck.KernelError, match="cudacheck does not model cuda.nanosleep; .* shfl.* syncwarp"):
        cudacheck.check(sleepy, 1, 1, np.zeros(1, np.float32))


def test_a_float_index_is_a_clear_type_error():
    @cuda.jit
    def half(a):
        a[cuda.grid(1) / 2] = 1
    with pytest.raises(cudacheck.KernelError, match=r"at line \d+ of half \(`a\[cuda.grid\(1\) / 2\] = 1`\): "
                       "index into a must be an integer, got float"):
        cudacheck.check(half, 1, 2, np.zeros(2, np.float32))


def test_bad_launches_are_refused():
    with pytest.raises(ValueError, match="blockdim"):
        cudacheck.check(neighbour_sum, 1, 0, np.ones(1), np.ones(1))
    with pytest.raises(ValueError, match="at most 1024"):
        cudacheck.check(neighbour_sum, 1, (64, 32), np.ones(1), np.ones(1))
    with pytest.raises(TypeError, match="takes 2 arguments"):
        cudacheck.check(neighbour_sum, 1, 64, np.ones(64))


def test_the_kernel_objects_of_numbas_simulator_are_checked_too():
    code = (
        "import numpy as np\n"
        "from numba import cuda, float32\n"
        "from course_lib import cudacheck\n"
        "@cuda.jit\n"
        "def k(a, out):\n"
        "    tile = cuda.shared.array(32, float32)\n"
        "    tile[cuda.threadIdx.x] = a[cuda.threadIdx.x]\n"
        "    out[cuda.threadIdx.x] = tile[31 - cuda.threadIdx.x]\n"
        "print(type(k).__name__, sorted(cudacheck.check(k, 1, 32, np.ones(32, np.float32), np.ones(32, np.float32)).kinds))\n"
    )
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True)
    assert out.stdout.strip() == "FakeCUDAKernel ['race']"


def test_cudacheck_imports_alone_as_the_kernel_sandbox_holds_it():
    """The kernel sandbox binds the package beside its worker: no course_lib and no numba around it."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'course_lib')!r})\n"
        "import numpy as np\n"
        "import cudacheck\n"
        "cuda = cudacheck.STANDIN\n"
        "@cuda.jit\n"
        "def shift(a):\n"
        "    a[cuda.threadIdx.x] = a[cuda.threadIdx.x + 1]\n"
        "print(sorted(cudacheck.check(shift, 1, 4, np.zeros(4, np.float32)).kinds))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'course_lib', 'numba'}))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.split("\n")[:2] == ["['out_of_bounds', 'race']", "[]"], out.stdout

# ------------------------------------ what the GPU does, where Python differs


@cuda.jit(device=True)
def stage_and_sum(x, with_last_barrier):
    buf = cuda.shared.array(32, float32)
    buf[cuda.threadIdx.x] = x
    cuda.syncthreads()
    total = float32(0)
    for j in range(32):
        total += buf[j]
    if with_last_barrier:
        cuda.syncthreads()
    return total


def test_a_shared_array_is_one_per_block_however_often_declared():
    @cuda.jit
    def twice(a, out, with_last_barrier):
        t = cuda.threadIdx.x
        out[t] = stage_and_sum(a[t], with_last_barrier) + stage_and_sum(2 * a[t], with_last_barrier)

    a, out = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    report = cudacheck.check(twice, 1, 32, a, out, False)
    assert report.kinds == {"race"} and report.findings[0].array == "shared array `buf`"
    assert "`buf` is one array for the whole block, however often its declaration runs" in str(report)
    fixed = cudacheck.check(twice, 1, 32, a, out, True)
    assert fixed.ok, str(fixed)
    np.testing.assert_array_equal(out, np.full(32, 3 * a.sum(), np.float32))


def test_a_device_array_passed_twice_is_one_buffer_host_arrays_two():
    @cuda.jit
    def shift(a, out):
        i = cuda.grid(1)
        out[i] = a[i - 1] if i > 0 else 0

    @cuda.jit
    def double(a, out):
        i = cuda.grid(1)
        out[i] = 2 * a[i]

    x = cudacheck.to_device(np.arange(64, dtype=np.float32))
    report = cudacheck.check(shift, 1, 64, x, x)
    assert report.kinds == {"race"}, str(report)
    assert report.findings[0].array == "`a` (the same device array as `out`)"
    assert "`a` and `out` are one device array in this launch" in report.findings[0].message
    assert report.global_reads == {"a": 63, "out": 0}
    y = cudacheck.to_device(np.arange(64, dtype=np.float32))
    assert cudacheck.check(double, 2, 32, y, y).ok   # each element read, then written, by one thread
    np.testing.assert_array_equal(y.copy_to_host(), 2 * np.arange(64, dtype=np.float32))
    host = np.arange(64, dtype=np.float32)   # a launch copies each host argument to a buffer of its own
    assert cudacheck.check(shift, 1, 64, host, host).ok


def test_math_gives_the_gpus_ieee_results_where_python_raises():
    @cuda.jit
    def edges(out):
        out[0] = math.log(0.0)
        out[1] = math.exp(1000.0)
        out[2] = math.sqrt(-1.0)
        out[3] = math.log(-1.0)
        out[4] = math.pow(0.0, -1.0)
        out[5] = math.log(math.e)

    out = np.zeros(6)
    assert cudacheck.check(edges, 1, 1, out).ok
    np.testing.assert_array_equal(out, [-np.inf, np.inf, np.nan, np.nan, np.inf, 1.0])


def test_an_integer_cast_wraps_to_its_width_as_on_the_gpu():
    @cuda.jit
    def casts(out):
        tmp = cuda.local.array(2, numba.int32)   # an integer type still names a dtype
        tmp[0] = numba.int32(2 ** 31 + 5)
        tmp[1] = cuda.int32(-1)
        out[0] = numba.int16(33000)
        out[1] = numba.uint8(-1)
        out[2] = tmp[0]
        out[3] = numba.int32(3.7)
        out[4] = tmp[1]

    out = np.zeros(5, np.int64)
    assert cudacheck.check(casts, 1, 1, out).ok
    assert out.tolist() == [-32536, 255, -2 ** 31 + 5, 3, -1]


def test_a_tile_sized_for_a_bigger_block_is_named_as_the_cause():
    c = next(c for c in CASES if c.name == "tile_sized_for_another_block")
    report, _ = run(c, "buggy")
    assert report.kinds == {"uninitialized"}
    assert "`tile` has 64 elements, but the block has 32 threads (blockdim 32)" in report.findings[0].message
    assert "for e in range(t, 64, cuda.blockDim.x)" in report.findings[0].message
    other = next(c for c in CASES if c.name == "shared_tail_never_written")   # a tile as big as its block
    assert "elements, but the block has" not in str(run(other, "buggy")[0])


def test_a_write_fenced_before_an_atomic_is_seen_by_later_atomics():
    c = next(c for c in CASES if c.name == "last_block_without_fence")
    assert run(c, "fixed")[0].ok                      # the CUDA guide's single-pass sum
    buggy = run(c, "buggy")[0].findings[0]            # the same without its threadfence
    assert buggy.kind == "race" and buggy.array == "`partial`"
    assert "put cuda.threadfence() after the write, before the atomic" in buggy.message

    @cuda.jit
    def fence_without_atomic(x, out):
        if cuda.blockIdx.x == 0:
            x[0] = 1
            cuda.threadfence()    # a fence alone orders nothing between blocks: no atomic says the write is done
        else:
            out[0] = x[0]

    report = cudacheck.check(fence_without_atomic, 2, 1, np.zeros(1, np.float32), np.zeros(1, np.float32))
    assert report.kinds == {"race"} and "Nothing orders two blocks" in str(report)


def test_shuffles_and_votes_give_each_lane_what_the_warp_gives():
    @cuda.jit
    def warp_ops(a, out):
        i = cuda.grid(1)
        full = 0xFFFFFFFF
        total = a[i]
        for bit in (16, 8, 4, 2, 1):               # butterfly: every lane ends with the warp's sum
            total += cuda.shfl_xor_sync(full, total, bit)
        out[0, i] = total
        out[1, i] = cuda.shfl_sync(full, a[i], 3)   # lane 3's value, to every lane
        out[2, i] = cuda.shfl_up_sync(full, a[i], 1)   # lane 0 keeps its own
        out[3, i] = cuda.ballot_sync(full, a[i] > 0)
        out[4, i] = cuda.all_sync(full, a[i] > -100) + 2 * cuda.any_sync(full, a[i] > 100)

    a = np.arange(64, dtype=np.float64) - 20
    out = np.zeros((5, 64))
    report = cudacheck.check(warp_ops, 1, 64, a, out)
    assert report.ok, str(report)
    w = a.reshape(2, 32)
    np.testing.assert_array_equal(out[0], np.repeat(w.sum(axis=1), 32))
    np.testing.assert_array_equal(out[1], np.repeat(w[:, 3], 32))
    np.testing.assert_array_equal(out[2], np.concatenate([[w[0, 0]], w[0, :-1], [w[1, 0]], w[1, :-1]]))
    ballots = [sum(1 << k for k in range(32) if row[k] > 0) for row in w]
    np.testing.assert_array_equal(out[3], np.repeat(ballots, 32))
    np.testing.assert_array_equal(out[4], np.ones(64))


def test_a_shuffle_mask_naming_an_absent_lane_is_a_barrier_finding():
    c = next(c for c in CASES if c.name == "shuffle_inside_a_branch")
    finding = run(c, "buggy")[0].findings[0]
    assert finding.kind == "barrier"
    assert "its mask 0xffffffff names threads 16-31, which finished the kernel" in finding.message


# ---------------------------------------- the record made on the H200


RECORDED = [c for c in CASES if c.name in {r["case"] for r in load_record()}]


def test_the_record_holds_every_tool_for_its_cases_and_versions():
    records = load_record()
    assert len(RECORDED) >= 16 and {r["case"] for r in records} <= {c.name for c in CASES}
    assert {(r["case"], r["variant"], r["tool"]) for r in records} == \
        {(c.name, v, t) for c in RECORDED for v in ("buggy", "fixed") for t in TOOLS}
    env = records[0]["environment"]
    for key in ("date", "gpu", "driver", "cuda", "compute_sanitizer", "numba", "numba-cuda"):
        assert env[key] and env[key] != "none", key
    assert "H200" in env["gpu"]


@pytest.mark.parametrize("c", RECORDED, ids=lambda c: c.name)
def test_cudacheck_flags_what_the_sanitizer_flagged_passes_twins(c):
    records = {(r["variant"], r["tool"]): r for r in load_record() if r["case"] == c.name}
    buggy, fixed = run(c, "buggy")[0], run(c, "fixed")[0]
    assert sorted(buggy.kinds) == records[("buggy", TOOLS[0])]["cudacheck"]["kinds"]  # the record is current
    for tool in TOOLS:
        if records[("buggy", tool)]["sanitizer"]["flagged"]:
            assert not buggy.ok
        assert not records[("fixed", tool)]["sanitizer"]["flagged"]
        assert records[("fixed", tool)]["sanitizer"]["status"] == "ok"
    assert fixed.ok


def test_the_table_shows_date_versions_and_what_the_sanitizer_missed():
    table = comparison_table()
    env = load_record()[0]["environment"]
    assert table.startswith(f"Measured on {env['date'][:10]}: {env['gpu']}, driver {env['driver']}")
    assert f"compute-sanitizer {env['compute_sanitizer']}" in table
    assert table.count("\n| `") == len(CASES)
    assert "| `reverse_no_barrier` (" in table and "| flagged (" in table
    assert "compute-sanitizer flagged nothing in" in table
    assert "- `blocks_add_to_one_element`: racecheck checks shared memory only" in table
    for c in CASES:
        if c not in RECORDED:   # added since the run on the GPU: the table says so
            row = next(line for line in table.splitlines() if line.startswith(f"| `{c.name}` ("))
            assert row.count("| no verdict yet") == len(TOOLS) and f"| {c.expect}" in row, row
            assert f"`{c.name}`" in table.split("have no compute-sanitizer verdict yet:")[1]


# ------------------------------------------ the sanitizer script's reading


def _script():
    spec = importlib.util.spec_from_file_location("sanitizer_corpus", REPO / "benchmarks" / "sanitizer_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RACECHECK_OUT = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at reverse_buggy(Array<float>)+0x250
=========     and Read access at reverse_buggy(Array<float>)+0x260 [512 hazards]
LAUNCHED
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
MEMCHECK_OUT = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at scale_buggy(Array<float>)+0x1c0
LAUNCHED
========= ERROR SUMMARY: 29 errors
"""


def test_the_script_reads_each_tools_summary():
    parse = _script().parse_sanitizer
    race = parse(RACECHECK_OUT, 0, "racecheck")
    assert (race["status"], race["flagged"], race["errors"], race["hazards"]) == ("ok", True, 1, 1)
    assert race["messages"][0].startswith("Error: Race reported between Write access at reverse_buggy")
    mem = parse(MEMCHECK_OUT, 1, "memcheck")
    assert (mem["status"], mem["flagged"], mem["errors"]) == ("ok", True, 29)
    clean = parse("LAUNCHED\n========= ERROR SUMMARY: 0 errors\n", 0, "initcheck")
    assert (clean["status"], clean["flagged"]) == ("ok", False)
    fault = parse("CudaAPIError: CUDA_ERROR_ILLEGAL_ADDRESS\n", 1, "racecheck")
    assert (fault["status"], fault["flagged"]) == ("fault", False)
    assert parse("Segmentation fault\n", -11, "memcheck")["status"] == "crashed"


def test_the_record_lines_are_json_with_one_run():
    lines = [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]
    assert len({r["run"] for r in lines}) >= 1 and all(r["benchmark"] == "sanitizer_corpus" for r in lines)


# ------------------------- the kind of kernel chapter 09 builds, at its shapes

BC, D = 16, 16


@cuda.jit(device=True)
def online_step(m, s):
    """The running max after score s, and the factors that rescale the old sum and weigh s."""
    m_new = max(m, s)
    return m_new, math.exp(m - m_new), math.exp(s - m_new)


def flash_rows_kernel(second_barrier):
    @cuda.jit
    def flash_rows(q, k, v, out, scale):
        # a block per (query tile, head), one thread per query row; K / V tiles through shared memory
        kt = cuda.shared.array((BC, D), float32)
        vt = cuda.shared.array((BC, D), float32)
        h, t = cuda.blockIdx.y, cuda.threadIdx.x
        row = cuda.blockIdx.x * cuda.blockDim.x + t
        acc = cuda.local.array(D, float32)
        for d in range(D):
            acc[d] = 0
        m, l = float32(-math.inf), float32(0)
        nk = k.shape[1]
        for base in range(0, nk, BC):
            for e in range(t, BC * D, cuda.blockDim.x):
                j, d = e // D, e % D
                kt[j, d] = k[h, base + j, d] if base + j < nk else 0
                vt[j, d] = v[h, base + j, d] if base + j < nk else 0
            cuda.syncthreads()
            if row < q.shape[1]:
                for j in range(min(BC, nk - base)):
                    s = float32(0)
                    for d in range(D):
                        s += q[h, row, d] * kt[j, d]
                    m, alpha, p = online_step(m, s * scale)
                    for d in range(D):
                        acc[d] = acc[d] * alpha + p * vt[j, d]
                    l = l * alpha + p
            if second_barrier:
                cuda.syncthreads()
        if row < q.shape[1]:
            for d in range(D):
                out[h, row, d] = acc[d] / l
    return flash_rows


def test_a_tiled_attention_kernel_with_tails_passes_and_is_right():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 40, D)).astype(np.float32) for _ in range(3))   # 40: tail tiles
    out = np.zeros_like(q)
    report = cudacheck.check(flash_rows_kernel(True), (2, 2), 32, q, k, v, out, np.float32(D ** -0.5))
    assert report.ok, str(report)
    s = q.astype(np.float64) @ k.transpose(0, 2, 1) * D ** -0.5
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (p / p.sum(-1, keepdims=True)) @ v, atol=1e-5)


def test_without_its_second_barrier_it_races_on_the_k_tile():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 40, D)).astype(np.float32) for _ in range(3))
    report = cudacheck.check(flash_rows_kernel(False), (2, 2), 32, q, k, v, np.zeros_like(q), np.float32(0.25))
    assert report.kinds == {"race"}
    assert report.findings[0].array in ("shared array `kt`", "shared array `vt`")
    assert "at the end of the loop body" in report.findings[0].message


def test_the_record_says_what_the_sanitizer_missed_cudacheck_none():
    records = load_record()
    for r in records:
        flagged_by = [t for t in TOOLS if next(x for x in records if (x["case"], x["variant"], x["tool"]) ==
                                               (r["case"], r["variant"], t))["sanitizer"]["flagged"]]
        assert r["summary"]["sanitizer_flagged_by"] == flagged_by
        assert r["summary"]["sanitizer_missed_it"] == (r["variant"] == "buggy" and not flagged_by)
        assert not r["summary"]["cudacheck_missed_it"]
    missed = {r["case"] for r in records if r["summary"]["sanitizer_missed_it"]}
    assert "blocks_add_to_one_element" in missed and "reverse_no_barrier" not in missed


def test_a_bug_that_showed_on_the_gpu_in_some_runs_only_says_so():
    from course_lib.cudacheck import sanitizer_record
    plain = [r["plain_run"] for r in sanitizer_record.load_record(every_run=True)
             if (r["case"], r["variant"], r["tool"]) == ("reverse_no_barrier", "buggy", sanitizer_record.TOOLS[0])]
    wrong = sum(not r["matches_spec"] for r in plain)
    assert 0 < wrong < len(plain)  # the race showed on the H200 in some runs, not all
    row = next(line for line in comparison_table().splitlines() if line.startswith("| `reverse_no_barrier`"))
    assert row.endswith(f"| wrong in {wrong} of {len(plain)} runs |")
    ok = {"status": "ok", "matches_spec": True}
    assert sanitizer_record._gpu_answer([ok, ok]) == "right anyway"
    assert sanitizer_record._gpu_answer([ok, dict(ok, matches_spec=False)]) == "wrong in 1 of 2 runs"


def test_the_report_counts_global_reads_array_by_array():
    """Set 09's 9.8 measures what shared memory saves from these counts: they must be exact, per argument."""
    def gather(x, idx, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = x[idx[i]] + x[idx[i]]

    x, idx, out = np.arange(10, dtype=np.float32), np.array([3, 1, 4, 1, 5], dtype=np.int64), np.zeros(5, np.float32)
    report = cudacheck.check(gather, 1, 8, x, idx, out)
    assert report.ok
    assert report.global_reads == {"x": 10, "idx": 10, "out": 0}
    assert report.traffic["global reads"] == sum(report.global_reads.values())


# ------------------------------ learner-style kernels cudacheck was not written against


def test_the_corpus_holds_at_least_30_new_learner_style_kernels():
    from course_lib.cudacheck.corpus import attention, basics, gpu_model, reductions, tiles
    learners = gpu_model.CASES + attention.CASES + tiles.CASES + reductions.CASES
    assert len(learners) >= 30 and len(CASES) == len(basics.CASES) + len(learners)
    assert len({c.name for c in CASES}) == len(CASES)


def test_a_float_division_by_zero_gives_inf_and_nan_as_on_the_gpu():
    @cuda.jit
    def divide(a, out):
        zero = 0.0
        out[0] = 1.0 / zero
        out[1] = zero / zero
        x = -2.0
        x /= zero
        out[2] = x
        out[3] = a[0] / a[1]        # numpy scalars: inf too, with no warning
        out[4] = 6.0 / 3

    out = np.zeros(5)
    assert cudacheck.check(divide, 1, 1, np.array([1.0, 0.0], np.float32), out).ok
    np.testing.assert_array_equal(out, [np.inf, np.nan, -np.inf, np.inf, 2.0])


def test_a_too_narrow_integer_store_is_an_overflow_at_its_line():
    c = next(c for c in CASES if c.name == "int8_accumulator_wraps")
    report, args = run(c, "buggy")
    assert report.kinds == {"integer_overflow"}
    f = report.findings[0]
    assert f.line == c.buggy.py_func.__code__.co_firstlineno + 6, str(report)
    assert "a int8 holds -128 to 127: the GPU keeps the low 8 bits" in f.message
    q, k, _ = c.args()
    want = (q.astype(np.int64) @ k.astype(np.int64)).astype(np.int8)   # what the GPU leaves: the low 8 bits
    np.testing.assert_array_equal(args[2], want)


def test_syncwarp_orders_the_memory_of_the_lanes_it_names_only():
    fixed = next(c for c in CASES if c.name == "last_warp_without_syncwarp")
    assert run(fixed, "fixed")[0].ok

    @cuda.jit
    def two_warps(a, out):         # lane t of warp 0 reads what lane t of warp 1 wrote: syncwarp orders only a warp
        s = cuda.shared.array(64, float32)
        t = cuda.threadIdx.x
        s[t] = a[t]
        cuda.syncwarp()
        out[t] = s[(t + 32) % 64] + s[t ^ 1]
    report = cudacheck.check(two_warps, 1, 64, np.arange(64, dtype=np.float32), np.zeros(64, np.float32))
    assert report.kinds == {"race"}
    assert {f.index[0] for f in report.findings} == {32}, str(report)   # the first read across warps; s[t ^ 1] is ordered


def test_activemask_names_the_branch_and_flags_shuffles_outside():
    @cuda.jit
    def masks(out):
        t = cuda.threadIdx.x
        if t < 40:
            out[t] = cuda.activemask()
        else:
            out[t] = cuda.activemask()
    out = np.zeros(64, np.int64)
    assert cudacheck.check(masks, 1, 64, out).ok
    assert out.tolist() == [0xFFFFFFFF] * 32 + [0xFF] * 8 + [0xFFFFFF00] * 24
    c = next(c for c in CASES if c.name == "activemask_in_tail_branch")
    finding = run(c, "buggy")[0].findings[0]
    assert finding.kind == "uninitialized" and "its mask 0x000000ff does not name that lane" in finding.message


def test_overlapping_slices_of_one_device_array_are_one_buffer():
    x = cudacheck.to_device(np.arange(8, dtype=np.float32))
    with pytest.raises(TypeError, match="not slices of a slice"):
        x[1:][1:]
    c = next(c for c in CASES if c.name == "overlapping_slices_in_place")
    report = run(c, "buggy")[0]
    assert report.findings[0].message.startswith("`dst` (the same device array as `src`): thread 1 of block 0 "
                                                 "writes dst[1]")
    src, dst = c.args()
    assert cudacheck.check(c.fixed, c.griddim, c.blockdim, src, dst).ok
    x = np.arange(64, dtype=np.float32) % 13 - 6
    np.testing.assert_array_equal(src.root.copy_to_host(), np.r_[x[1:], x[-1:]])   # shifted left in place


def test_an_atomic_on_memory_nobody_wrote_is_uninitialized():
    c = next(c for c in CASES if c.name == "shared_total_not_zeroed")
    finding = run(c, "buggy")[0].findings[0]
    assert finding.kind == "uninitialized" and "with cuda.atomic.add" in finding.message


@cuda.jit
def _sum_prefetched(x, out):
    # tile t + 1 read from global memory before tile t is read from shared: a prefetch
    tile = cuda.shared.array((2, 4), float32)
    t = cuda.threadIdx.x
    tile[0, t] = x[t]
    acc = float32(0.0)
    for i in range(x.shape[0] // 4):
        cuda.syncthreads()
        nxt = x[(i + 1) * 4 + t] if (i + 1) * 4 < x.shape[0] else float32(0.0)
        for j in range(4):
            acc += tile[i % 2, j]
        tile[1 - i % 2, t] = nxt
    out[t] = acc


@cuda.jit
def _sum_loaded_then_read(x, out):
    # the same sum, each tile loaded and then read after a barrier: no load ahead of the reads
    tile = cuda.shared.array((2, 4), float32)
    t = cuda.threadIdx.x
    acc = float32(0.0)
    for i in range(x.shape[0] // 4):
        tile[i % 2, t] = x[i * 4 + t]
        cuda.syncthreads()
        for j in range(4):
            acc += tile[i % 2, j]
    out[t] = acc


def test_prefetch_intervals_count_the_tiles_whose_next_loads_came_before_their_reads():
    x = np.arange(12, dtype=np.float32)
    for kernel, prefetched in ((_sum_prefetched, 2), (_sum_loaded_then_read, 0)):   # 3 tiles: 2 have a next one
        out = np.zeros(4, np.float32)
        report = cudacheck.check(kernel, 1, 4, x, out)
        assert report.ok and np.allclose(out, x.sum()), str(report)
        assert report.prefetch_intervals == prefetched, kernel
