"""Chapter 10's kernel steps (course_lib.kernels.cuda_steps) as a specification.

The kernels run in numba's simulator, which must be chosen before numba is
imported, so one subprocess (tests/cuda_steps_sim.py) runs every CUDA impl of
the registry (chapter 09's and each of chapter 10's steps) on every awkward case (tails, Nq != Nk,
GQA / MQA, causal both ways, window, softcap,
ALiBi, rows that see no key, split-KV, decode) and the planted mistakes, and
the tests below read its verdicts.  The large shapes and the speeds ran on an
H200 (benchmarks/gpu_steps.py, notebooks/records/gpu_steps.jsonl); nothing
here times anything."""
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import course_lib
from course_lib import kernels
from course_lib.bench.cases import CUDA_IMPLS, FORWARD_CASES
from course_lib.core import hardware, rules
from course_lib.kernels import cuda_steps as cs
from course_lib.kernels.cuda_steps import __main__ as cli

from conftest import simulator_verdicts

ROOT = Path(__file__).resolve().parent.parent

PLANTED = ("partial_tile_marked_full", "skip_a_needed_tile", "natural_scale_in_base_2", "wrong_kv_head",
           "mean_merge")


@pytest.fixture(scope="module")
def verdicts():
    return simulator_verdicts("cuda_steps_sim.py")


def step_cases():
    for name, case in FORWARD_CASES.items():
        for impl in (cs.SPLIT_KV_STEPS if case[-1] > 1 else CUDA_IMPLS):
            yield pytest.param(impl, name, id=f"{impl}-{name}")


def test_the_simulator_ran_the_steps(verdicts):
    assert verdicts["where"] == "numba simulator"


@pytest.mark.parametrize("impl,case", list(step_cases()))
def test_every_step_matches_the_reference_on_awkward_shapes(verdicts, impl, case):
    assert verdicts[f"{impl}/{case}"] == "PASS"


@pytest.mark.parametrize("kind", PLANTED)
def test_the_check_fails_on_each_planted_mistake(verdicts, kind):
    assert verdicts[f"planted/{kind}"].startswith("FAIL attention"), verdicts[f"planted/{kind}"]


def test_one_step_checks_itself_from_the_command_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "course_lib.kernels.cuda_steps", "tiled_vec4", "--sim"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == len(cli.CASES) and all("PASS" in line and "numba simulator" in line for line in lines)


# -- the registry ------------------------------------------------------------------------------

def test_every_step_is_a_registered_cuda_impl_with_a_description():
    steps = {impl.options["step"]: name for name, impl in kernels.IMPLS.items() if impl.function == "forward"}
    assert set(steps) == set(cs.SIMT_STEPS) and all(steps[s] == f"cuda_{s}" for s in cs.SIMT_STEPS)
    for name in steps.values():
        impl = kernels.IMPLS[name]
        assert impl.cuda and impl.what and "\n" not in impl.what
        assert f"``{name}``" in kernels.__doc__          # a row of the registry's table


def test_steps_are_listed_only_where_a_gpu_or_simulator_runs():
    listed = {s for s in cs.SIMT_STEPS if f"cuda_{s}" in course_lib.available_impls()}
    assert listed == (set(cs.SIMT_STEPS) if cs.available() else set())
    if not cs.available():
        with pytest.raises(ValueError, match="not available on this machine"):
            course_lib.attention(np.zeros((1, 1, 4, 4), np.float32), np.zeros((1, 1, 4, 4), np.float32),
                                 np.zeros((1, 1, 4, 4), np.float32), impl="cuda_tuned")


# -- the host side, in this process ---------------------------------------------------------

def test_rescale_exp2_is_rescale_in_base_two():
    for m_old, m_new in [(-1.0, 2.0), (3.5, 3.5), (-math.inf, 0.5)]:
        assert rules.rescale_exp2(m_old * rules.LOG2E, m_new * rules.LOG2E) == pytest.approx(
            rules.rescale(m_old, m_new))
    assert rules.rescale_exp2(1.0, -math.inf) == 0.0
    assert math.isnan(rules.rescale_exp2(1.0, math.nan))
    assert rules.LN2 * rules.LOG2E == pytest.approx(1.0)


def test_the_visit_lists_leave_out_exactly_the_empty_tiles():
    tiles = np.array([[2, 0, 1, 0], [0, 0, 0, 0], [1, 2, 2, 1]], dtype=np.int8)
    visit, nvisit = cs.visit_lists(tiles)
    assert nvisit.tolist() == [2, 0, 4]
    assert visit[0, :2].tolist() == [0, 2] and visit[2].tolist() == [0, 1, 2, 3]


def test_a_tiling_that_does_not_divide_its_threads_is_refused():
    with pytest.raises(ValueError, match="multiple of tx"):
        cs.Tiling(Br=64, Bc=30, threads=128, tx=8).check(64, 64)
    with pytest.raises(ValueError, match="bytes of shared memory"):
        cs.Tiling(Br=256, Bc=128, threads=1024, tx=8).check(256, 256)


def test_shared_memory_layout_reuses_ks_for_p_and_pads_rows():
    t = cs.Tiling(Br=64, Bc=32, threads=128, tx=8, pad=1)
    L = t.layout(64, 64)
    assert L.PS == L.KS and L.DP == 65 and L.BP == 33
    assert t.shared_bytes(64, 64) == 4 * (64 * 65 + max(32 * 65, 64 * 33) + 32 * 64 + 64 * 8)


