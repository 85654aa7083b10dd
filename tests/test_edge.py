"""Chapter 15's models and its stand-in NPU: the schedule, the paced pipeline, int8, the cluster, mask fusion."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib
from course_lib.core import hardware
from course_lib.core.masks import MaskSpec
from course_lib.edge import dma, fixed_point, manycore, mask_fusion, schedule
from course_lib.models import sram

times = st.floats(0.0, 10.0, allow_nan=False)


# -- the schedule model ----------------------------------------------------------------------

@given(n=st.integers(0, 40), load=times, compute=times, buffers=st.integers(1, 4),
       pro=st.floats(0, 3), epi=st.floats(0, 3))
def test_the_simulated_schedule_equals_the_closed_form_for_equal_tiles(n, load, compute, buffers, pro, epi):
    t = schedule.simulate(load, compute, buffers, n_tiles=n, prologue_s=pro, epilogue_s=epi)
    assert t.total == pytest.approx(schedule.predicted_time(n, load, compute, buffers, prologue_s=pro, epilogue_s=epi))


def test_double_buffering_turns_the_sum_into_the_max_and_a_third_buffer_adds_nothing_for_equal_tiles():
    assert schedule.steady_state(3.0, 2.0, 1) == 5.0
    assert schedule.steady_state(3.0, 2.0, 2) == schedule.steady_state(3.0, 2.0, 3) == 3.0
    assert schedule.predicted_time(10, 3.0, 2.0, 2) == 3 + 2 + 9 * 3


@settings(max_examples=60)
@given(st.lists(st.tuples(times, times), min_size=1, max_size=30), st.integers(1, 3))
def test_more_buffers_never_finish_later_and_no_buffer_is_overwritten_while_in_use(tiles, buffers):
    load, compute = np.array(tiles).T
    t, more = schedule.simulate(load, compute, buffers), schedule.simulate(load, compute, buffers + 1)
    assert more.total <= t.total + 1e-9
    steps = {(s.kind, s.tile): s for s in t.steps}
    for j in range(buffers, len(tiles)):  # tile j reuses tile j - buffers' buffer: only after its compute
        assert steps["load", j].start >= steps["compute", j - buffers].end - 1e-12
        assert steps["compute", j].start >= steps["load", j].end - 1e-12


def test_two_dma_engines_halve_a_dma_bound_steady_state_given_enough_buffers():
    t = schedule.simulate(2.0, 1.0, 4, n_tiles=200, dma_engines=2)
    assert t.total / 200 == pytest.approx(1.0, rel=0.02)
    assert {s.lane for s in t.steps} == {"DMA 0", "DMA 1", "compute 0"}


def test_schedule_rejects_bad_counts_and_times():
    with pytest.raises(ValueError, match="buffers"):
        schedule.simulate(1.0, 1.0, 0, n_tiles=3)
    with pytest.raises(ValueError, match="times"):
        schedule.simulate([-1.0], [1.0], 2)


def test_the_npu_plan_uses_chapter_03s_budget_and_the_presets_figures():
    plan = schedule.attention_plan(4096, 128, 128, 64, 2, "edge_npu", "float16")
    assert plan.sram_bytes == sram.tile_budget(128, 64, 128, "float16", kv_stages=2).total_bytes
    npu = hardware.hardware("edge_npu")
    assert plan.kv_load_s == pytest.approx(2 * (float(npu.dma_setup) + 64 * 128 * 2 / float(npu.bandwidth)))
    assert plan.tile_compute_s == pytest.approx(2 * 128 * 64 * 128 / (float(npu.peak_flops["float16"]) / 2))
    assert plan.total_s == pytest.approx(32 * schedule.predicted_time(
        64, plan.kv_load_s, plan.tile_compute_s, 2, prologue_s=plan.q_load_s, epilogue_s=plan.o_store_s))
    best = schedule.best_plan(4096, 128)
    assert best.fits and best.buffers == 2 and (best.block_q, best.block_k) == (128, 64)
    assert schedule.attention_plan(4096, 128, 128, 64, 1).total_s > 1.5 * best.total_s


# -- the stand-in NPU ------------------------------------------------------------------------

def test_the_paced_pipeline_computes_attention_with_any_buffer_count_and_tail():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((19, 16)).astype(np.float32)
    k, v = rng.standard_normal((101, 16)).astype(np.float32), rng.standard_normal((101, 8)).astype(np.float32)
    expected, lse = course_lib.attention(*(x[None, None].astype(np.float64) for x in (q, k, v)), return_lse=True)
    for buffers in (1, 2, 3):
        out, got_lse, timeline = dma.run_pipeline(q, k, v, block_k=32, buffers=buffers, dram=dma.PacedDRAM(1e9))
        np.testing.assert_allclose(out, expected[0, 0], atol=1e-5)
        np.testing.assert_allclose(got_lse, lse[0, 0], atol=1e-5)
        loads = [s for s in timeline.steps if s.kind == schedule.LOAD and s.tile >= 0]
        assert [s.buffer for s in loads] == [j % buffers for j in range(4)]


def test_paced_dram_takes_at_least_its_transfer_time():
    dram = dma.PacedDRAM(1e6, setup=1e-3)
    parts = dma.measure_parts(np.ones((4, 8), np.float32), np.ones((64, 8), np.float32),
                              np.ones((64, 8), np.float32), block_k=32, dram=dram)
    assert parts["key_tiles"] == 2 and parts["load_s"] >= 2 * (1e-3 + 32 * 8 * 4 / 1e6)
    with pytest.raises(TypeError, match="float32"):
        dma.run_pipeline(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), block_k=1, buffers=1, dram=dram)


# -- int8 and fixed point --------------------------------------------------------------------

def test_int8_scores_accumulate_in_int32_exactly():
    rng = np.random.default_rng(1)
    q8, k8 = (rng.integers(-127, 128, (n, 300)).astype(np.int8) for n in (5, 7))
    s = fixed_point.scores_int8(q8, k8)
    assert s.dtype == np.int32
    np.testing.assert_array_equal(s, q8.astype(np.int64) @ k8.astype(np.int64).T)
    out = np.empty((5, 7), np.int32)
    np.testing.assert_array_equal(fixed_point.int8_scores_loop(q8, k8, out), s)


def test_the_table_exp_is_within_its_table_step_and_exact_at_integer_powers():
    y = np.arange(-20 * 2 ** fixed_point.FRAC, 1)
    for bits in (4, 8):
        got = fixed_point.exp2_fixed(y, bits) / 2 ** 16
        exact = 2.0 ** (y / 2 ** fixed_point.FRAC)
        big = exact > 2 ** -8
        assert np.all(np.abs(got - exact)[big] / exact[big] <= 2 ** (2 ** -bits) - 1 + 2 ** -7)
    whole = -np.arange(0, 17) * 2 ** fixed_point.FRAC
    np.testing.assert_array_equal(fixed_point.exp2_fixed(whole), 2 ** (16 - np.arange(0, 17)))
    with pytest.raises(ValueError, match="y <= 0"):
        fixed_point.exp2_fixed(np.array([1]))


def test_int8_attention_is_close_to_float64_and_each_stage_adds_error():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((48, 32)) for _ in range(3))
    err = fixed_point.error_study(q, k, v)
    assert max(err.values()) < 0.2
    assert err["int8 scores, float softmax and P V"] < err["+ P in uint8 (8-bit table): all int8 / int32"]


# -- many cores, one SRAM ----------------------------------------------------------------------

def test_the_desktop_gpu_tile_fits_its_gpu_and_fails_the_cluster():
    res = manycore.desktop_tile_on("gap8")
    assert res["gpu_fits"] and not res["fits"]
    assert res["shared_bytes"] == 48 * 1024  # the "48 KB smem" FlashAttention-2's source names
    assert res["per_core_share"] == 8 * 1024


def test_private_tiles_multiply_dma_and_sram_shared_ones_do_not():
    one = manycore.cluster_step(1, 16, 64, 64, layout=manycore.PRIVATE)
    for cores in (2, 4, 8):
        private = manycore.cluster_step(cores, 16, 64, 64, layout=manycore.PRIVATE)
        shared = manycore.cluster_step(cores, 16, 64, 64, layout=manycore.SHARED)
        assert private.dma_s == pytest.approx(cores * one.dma_s) and shared.dma_s == pytest.approx(one.dma_s)
        assert private.sram_bytes == cores * one.sram_bytes > shared.sram_bytes
        assert shared.rows_per_s >= private.rows_per_s
    with pytest.raises(ValueError, match="cores"):
        manycore.cluster_step(9, 16, 64, 64)


# -- mask fusion -------------------------------------------------------------------------------

@pytest.mark.parametrize("nq, nk, br, bc", [(37, 53, 16, 16), (64, 64, 32, 16), (20, 9, 8, 4)])
def test_every_mask_schedule_computes_causal_attention_and_counts_its_closed_form(nq, nk, br, bc):
    rng = np.random.default_rng(nq)
    q = rng.standard_normal((nq, 8)).astype(np.float32)
    k, v = (rng.standard_normal((nk, 8)).astype(np.float32) for _ in range(2))
    visible = MaskSpec(nq, nk, causal=True).visible(np.arange(nq), np.arange(nk))
    expected = course_lib.attention(*(x[None, None].astype(np.float64) for x in (q, k, v)), causal=True)[0, 0]
    for name in (mask_fusion.SEPARATE, mask_fusion.FUSED):
        out, mem = mask_fusion.run_counted(name, q, k, v, visible, block_q=br, block_k=bc)
        np.testing.assert_allclose(out, expected, atol=1e-5)
        model = mask_fusion.mask_traffic(name, nq, nk, 8, block_q=br, block_k=bc)
        assert dict(mem.reads) == model["reads"] and dict(mem.writes) == model["writes"]
    out, mem = mask_fusion.run_counted(mask_fusion.RULE, q, k, v, visible, block_q=br, block_k=bc)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    unmasked = mask_fusion.mask_traffic(mask_fusion.RULE, nq, nk, 8, block_q=br, block_k=bc)
    assert "mask" not in mem.reads and mem.reads["K"] <= unmasked["reads"]["K"]


def test_a_separate_mask_pass_moves_16_bytes_and_the_mask_per_pair_more():
    sep = mask_fusion.mask_traffic("separate", 1024, 1024, 64, block_q=64, block_k=64)
    fused = mask_fusion.mask_traffic("fused", 1024, 1024, 64, block_q=64, block_k=64)
    assert sep["bytes"] - fused["bytes"] == 16 * 1024 * 1024
    assert math.isclose(fused["reads"]["mask"], 1024 * 1024)
