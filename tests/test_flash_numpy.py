"""impl flash_numpy (course_lib.kernels.flash_numpy): the tiled forward, both loop orders.

Every answer is checked against the float64 reference with the course's
tolerance rule (``course_lib.checks.check_attention``), over random shapes,
tails, masks, dtypes and tile sizes.
"""
from functools import partial

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import course_lib
from course_lib import checks
from course_lib.core.masks import EMPTY, PARTIAL
from course_lib.core.options import call_forward
from course_lib.kernels import counted, flash_numpy
from course_lib.models import iomodel

from conftest import make_qkv

DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]
BLOCKS = [None, 1, 2, 3, 5, 7, 16, 33, 64, 100]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(loop_order, q, k, v, **options):
    """The flash forward in one loop order, through the public validation."""
    impl = {"fa2": "flash_numpy", "fa1": "flash_numpy_fa1"}[loop_order]
    return course_lib.attention(q, k, v, impl=impl, return_lse=True, **options)


@st.composite
def problems(draw):
    """A random attention problem: shapes with tails, GQA / MQA, a mask, options and tiles."""
    heads_k = draw(st.integers(1, 3))
    heads = heads_k * draw(st.integers(1, 3))
    batch = draw(st.sampled_from([1, 1, 2, 0]))
    seqlen_q = draw(st.integers(0, 70))
    seqlen_k = draw(st.integers(0, 70))
    head_dim = draw(st.sampled_from([1, 2, 7, 16, 59]))
    head_dim_v = draw(st.sampled_from([head_dim, 1, 3, 16]))
    dtype = draw(st.sampled_from(DTYPES))
    options = dict(block_q=draw(st.sampled_from(BLOCKS)), block_k=draw(st.sampled_from(BLOCKS)))
    mask = draw(st.sampled_from(["none", "causal", "causal_top_left", "window", "window_causal"]))
    if mask.startswith("causal"):
        options.update(causal=True, causal_align="top_left" if mask.endswith("top_left") else "bottom_right")
    if mask.startswith("window"):
        options["window_size"] = (draw(st.integers(-1, 20)), draw(st.integers(-1, 20)))
        options["causal"] = mask == "window_causal"
    if draw(st.booleans()):
        options["softcap"] = draw(st.sampled_from([0.5, 5.0, 30.0]))
    alibi = draw(st.sampled_from([None, "heads", "batch_heads"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if alibi == "heads":
        options["alibi_slopes"] = rng.uniform(0, 1, heads)
    elif alibi == "batch_heads":
        options["alibi_slopes"] = rng.uniform(0, 1, (batch, heads))
    arrays = make_qkv(rng, batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, head_dim_v, dtype)
    return arrays, options


@pytest.mark.parametrize("loop_order", ["fa2", "fa1"])
@SETTINGS
@given(problem=problems())
def test_flash_matches_the_reference_on_random_problems(loop_order, problem):
    (q, k, v), options = problem
    out, lse = run(loop_order, q, k, v, **options)
    assert out.dtype == q.dtype
    assert lse.dtype == (np.float64 if q.dtype == np.float64 else np.float32)
    checks.check_attention(out, q, k, v, lse=lse, name=loop_order, **options)


@pytest.mark.parametrize("loop_order", ["fa2", "fa1"])
@pytest.mark.parametrize("block_q, block_k", [(1, 1), (1, 70), (3, 5), (7, 64), (64, 7), (16, 16),
                                               (33, 17), (64, 64), (100, 100), (None, None)])
def test_every_tile_size_with_tails_gives_the_reference_answer(loop_order, block_q, block_k):
    rng = np.random.default_rng(block_q or 0)
    q, k, v = make_qkv(rng, 2, 4, 2, 37, 53, 59, 13, np.float32)
    for options in (dict(), dict(causal=True), dict(window_size=(5, 2), alibi_slopes=rng.uniform(0, 1, 4))):
        out, lse = run(loop_order, q, k, v, block_q=block_q, block_k=block_k, **options)
        checks.check_attention(out, q, k, v, lse=lse, block_q=block_q, block_k=block_k, **options)


def test_the_two_loop_orders_agree():
    rng = np.random.default_rng(3)
    q, k, v = make_qkv(rng, 1, 3, 1, 45, 29, 8, 8, np.float64)
    fa2 = run("fa2", q, k, v, causal=True, block_q=8, block_k=6)
    fa1 = run("fa1", q, k, v, causal=True, block_q=8, block_k=6)
    for a, b in zip(fa2, fa1):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("loop_order", ["fa2", "fa1"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_give_zero_and_minus_inf_lse(loop_order, dtype):
    rng = np.random.default_rng(4)
    q, k, v = make_qkv(rng, 2, 2, 1, 40, 9, 16, 16, dtype)
    # bottom-right causal with Nq > Nk: the first Nq - Nk rows see no key
    out, lse = run(loop_order, q, k, v, causal=True, block_q=8, block_k=4)
    hidden = 40 - 9
    assert not np.isnan(out.astype(np.float64)).any() and not np.isnan(lse).any()
    assert np.all(out[:, :, :hidden].astype(np.float64) == 0)
    assert np.all(np.isneginf(lse[:, :, :hidden])) and np.all(np.isfinite(lse[:, :, hidden:]))
    checks.check_attention(out, q, k, v, lse=lse, causal=True)
    # a window that misses every key in some rows, scattered through the tiles
    out, lse = run(loop_order, q, k, v, window_size=(0, 0), block_q=5, block_k=3)
    assert np.isneginf(lse).any() and not np.isnan(out.astype(np.float64)).any()
    checks.check_attention(out, q, k, v, lse=lse, window_size=(0, 0))


@pytest.mark.parametrize("loop_order", ["fa2", "fa1"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_logits_give_no_nan_or_inf(loop_order, dtype):
    rng = np.random.default_rng(5)
    q, k, v = make_qkv(rng, 1, 2, 2, 33, 47, 16, 8, dtype, q_scale=8.0, k_scale=8.0)
    for scale in (1e3, 1e4):  # scores in the tens of thousands: exp would overflow without the max
        out, lse = run(loop_order, q, k, v, softmax_scale=scale, block_q=7, block_k=6, causal=True)
        assert np.all(np.isfinite(out.astype(np.float64))) and np.all(np.isfinite(lse))
        if dtype == np.float64:
            checks.check_attention(out, q, k, v, lse=lse, softmax_scale=scale, causal=True)
    out, lse = run(loop_order, q, k, v, softmax_scale=-1e4, block_q=7, block_k=6)  # negative scale too
    assert np.all(np.isfinite(out.astype(np.float64))) and np.all(np.isfinite(lse))


@pytest.mark.parametrize("loop_order", ["fa2", "fa1"])
def test_empty_shapes_and_no_keys(loop_order):
    rng = np.random.default_rng(6)
    for shape in [(0, 2, 2, 5, 5), (1, 2, 2, 0, 5), (1, 2, 2, 5, 0)]:
        b, h, hk, nq, nk = shape
        q, k, v = make_qkv(rng, b, h, hk, nq, nk, 4, 3, np.float32)
        out, lse = run(loop_order, q, k, v, block_q=2, block_k=2)
        assert out.shape == (b, h, nq, 3) and lse.shape == (b, h, nq)
        assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_varlen_through_flash_numpy_matches_the_reference():
    rng = np.random.default_rng(7)
    cu_q, cu_k = np.array([0, 5, 5, 23, 40]), np.array([0, 9, 12, 12, 44])
    q = rng.standard_normal((40, 4, 8)).astype(np.float32)
    k = rng.standard_normal((44, 2, 8)).astype(np.float32)
    v = rng.standard_normal((44, 2, 6)).astype(np.float32)
    options = dict(causal=True, softcap=3.0, alibi_slopes=rng.uniform(0, 1, (4, 4)), block_q=4, block_k=3)
    out, lse = course_lib.attention_varlen(q, k, v, cu_q, cu_k, impl="flash_numpy", return_lse=True, **options)
    ref, ref_lse = course_lib.attention_varlen(q, k, v, cu_q, cu_k, impl="reference", return_lse=True, **options)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-4, atol=1e-5)


def test_inputs_are_not_modified():
    rng = np.random.default_rng(8)
    q, k, v = make_qkv(rng, 1, 2, 1, 9, 11, 4, 4, np.float16)
    copies = [x.copy() for x in (q, k, v)]
    run("fa2", q, k, v, causal=True, block_q=2, block_k=3)
    run("fa1", q, k, v, causal=True, block_q=2, block_k=3)
    for x, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(x, c)


# -- loop orders, validation and the tile counts -----------------------------------------------

def test_the_fa1_impl_validates_like_every_impl():
    q = np.zeros((1, 2, 4, 8))
    with pytest.raises(ValueError, match="head_dim"):
        course_lib.attention(q, np.zeros((1, 2, 4, 7)), np.zeros((1, 2, 4, 7)), impl="flash_numpy_fa1")
    with pytest.raises(ValueError, match="block_k"):
        course_lib.attention(q, q, q, impl="flash_numpy_fa1", block_k=0)


def test_an_unknown_loop_order_is_refused():
    q = np.zeros((1, 1, 2, 2))
    with pytest.raises(ValueError, match="loop_order"):
        call_forward(partial(flash_numpy.flash_forward, loop_order="fa3"), q, q, q)


def forward_stats(loop_order, q, k, v, **options):
    return flash_numpy.tile_stats(q, k, v, loop_order, **options)


@pytest.mark.parametrize("loop_order", ["fa2", "fa1"])
def test_empty_tiles_are_skipped_and_only_partial_tiles_masked(loop_order):
    rng = np.random.default_rng(9)
    q, k, v = make_qkv(rng, 1, 1, 1, 50, 50, 4, 4, np.float32)
    kinds = course_lib.core.masks.MaskSpec(50, 50, causal=True).tile_map(8, 8)
    stats = forward_stats(loop_order, q, k, v, causal=True, block_q=8, block_k=8)
    assert stats.skipped == np.sum(kinds == EMPTY)
    assert stats.computed == kinds.size - np.sum(kinds == EMPTY)
    assert stats.masked == np.sum(kinds == PARTIAL)
    stats = forward_stats(loop_order, q, k, v, block_q=8, block_k=8)
    assert (stats.computed, stats.skipped, stats.masked) == (49, 0, 0)


def test_each_call_owns_its_stats_and_leaves_no_module_state():
    q = np.ones((1, 1, 10, 2))
    _, _, stats = flash_numpy.run_with_stats(q, q, q, block_q=4, block_k=5)
    assert stats.computed == 3 * 2
    course_lib.attention(q[:, :, :4], q, q, impl="flash_numpy", block_q=4, block_k=5)  # another call ...
    assert stats.computed == 3 * 2  # ... leaves the first one's counts alone
    assert not hasattr(flash_numpy, "last_stats")


@pytest.mark.parametrize("loop_order", ["fa2", "fa1"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_the_counted_kernel_gives_the_same_outputs_and_counts(loop_order, dtype):
    rng = np.random.default_rng(11)
    q, k, v = make_qkv(rng, 2, 4, 2, 37, 29, 16, 8, dtype)
    options = dict(causal=True, softcap=5.0, alibi_slopes=rng.uniform(0, 0.5, 4), block_q=8, block_k=6)
    out, lse, stats = flash_numpy.run_with_stats(q, k, v, loop_order, **options)
    run = counted.run_counted(q, k, v, schedule=loop_order, return_lse=True, **options)
    np.testing.assert_array_equal(run.out, out)  # bit for bit: one loop body, not two copies
    np.testing.assert_array_equal(run.lse, lse)
    assert run.traffic == counted.traffic_of(loop_order, stats)


def test_hbm_traffic_fa2_reads_q_once_and_fa1_reads_k_and_v_once():
    B, H, N, D, Br, Bc = 2, 3, 40, 8, 8, 10
    q = np.zeros((B, H, N, D), dtype=np.float32)
    Tr, Tc, size = N // Br, N // Bc, 4
    fa2 = forward_stats("fa2", q, q, q, block_q=Br, block_k=Bc)
    # FA2: Q once, K and V once per query tile; O and lse written once
    assert fa2.hbm_read == B * H * size * (N * D + Tr * 2 * N * D)
    assert fa2.hbm_write == B * H * size * (N * D + N)
    fa1 = forward_stats("fa1", q, q, q, block_q=Br, block_k=Bc)
    # FA1: K and V once, Q, O, l and m read (and O, l, m written) once per K/V tile,
    # then l and m read once more to form lse
    assert fa1.hbm_read == B * H * size * (2 * N * D + Tc * (N * D + N * D + 2 * N) + 2 * N)
    # ... and O, l, m written once at the start (0, 0, -inf) and lse once at the end
    assert fa1.hbm_write == B * H * size * ((N * D + 2 * N) + Tc * (N * D + 2 * N) + N)
    assert fa2.hbm_bytes < fa1.hbm_bytes


@pytest.mark.parametrize("loop_order", ["fa2", "fa1"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape, options", [
    ((2, 3, 37, 53, 59, 13, 8, 6), {}),
    ((1, 2, 70, 24, 16, 16, 16, 8), dict(causal=True)),
    ((1, 1, 24, 70, 8, 4, 8, 16), dict(causal=True, causal_align="top_left")),
    ((2, 2, 50, 61, 8, 8, 8, 16), dict(causal=True, window_size=(12, -1))),
    ((1, 2, 64, 64, 8, 8, 1, 7), dict(window_size=(3, 3))),
])
def test_the_kernels_count_of_hbm_traffic_is_the_io_models(loop_order, dtype, shape, options):
    B, H, Nq, Nk, D, Dv, Br, Bc = shape
    q = np.zeros((B, H, Nq, D), dtype=dtype)
    k, v = np.zeros((B, 1, Nk, D), dtype=dtype), np.zeros((B, 1, Nk, Dv), dtype=dtype)
    stats = forward_stats(loop_order, q, k, v, block_q=Br, block_k=Bc, **options)
    model = iomodel.attention_io(loop_order, Nq, Nk, D, dtype, head_dim_v=Dv, block_q=Br, block_k=Bc, batch=B,
                                 heads=H, return_lse=True, **options)
    assert (stats.hbm_read, stats.hbm_write) == (model.read_bytes, model.write_bytes)
    assert counted.traffic_of(loop_order, stats) == model  # tensor by tensor, FLOPs and exponentials too


# What a few calls counted when the loops were written with their bookkeeping inline, before it moved into
# ``OnChip``: the counts are the course's (chapters 03, 05, 06 print them), so a refactor must keep every byte.
PINNED_COUNTS = {
    "fa2 float32 causal gqa tails": dict(
        reads={"Q": 28416, "K": 93696, "V": 62464}, writes={"O": 18944, "lse": 1184},
        computed=8, skipped=1, masked=5, flops=932480, exps=11656, sram_peak=6272),
    "fa2 float16 window": dict(
        reads={"Q": 3200, "K": 6912, "V": 5184}, writes={"O": 2400, "lse": 400},
        computed=14, skipped=22, masked=13, flops=171584, exps=3064, sram_peak=2624),
    "fa2 float8 descaled": dict(
        reads={"Q": 1056, "K": 5120, "V": 5120}, writes={"O": 4224, "lse": 264},
        computed=11, skipped=4, masked=4, flops=128000, exps=2000, sram_peak=1856),
    "fa1 bfloat16 causal": dict(
        reads={"K": 1280, "V": 1280, "Q": 2304, "O": 7168, "l": 896, "m": 896},
        writes={"O": 8448, "l": 896, "m": 896, "lse": 320},
        computed=6, skipped=3, masked=3, flops=69632, exps=2176, sram_peak=2944),
}


def pinned_call(name):
    def qkv(shape_q, shape_kv, dv, dtype):
        rng = np.random.default_rng(0)
        return (rng.standard_normal(shape_q).astype(dtype), rng.standard_normal(shape_kv).astype(dtype),
                rng.standard_normal(shape_kv[:3] + (dv,)).astype(dtype))
    return {
        "fa2 float32 causal gqa tails": ("fa2", qkv((2, 4, 37, 24), (2, 2, 45, 24), 16, np.float32),
                                         dict(causal=True, block_q=16, block_k=16)),
        "fa2 float16 window": ("fa2", qkv((1, 2, 50, 16), (1, 2, 70, 16), 12, np.float16),
                               dict(window_size=(5, 3), block_q=16, block_k=8)),
        "fa2 float8 descaled": ("fa2", qkv((1, 2, 33, 16), (1, 1, 40, 16), 16, ml_dtypes.float8_e4m3fn),
                                dict(causal=True, block_q=8, block_k=16, q_descale=np.full((1, 1), 0.5),
                                     k_descale=np.full((1, 1), 2.0), v_descale=np.full((1, 1), 1.5))),
        "fa1 bfloat16 causal": ("fa1", qkv((1, 2, 40, 8), (1, 2, 40, 8), 8, ml_dtypes.bfloat16),
                                dict(causal=True, block_q=16, block_k=16)),
    }[name]


@pytest.mark.parametrize("name", PINNED_COUNTS)
def test_the_counted_traffic_and_sram_peak_of_a_few_calls_stay_what_they_were(name):
    loop_order, (q, k, v), options = pinned_call(name)
    stats = flash_numpy.tile_stats(q, k, v, loop_order, **options)
    run = counted.run_counted(q, k, v, schedule=loop_order, return_lse=True, **options)
    got = dict(reads=dict(stats.reads), writes=dict(stats.writes), computed=stats.computed, skipped=stats.skipped,
               masked=stats.masked, flops=stats.flops, exps=stats.exps, sram_peak=run.sram_peak)
    assert got == PINNED_COUNTS[name]