def test_vec_layout_keeps_rows_16_byte_aligned_conflict_free():
    for D, Dv, tiling in [(64, 64, cs.STEP_TILING["tiled_staged"]), (128, 128, cs.STEP_TILING["tiled_vec4"]),
                          (7, 5, replace(cs.SIM_TILING, vec=True)), (40, 24, cs.DECODE_TILING)]:
        L = tiling.layout(D, Dv)
        for name in ("QS", "KS", "VS", "PS", "RED", "DP", "EP", "BP"):
            assert getattr(L, name) % 4 == 0, (D, Dv, name, getattr(L, name))     # every row starts on 16 bytes
        assert L.DP % 32 == 4 and L.DP >= D                    # 8 rows of Q / K: 8 different bank quads
        assert L.EP >= Dv and L.EP % (4 * tiling.tx) == 0     # dims owned in chunks of 4 per thread
        assert tiling.shared_bytes(D, Dv) == 4 * L.size
    with pytest.raises(ValueError, match="divide a warp"):
        cs.Tiling(Br=64, Bc=48, threads=96, tx=12, vec=True).check(64, 64)


def test_the_steps_to_tiled_vec4_change_one_thing_each():
    fields = ("Br", "Bc", "threads", "tx", "pad", "prefetch", "max_regs", "unsigned", "vec", "align", "shuffle",
              "last_first")
    chain = cs.SIMT_STEPS[cs.SIMT_STEPS.index("tiled_rebuilt"):cs.SIMT_STEPS.index("tiled_vec4") + 1]
    changed = [{f for f in fields if getattr(cs.STEP_TILING[a], f) != getattr(cs.STEP_TILING[b], f)}
               for a, b in zip(chain, chain[1:])]
    assert changed == [{"shuffle"}, {"last_first"}, {"align"}, {"Br", "Bc", "threads", "tx"}]
    first = cs.STEP_TILING["tiled_rebuilt"]      # tiled_prefetch's tile sizes, every switch off
    prefetch = cs.STEP_TILING["tiled_prefetch"]
    assert (first.Br, first.Bc, first.threads, first.tx) == (prefetch.Br, prefetch.Bc, prefetch.threads, prefetch.tx)
    assert (first.align, first.shuffle, first.last_first, first.prefetch) == (0, False, False, False)
    for off in ({"align": 0}, {"shuffle": False}, {"last_first": False}):   # tiled_staged's kernel has no switches
        with pytest.raises(ValueError, match="no align, shuffle or last_first"):
            replace(cs.STEP_TILING["tiled_staged"], **off).check(64, 64)


def test_each_step_to_tiled_vec4_runs_a_kernel_of_its_own():
    made = {step: cs.factory(cs.STEP_TILING[step])
            for step in ("tiled_rebuilt", "tiled_shuffle", "tiled_reorder", "tiled_aligned", "tiled_vec4")}
    assert made == {"tiled_rebuilt": cs.make_rebuilt_kernel, "tiled_shuffle": cs.make_shuffle_kernel,
                    "tiled_reorder": cs.make_reorder_kernel, "tiled_aligned": cs.make_aligned_kernel,
                    "tiled_vec4": cs.make_aligned_kernel}      # tiled_vec4: tiled_aligned's kernel, larger tiles
    assert cs.factory(cs.STEP_TILING["tiled_staged"]) is cs.make_staged_kernel
    with pytest.raises(ValueError, match="no other mix has a kernel"):    # the grid order without the shuffles
        replace(cs.STEP_TILING["tiled_rebuilt"], last_first=True).check(64, 64)


def test_decode_splits_asks_for_two_full_waves_of_blocks():
    tiling = cs.DECODE_TILING
    per_sm = hardware.occupancy("h200", 40, tiling.shared_bytes(128, 128), tiling.threads).blocks
    splits, why = cs.decode_splits(128, 1024, tiling, 128, 128, regs=40, sms=132)
    assert why["blocks_per_sm"] == per_sm and splits & (splits - 1) == 0
    assert 128 * splits >= 2 * 132 * per_sm > 128 * splits // 2     # the fewest that fill two waves
    assert cs.decode_splits(128, 3, tiling, 128, 128, sms=132)[0] == 2    # never more splits than tiles
    assert cs.decode_splits(100000, 1024, tiling, 128, 128, sms=132)[0] == 1


def test_the_records_occupancy_names_the_resource_that_limits_it():
    def record(regs, shared, threads):
        return hardware.occupancy("h200", regs, shared, threads).as_record()
    # 255 registers x 128 threads: 2 blocks of 4 warps fit in 64K registers
    assert record(255, 1024, 128) == {"blocks_per_sm": 2, "warps_per_sm": 8, "occupancy": 0.125,
                                      "limited_by": "registers"}
    assert record(32, 100 * 1024, 128)["limited_by"] == "shared"
    assert record(32, 0, 1024)["limited_by"] == "warps"     # 2 blocks by warps and by registers: warps first


def test_the_autotuner_keeps_the_fastest_candidate_that_ran():
    times = {(64, 32, False): 3.0, (64, 32, True): 2.0, (32, 32, False): None, (32, 32, True): 1.0}

    def fake(tiling):
        return times[(tiling.Br, tiling.Bc, tiling.prefetch)]
    best, results = cs.autotune(64, fake, candidates=[(64, 32, 128, 8), (32, 32, 64, 8)])
    assert (best.Br, best.prefetch) == (32, True) and cs.TUNED[64] == best
    assert len(results) == 4
    cs.TUNED.clear()
