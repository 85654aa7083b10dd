"""The IO model against the counted kernel, the SRAM budget, the IO law and the L2 level (chapters 02, 03)."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib
from course_lib import checks
from course_lib.core import hardware
from course_lib.kernels.counted import run_counted
from course_lib.models import iomodel, roofline, sram
from course_lib.models.iomodel import SCHEDULES, attention_io

from conftest import make_qkv

DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]
MASKS = [dict(), dict(causal=True), dict(causal=True, causal_align="top_left"), dict(window_size=(5, 3))]


def model_of(q, v, schedule, **options):
    batch, heads, nq, d = q.shape
    return attention_io(schedule, nq, v.shape[2], d, q.dtype, head_dim_v=v.shape[3], batch=batch, heads=heads,
                        **options)


# -- the model equals the count, and the count computes attention --------------------

SHAPES = [  # (B, H, Hk, Nq, Nk, D, Dv, Br, Bc)
    (1, 1, 1, 64, 64, 16, 16, 16, 16),  # whole tiles
    (2, 2, 1, 37, 29, 16, 8, 8, 16),  # tails both ways, Nq > Nk, GQA, Dv != D
    (1, 3, 3, 13, 50, 8, 8, 16, 7),  # Nq < Br: a single short query tile; odd Bc
    (1, 2, 2, 33, 33, 12, 12, 32, 32),  # one full tile and a one-row tail
]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: ",".join(f"{k}={v}" for k, v in m.items()) or "nomask")
def test_model_equals_the_count_and_kernel_matches_reference(schedule, shape, mask, capsys):
    b, h, hk, nq, nk, d, dv, br, bc = shape
    q, k, v = make_qkv(0, b, h, hk, nq, nk, d, dv, np.float32)
    run = run_counted(q, k, v, schedule=schedule, block_q=br, block_k=bc, return_lse=True, **mask)
    assert run.traffic == model_of(q, v, schedule, block_q=br, block_k=bc, return_lse=True, **mask)
    checks.check_attention(run.out, q, k, v, lse=run.lse, **mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_dtype_counts_its_itemsize_within_tolerance(dtype, schedule, capsys):
    q, k, v = make_qkv(1, 1, 2, 1, 41, 35, 16, 16, dtype)
    run = run_counted(q, k, v, schedule=schedule, block_q=16, block_k=8, causal=True, return_lse=True)
    assert run.traffic == model_of(q, v, schedule, block_q=16, block_k=8, causal=True, return_lse=True)
    checks.check_attention(run.out, q, k, v, lse=run.lse, causal=True)
    per_element = np.dtype(dtype).itemsize
    if schedule == "fa1":  # Q is read again for every key tile
        assert run.traffic.reads["Q"] > q.size * per_element
    else:  # Q is read once
        assert run.traffic.reads["Q"] == q.size * per_element


@pytest.mark.parametrize("passes", [1, 2, 3])
def test_naive_softmax_passes_each_read_s_again(passes):
    q, k, v = make_qkv(0, 1, 1, 1, 24, 40, 8, 8, np.float32)
    run = run_counted(q, k, v, schedule="naive", softmax_passes=passes)
    assert run.traffic == model_of(q, v, "naive", softmax_passes=passes)
    s_bytes = 24 * 40 * 4
    assert run.traffic.reads["S"] == passes * s_bytes and run.traffic.writes["S"] == s_bytes
    assert run.traffic.reads["P"] == run.traffic.writes["P"] == s_bytes
    checks.check_attention(run.out, q, k, v)


@settings(max_examples=30, deadline=None)
@given(nq=st.integers(1, 40), nk=st.integers(1, 40), br=st.integers(1, 20), bc=st.integers(1, 20),
       schedule=st.sampled_from(SCHEDULES), mask=st.sampled_from(MASKS + [dict(window_size=(0, 0))]),
       skip=st.booleans())
def test_model_equals_count_for_any_shape_and_tiles(nq, nk, br, bc, schedule, mask, skip):
    q, k, v = make_qkv(0, 1, 1, 1, nq, nk, 4, 3, np.float64)
    run = run_counted(q, k, v, schedule=schedule, block_q=br, block_k=bc, skip_empty_tiles=skip, **mask)
    assert run.traffic == model_of(q, v, schedule, block_q=br, block_k=bc, skip_empty_tiles=skip, **mask)
    expected = course_lib.attention(q, k, v, impl="reference", **mask)
    assert checks.compare("out", run.out, expected, atol=1e-10, rtol=1e-9).passed


def test_the_count_tells_schedules_apart():
    """A model of the wrong schedule does not match: the equality tests can fail."""
    q, k, v = make_qkv(0, 1, 1, 1, 64, 64, 16, 16, np.float32)
    counted = {s: run_counted(q, k, v, schedule=s, block_q=16, block_k=16).traffic for s in SCHEDULES}
    models = {s: model_of(q, v, s, block_q=16, block_k=16) for s in SCHEDULES}
    for s in SCHEDULES:
        for other in SCHEDULES:
            assert (counted[s] == models[other]) == (s == other)
    assert counted["two_pass"].reads["K"] == 2 * counted["fa2"].reads["K"]
    assert run_counted(q, k, v, block_q=32, block_k=16).traffic != models["fa2"]  # K/V read per query tile


# -- closed forms a learner can check by hand ------------------------------------------

def test_fa2_reads_q_once_kv_per_query_tile_writes_o_once():
    n, d, b, br = 1000, 64, 2, 128  # 8 query tiles, the last one short
    t = attention_io("fa2", n, n, d, "float16", block_q=br, block_k=64)
    tr = math.ceil(n / br)
    assert t.reads == {"Q": n * d * b, "K": tr * n * d * b, "V": tr * n * d * b}
    assert t.writes == {"O": n * d * b}
    assert t.flops == 4 * n * n * d and t.exps == n * n


def test_naive_fused_softmax_moves_s_and_p_each_twice():
    n, d, b = 4096, 64, 2
    t = iomodel.naive_io(n, n, d, "float16")
    assert t.bytes == 4 * n * d * b + 4 * n * n * b  # Q, K, V, O once; S and P written and read
    assert t.intensity == pytest.approx(4 * n * n * d / t.bytes)


def test_fa1_rereads_q_and_o_for_every_key_tile():
    n, d, br, bc = 512, 32, 64, 128
    t = attention_io("fa1", n, n, d, "float32", block_q=br, block_k=bc)
    tc = n // bc
    assert t.reads["K"] == t.reads["V"] == n * d * 4
    assert t.reads["Q"] == t.reads["O"] == tc * n * d * 4
    assert t.writes["O"] == (tc + 1) * n * d * 4  # + the initial zeros
    assert t.writes["m"] == t.writes["l"] == (tc + 1) * n * 4


def test_fa1_keeps_o_scratch_in_float32_at_low_precision():
    n, d, br, bc = 512, 32, 64, 128
    t = attention_io("fa1", n, n, d, "float16", block_q=br, block_k=bc)
    tc = n // bc
    assert t.reads["Q"] == tc * n * d * 2  # inputs in float16
    assert t.reads["O"] == (tc + 1) * n * d * 4  # the float32 scratch, and the last pass reading it
    assert t.writes["O"] == (tc + 1) * n * d * 4 + n * d * 2  # scratch, then O once in float16


def test_batch_and_heads_multiply_everything():
    one = attention_io("fa2", 300, 200, 32, "bfloat16", block_q=64, block_k=64)
    many = attention_io("fa2", 300, 200, 32, "bfloat16", block_q=64, block_k=64, batch=3, heads=5)
    assert many.bytes == 15 * one.bytes and many.flops == 15 * one.flops


def test_causal_skipping_halves_the_work_not_skipping_costs_all():
    full = attention_io("fa2", 8192, 8192, 64, block_q=64, block_k=64)
    causal = attention_io("fa2", 8192, 8192, 64, block_q=64, block_k=64, causal=True)
    unskipped = attention_io("fa2", 8192, 8192, 64, block_q=64, block_k=64, causal=True, skip_empty_tiles=False)
    assert 0.5 < causal.flops / full.flops < 0.51
    assert 0.5 < causal.reads["K"] / full.reads["K"] < 0.51
    assert unskipped == full


def test_matmul_io_counts_2mnk_flops_and_each_matrix_once():
    t = iomodel.matmul_io(4096, 4096, 4096, "float16")
    assert t.flops == 2 * 4096 ** 3 and t.bytes == 3 * 4096 ** 2 * 2
    assert t.intensity == pytest.approx(4096 / 3)


def test_time_bound_is_the_largest_of_compute_memory_and_exp():
    t = iomodel.naive_io(4096, 4096, 64, "float16")
    bound = roofline.time_bound(t, "h100_sxm", "float16")
    assert bound.compute_s == pytest.approx(t.flops / 989.5e12)
    assert bound.memory_s == pytest.approx(t.bytes / 3.35e12)
    assert bound.exp_s == pytest.approx(t.exps / 3.9e12)
    assert bound.seconds == max(bound.compute_s, bound.memory_s, bound.exp_s) and bound.limiter == "memory"
    no_exp = roofline.time_bound(t, "a100_80gb", "float16")  # no exp figure for the A100
    assert no_exp.exp_s == 0
    compute = roofline.time_bound(iomodel.matmul_io(8192, 8192, 8192, "float16"), "h100_sxm", "float16")
    assert compute.limiter == "compute"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="schedule"):
        attention_io("fa3", 128)
    with pytest.raises(ValueError, match="block_q"):
        attention_io("fa2", 128, block_q=0)
    with pytest.raises(ValueError, match="softmax_passes"):
        attention_io("naive", 128, softmax_passes=4)
    with pytest.raises(ValueError, match="dtype"):
        attention_io("fa2", 128, dtype="int8")
    q, k, v = make_qkv(0, 1, 1, 1, 0, 5, 4, 4, np.float32)
    with pytest.raises(ValueError, match="non-empty"):
        run_counted(q, k, v)


# -- the IO law ----------------------------------------------------------------------

# c / b^2 with B = M / (4 D b): FA2 re-reads K and V (2 b); FA1 re-reads Q (b) and O, read and written in
# float32 (2 x 4 = 4 b at b = 2): 4 (b + 2 * 4) / b = 20
@pytest.mark.parametrize("schedule, constant", [("fa2", 8), ("fa1", 20)])
def test_io_law_n2_d2_over_m_with_the_derived_constant(schedule, constant):
    points = iomodel.io_law_points([4096, 8192, 16384], [64, 128], [64 * 1024, 128 * 1024, 256 * 1024],
                                   "float16", schedule)
    fit = iomodel.fit_io_law(points)
    a, b, g = fit.exponents
    assert a == pytest.approx(2, abs=0.05) and b == pytest.approx(2, abs=0.08) and g == pytest.approx(-1, abs=0.05)
    assert fit.c / 2 ** 2 == pytest.approx(constant, rel=0.1)  # c = constant * itemsize^2
    assert fit.max_rel_error < 0.15


@pytest.mark.parametrize("sram_bytes", [64 * 1024, 256 * 1024])
def test_intensity_falls_with_d_for_a_fixed_on_chip_budget(sram_bytes):
    by_d = {d: iomodel.flash_intensity_for_budget(sram_bytes, d, "float16") for d in (32, 64, 128, 256)}
    for d, predicted in by_d.items():
        tile = iomodel.tile_for_sram(sram_bytes, d, "float16")
        modelled = attention_io("fa2", 65536, 65536, d, "float16", block_q=tile, block_k=tile).intensity
        assert modelled == pytest.approx(predicted, rel=0.05)  # about M / (2 D b^2) FLOP per byte
        assert predicted == pytest.approx(sram_bytes / (2 * d * 2 ** 2), rel=0.05)
    assert by_d[32] > by_d[64] > by_d[128] > by_d[256]  # not "independent of D"
    assert by_d[64] == pytest.approx(2 * by_d[128], rel=0.02)


def test_tile_for_sram_fills_m_with_four_tiles():
    tile = iomodel.tile_for_sram(128 * 1024, 64, "float16")
    assert tile == 256 and 4 * tile * 64 * 2 == 128 * 1024


@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_the_idealised_square_tile_does_not_fit_once_s_and_the_accumulators_count(d):
    tile = iomodel.tile_for_sram(228 * 1024, d, "float16")
    assert sram.tile_budget(tile, tile, d, "float16").total_bytes > 228 * 1024


@pytest.mark.parametrize("d", [32, 64, 128, 256])
@pytest.mark.parametrize("budget", [64 * 1024, 228 * 1024])
def test_the_fitting_tile_fits_its_whole_budget_and_a_taller_one_does_not(d, budget):
    block_q, block_k = iomodel.fitting_tile(budget, d, "float16")
    assert block_k <= d and block_q >= block_k
    assert sram.tile_budget(block_q, block_k, d, "float16").total_bytes <= budget
    assert sram.tile_budget(block_q + 1, block_k, d, "float16").total_bytes > budget
    if block_k < d:  # the key tile was halved only because a key tile twice as long left no taller query tile
        bigger = iomodel.fitting_tile(10 * budget, d, "float16")
        assert bigger[1] >= block_k


def test_the_io_law_keeps_its_shape_with_tiles_that_fit():
    fit = iomodel.fit_io_law(iomodel.io_law_points([4096, 8192, 16384], [64, 128], [64 * 1024, 128 * 1024,
                                                                                    256 * 1024], "float16", "fa2",
                                                   tiles="fitting"))
    a, b, g = fit.exponents
    assert a == pytest.approx(2, abs=0.05) and 1.7 < b < 2.0 and g == pytest.approx(-0.92, abs=0.05)
    assert fit.c / 2 ** 2 == pytest.approx(12, rel=0.1) and fit.max_rel_error < 0.2
    with pytest.raises(ValueError, match="tiles"):
        iomodel.io_law_points([4096], [64], [65536], tiles="square")


# -- the SRAM budget, and the kernel's chip held to it ----------------------------------

@pytest.mark.parametrize("schedule", ["fa2", "fa1", "two_pass"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_the_kernels_sram_peak_is_the_tile_budget(schedule, dtype):
    q, k, v = make_qkv(0, 1, 1, 1, 40, 50, 16, 8, dtype)
    run = run_counted(q, k, v, schedule=schedule, block_q=16, block_k=32)
    budget = sram.tile_budget(16, 32, 16, dtype, head_dim_v=8)
    assert run.sram_peak == budget.total_bytes
    names = {it.name for it in budget.items}
    assert set(run.sram_peak_buffers) <= names


def test_a_chip_smaller_than_the_budget_overflows():
    q, k, v = make_qkv(0, 1, 1, 1, 64, 64, 16, 16, np.float16)
    budget = sram.tile_budget(32, 32, 16, "float16")
    run_counted(q, k, v, block_q=32, block_k=32, sram_capacity=budget.total_bytes)
    with pytest.raises(MemoryError, match="SRAM overflow"):
        run_counted(q, k, v, block_q=32, block_k=32, sram_capacity=budget.total_bytes - 1)


def test_tile_budget_items_by_hand():
    b = sram.tile_budget(128, 64, 128, "float16")
    sizes = {it.name: it.bytes for it in b.items}
    assert sizes["Q tile"] == 128 * 128 * 2 and sizes["K tile"] == sizes["V tile"] == 64 * 128 * 2
    assert sizes["O accumulator"] == 128 * 128 * 4 and sizes["S / P tile"] == 128 * 64 * 4
    assert sizes["m (row max)"] == sizes["l (row sum)"] == 128 * 4
    assert sizes["P in float16"] == 128 * 64 * 2 and sizes["O out in float16"] == 128 * 128 * 2
    assert b.shared_bytes == 64 * 1024
    assert b.register_bytes == 2 * 128 * 4 + 128 * 128 * 4 + max(128 * 64 * 6, 128 * 128 * 2)
    staged = sram.tile_budget(128, 64, 128, "float16", kv_stages=2)
    assert staged.shared_bytes == b.shared_bytes + 2 * 64 * 128 * 2


def test_float32_needs_no_conversion_fp8_has_one_byte_tiles():
    f32 = sram.tile_budget(64, 64, 64, "float32")
    assert not any("out in" in it.name or "P in" in it.name for it in f32.items)
    fp8 = sram.tile_budget(64, 64, 64, "fp8")
    assert fp8.dtype == "float8_e4m3fn" and fp8.shared_bytes == 3 * 64 * 64
    assert sram.tile_budget(64, 64, 64, "float64").register_bytes == 2 * f32.register_bytes


def test_occupancy_on_an_h100_for_flashattention2s_hdim128_tile():
    occ = sram.tile_fit(sram.tile_budget(128, 64, 128, "float16"), "h100_sxm")
    assert occ.fits and occ.registers_per_thread <= 255
    assert occ.limits["shared memory"] == 228 // 65  # 64 KiB + 1 KiB reserved per block
    assert occ.blocks_per_unit == min(occ.limits.values()) == 2


def test_too_big_a_tile_does_not_fit_and_says_why():
    huge = sram.tile_budget(256, 256, 256, "float16")
    occ = sram.tile_fit(huge, "a100_80gb")
    assert not occ.fits and occ.blocks_per_unit == 0
    assert "shared memory" in occ.reason and "registers" in occ.reason
    assert sram.fits(sram.tile_budget(64, 64, 128, "float32"), "edge_npu")  # 145 KiB of 256
    assert not sram.fits(sram.tile_budget(128, 128, 128, "float32"), "edge_npu")


def test_fits_all_covers_every_preset_small_ones_by_sram():
    res = sram.fits_all(sram.tile_budget(32, 32, 64, "float16"))
    assert set(res) == set(hardware.HARDWARE)
    npu = res["edge_npu"]
    assert npu.blocks_per_unit == 256 * 1024 // sram.tile_budget(32, 32, 64, "float16").total_bytes
    assert sram.largest_square_tile(64, "float16", "riscv_manycore") == 64


def test_budget_rejects_bad_sizes_and_dtypes():
    with pytest.raises(ValueError, match="block_k"):
        sram.tile_budget(64, 0, 64)
    with pytest.raises(ValueError, match="dtype"):
        sram.tile_budget(64, 64, 64, "int4")


# -- the third level: L2 ---------------------------------------------------------------

H200 = dict(batch=2, heads=16, block_q=128, block_k=64)


def test_two_level_count_at_4k_and_compulsory_traffic_qkvo_once():
    at_4k = iomodel.levels(4096, 4096, 128, "float16", "h200", **H200)
    assert at_4k.l2_bytes == pytest.approx(2.21e9, rel=0.01)  # the two-level count, chip <-> L2 + HBM
    assert at_4k.compulsory_bytes == 4 * 2 * 16 * 4096 * 128 * 2  # Q, K, V, O once: 134 MB
    assert at_4k.kv_fits_l2 and at_4k.hbm_bytes == at_4k.compulsory_bytes
    at_16k = iomodel.levels(16384, 16384, 128, "float16", "h200", **H200)
    assert at_16k.l2_bytes == pytest.approx(34.6e9, rel=0.01) and at_16k.compulsory_bytes == pytest.approx(537e6, rel=0.01)


def test_measured_dram_and_l2_bytes_sit_near_the_predictions():
    for point in iomodel.MEASURED_NCU:
        lv = iomodel.levels(point["seqlen"], point["seqlen"], point["head_dim"], "float16", point["machine"],
                            batch=point["batch"], heads=point["heads"], block_q=128, block_k=64)
        assert lv.kv_fits_l2
        assert 0.9 < point["dram_bytes"] / lv.hbm_bytes < 1.3  # HBM: close to compulsory, not to the 2-level count
        assert point["dram_bytes"] < 0.1 * lv.l2_bytes
        assert 1.0 < point["l2_bytes"] / lv.l2_bytes < 1.4  # L2: near the two-level count (it counts less)
        assert point["kind"] == "measured" and point["date"]


def test_k_and_v_stop_fitting_in_l2_when_long_many_or_small():
    assert not iomodel.levels(65536, 65536, 128, "float16", "h200", **H200).kv_fits_l2  # N
    crowded = iomodel.levels(8192, 8192, 128, "float16", "h200", concurrent_blocks=264 * 8, **H200)
    assert not crowded.kv_fits_l2 and crowded.heads_in_flight > 8  # heads in flight
    # the same 6 heads in flight (48 MiB of K / V): too much for the A100's 40 MB of L2, not for the H100's 50
    a100 = iomodel.levels(16384, 16384, 128, "float16", "a100_80gb", concurrent_blocks=600, **H200)
    h100 = iomodel.levels(16384, 16384, 128, "float16", "h100_sxm", concurrent_blocks=600, **H200)
    assert a100.kv_working_set == h100.kv_working_set == 6 * 16384 * 256 * 2
    assert not a100.kv_fits_l2 and h100.kv_fits_l2
    broken = iomodel.levels(65536, 65536, 128, "float16", "h200", **H200)
    assert broken.hbm_bytes == broken.l2_bytes  # then every re-read is charged to HBM again
    npu = iomodel.levels(4096, 4096, 64, "float16", "edge_npu", block_q=32, block_k=32)
    assert not npu.kv_fits_l2 and npu.hbm_bytes == npu.l2_bytes  # no cache: the two-level model is exact


def test_heads_in_flight_follow_blocks_and_query_tiles():
    lv = iomodel.levels(4096, 4096, 128, "float16", "h200", concurrent_blocks=64, **H200)
    assert lv.blocks_per_head == 32 and lv.heads_in_flight == 3  # 64 consecutive blocks span at most 3 heads
    one = iomodel.levels(4096, 4096, 128, "float16", "h200", concurrent_blocks=1, **H200)
    assert one.heads_in_flight == 1
    gqa = iomodel.levels(4096, 4096, 128, "float16", "h200", heads_k=2, concurrent_blocks=64 * 32, **H200)
    assert gqa.heads_in_flight == 2 * 2  # only B x Hk distinct K / V heads exist
    with pytest.raises(ValueError, match="concurrent_blocks"):
        iomodel.levels(4096, 4096, 128, "float16", "h200", concurrent_blocks=0)


def test_fa3_beats_the_two_level_estimate_cudnn_reaches_it_fa2_stays_below_and_none_the_bound():
    ratio = {}
    for point in roofline.ATTENTION_SPEEDS:
        lv = iomodel.levels(point["seqlen"], point["seqlen"], point["head_dim"], point["dtype"], point["machine"],
                            batch=point.get("batch", 2), heads=point.get("heads", 16), block_q=128, block_k=64)
        b = roofline.attention_bounds(lv, point["machine"], point["dtype"])
        ratio[point["label"].split(",")[0]] = point["tflops"] * 1e12 / b["two_level"].flops_per_s
        assert point["tflops"] * 1e12 <= b["bound"].flops_per_s  # the true bound holds
        assert point["kind"] in ("paper", "measured") and point["source"]
    assert ratio["FlashAttention-3"] > 1.4  # "half as much again" as what was called "a bound" before
    assert ratio["PyTorch SDPA cuDNN"] == pytest.approx(1.0, abs=0.02)  # level with it
    assert ratio["PyTorch SDPA flash (FA2)"] < 0.7  # below it


# -- where the tensors live, and what spills ------------------------------------------------

def test_128x128_at_d128_spills_only_at_4_warps():
    budget = sram.tile_budget(128, 128, 128, "float16")
    four, eight = sram.tile_fit(budget, "h100_sxm", num_warps=4), sram.tile_fit(budget, "h100_sxm", num_warps=8)
    assert not four.fits and "spill" in four.reason  # 128 threads: more than 255 registers each
    assert eight.fits and eight.registers_per_thread <= 255  # 256 threads share the same bytes


def test_fa2_keeps_o_in_registers_fa3_reads_q_from_shared():
    fa2, fa3 = sram.PLACEMENT["fa2"], sram.PLACEMENT["fa3"]
    assert "registers" in fa2["O"] and "shared memory" in fa2["O"]  # accumulated in registers, leaves through smem
    assert "one buffer" in fa2["K"] and "one buffer" in fa2["V"] and "stages" not in fa2["pipelining"]
    assert "registers" in fa2["Q"] and "warp" in fa2["Q"]  # each warp its own rows
    assert "shared memory" in fa3["Q"] and "operand" in fa3["Q"]
    assert "stages" in fa3["K"] and "stages" in fa3["pipelining"]
    assert set(fa2) == set(fa3)


