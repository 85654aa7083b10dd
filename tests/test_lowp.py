"""Chapter 11's library: formats and scales, fp8 inputs, the e4m3 rule, the fallback and the schedule model."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib
from course_lib import checks
from course_lib.core import rules
from course_lib.lowp import conversion, fallback, formats, overlap, precision, study

from conftest import make_qkv

E4M3 = ml_dtypes.float8_e4m3fn
FP8_IMPLS = ("reference", "naive", "flash_numpy", "flash_numba_cpu")


def fp8_inputs(rng, B=2, H=4, Hk=2, Nq=70, Nk=90, D=32):
    q, k, v = make_qkv(rng, B, H, Hk, Nq, Nk, D)
    (q8, qd), (k8, kd), (v8, vd) = (formats.quantize(x, heads_k=Hk) for x in (q, k, v))
    return q8, k8, v8, dict(q_descale=qd, k_descale=kd, v_descale=vd)


# -- the e4m3 rounding rule ---------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=True, allow_infinity=True))
def test_round_e4m3_is_ml_dtypes_rounding(x):
    expected = float(np.float32(x).astype(E4M3).astype(np.float64))
    got = rules.round_e4m3(x)
    assert (math.isnan(got) and math.isnan(expected)) or got == expected


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 1.0, width=32))
def test_the_kernels_p_rounding_is_e4m3_on_zero_to_one(p):
    bits, min_exponent = rules.ROUNDING["float8_e4m3fn"]
    assert rules.round_to_bits(p, bits, min_exponent) == rules.round_e4m3(p)


def test_round_e4m3_compiles_with_numba():
    numba = pytest.importorskip("numba")
    f = numba.njit(rules.round_e4m3)
    assert f(0.3) == 0.3125 and f(464.0) == 448.0 and math.isnan(f(465.0)) and f(1e-3) == 2.0 ** -9


# -- formats and scales -------------------------------------------------------------------------

def test_format_table_is_ml_dtypes_finfo():
    f = formats.FORMATS["float8_e4m3fn"]
    assert (f.max, f.smallest_normal, f.smallest_subnormal, f.bits, f.has_inf) == (448.0, 2.0 ** -6, 2.0 ** -9, 4, False)
    assert formats.FORMATS["float8_e5m2"].max == 57344.0 and formats.FORMATS["float16"].eps == 2.0 ** -10
    assert formats.FORMATS["bfloat16"].bits == 8


def test_spacing_matches_nextafter_in_float16():
    x = np.array([1.0, 3.0, 1000.0, 1e-3])
    assert np.allclose(formats.spacing(x, "float16"),
                       np.nextafter(x.astype(np.float16), np.float16(np.inf)).astype(np.float64) - x.astype(np.float16))


def test_quantize_per_head_gives_fa3_descales_that_round_trip():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 50, 16)) * np.array([1, 2, 3, 4])[None, :, None, None]
    q8, d = formats.quantize(q, heads_k=2)
    assert q8.dtype == E4M3 and d.shape == (2, 2) and d.dtype == np.float32
    assert np.abs(q8.astype(np.float32)).max() == 448.0      # each group's amax lands on the format's top
    back = formats.dequantize(q8, d)
    assert np.max(np.abs(back - q) / np.maximum(np.abs(q), 2 ** -6 * d.max())) < 0.07


def test_an_outlier_hurts_a_per_tensor_scale_more_than_per_head():
    rng = np.random.default_rng(1)
    k = rng.standard_normal((1, 4, 256, 64))
    k[:, 0, 0, 0] = 1e5   # one element of head 0: the other heads' values fall into e4m3's subnormals
    tensor = formats.quantization_error(k, granularity="tensor")
    head = formats.quantization_error(k, granularity="head")
    assert tensor["flushed"] > 3 * head["flushed"]   # head 0, the outlier's own, still flushes
    assert tensor["median_rel"] > 3 * head["median_rel"]


def test_block_scales_follow_the_sequence():
    x = np.ones((1, 1, 300, 8))
    x[0, 0, 200:] *= 100
    a = formats.amax(x, "block", block=128)
    assert a.shape == (1, 1, 3) and a.tolist() == [[[1.0, 100.0, 100.0]]]


def test_incoherent_processing_keeps_qk_and_shrinks_the_amax_of_an_outlier_channel():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((1, 1, 32, 64)), rng.standard_normal((1, 1, 128, 64))
    k[..., 0] *= 50
    qi, ki = formats.incoherent(q, k, rng)
    assert np.allclose(qi @ np.swapaxes(ki, -1, -2), q @ np.swapaxes(k, -1, -2))
    assert np.abs(ki).max() < np.abs(k).max() / 3


def test_hadamard_is_orthogonal_and_refuses_other_sizes():
    h = formats.hadamard(16)
    assert np.allclose(h @ h.T, np.eye(16))
    with pytest.raises(ValueError, match="power-of-two"):
        formats.hadamard(12)


# -- fp8 through course_lib.attention -------------------------------------------------------------

@pytest.mark.parametrize("impl", FP8_IMPLS)
@pytest.mark.parametrize("options", [{}, {"causal": True, "block_q": 32, "block_k": 48},
                                     {"softcap": 5.0, "window_size": (20, 3)}])
def test_fp8_inputs_pass_the_fp8_tolerance_rule(impl, options):
    q8, k8, v8, descales = fp8_inputs(np.random.default_rng(3))
    out, lse = course_lib.attention(q8, k8, v8, impl=impl, return_lse=True, **descales, **options)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    checks.check_attention(out, q8, k8, v8, lse=lse, **descales, **options)


def test_fp8_reference_is_the_float64_attention_of_the_dequantised_inputs():
    q8, k8, v8, d = fp8_inputs(np.random.default_rng(4))
    out = course_lib.attention(q8, k8, v8, **d)
    deq = [formats.dequantize(x, dx) for x, dx in zip((q8, k8, v8), (d["q_descale"], d["k_descale"], d["v_descale"]))]
    assert np.allclose(out, course_lib.attention(*deq), atol=1e-6)


def test_a_kernel_that_forgets_v_descale_fails_the_check():
    q8, k8, v8, d = fp8_inputs(np.random.default_rng(5))
    wrong = course_lib.attention(q8, k8, v8, impl="flash_numpy", **{**d, "v_descale": np.ones_like(d["v_descale"])})
    with pytest.raises(checks.CheckFailed):
        checks.check_attention(wrong, q8, k8, v8, **d)


def test_rounding_the_normalised_p_to_e4m3_fails_the_check_at_long_rows():
    """The bug the set asks about: P / l has entries near 1 / N, e4m3's subnormals; exp(S - m) does not."""
    q8, k8, v8, d = fp8_inputs(np.random.default_rng(6), B=1, H=2, Hk=2, Nq=16, Nk=2048, D=32)
    deq = [formats.dequantize(x, dx) for x, dx in zip((q8, k8, v8), d.values())]
    s = deq[0] @ np.swapaxes(deq[1], -1, -2) / math.sqrt(32)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    wrong = (p.astype(E4M3).astype(np.float64) @ deq[2]).astype(np.float32)
    with pytest.raises(checks.CheckFailed):
        checks.check_attention(wrong, q8, k8, v8, **d)


def test_fp8_without_descales_names_the_missing_argument():
    q8, k8, v8, d = fp8_inputs(np.random.default_rng(7))
    with pytest.raises(TypeError, match="q_descale"):
        course_lib.attention(q8, k8, v8)
    with pytest.raises(TypeError, match="v_descale"):
        course_lib.attention(q8, k8, v8, q_descale=d["q_descale"], k_descale=d["k_descale"])


@pytest.mark.parametrize("bad", [np.ones((2, 4)), np.ones((2,)), np.ones((1, 2))])
def test_descales_of_the_wrong_shape_are_refused_with_the_expected_shape(bad):
    q8, k8, v8, d = fp8_inputs(np.random.default_rng(8))
    with pytest.raises(ValueError, match=r"k_descale must have shape \(batch, heads_k\) = \(2, 2\)"):
        course_lib.attention(q8, k8, v8, **{**d, "k_descale": bad})


def test_descales_must_be_positive_float_arrays():
    q8, k8, v8, d = fp8_inputs(np.random.default_rng(8))
    with pytest.raises(ValueError, match="q_descale must be finite and > 0"):
        course_lib.attention(q8, k8, v8, **{**d, "q_descale": np.zeros((2, 2))})
    with pytest.raises(TypeError, match="q_descale must be a float numpy array"):
        course_lib.attention(q8, k8, v8, **{**d, "q_descale": 1.0})


def test_descales_on_other_inputs_are_refused():
    x = np.zeros((1, 2, 4, 8), np.float32)
    with pytest.raises(TypeError, match="q_descale applies to float8_e4m3fn inputs only"):
        course_lib.attention(x, x, x, q_descale=np.ones((1, 2)))


def test_fp8_where_the_kernel_cannot_take_it_is_a_clear_error():
    q8, k8, v8, d = fp8_inputs(np.random.default_rng(9))
    with pytest.raises(TypeError, match=r"flash_numpy_fa1 \(FA1's loop order\) takes no float8_e4m3fn.*FA2-order twin"):
        course_lib.attention(q8, k8, v8, impl="flash_numpy_fa1", **d)
    with pytest.raises(TypeError, match="attention_varlen"):
        course_lib.attention_varlen(q8[0].transpose(1, 0, 2), k8[0].transpose(1, 0, 2), v8[0].transpose(1, 0, 2),
                                    np.array([0, 70]), np.array([0, 90]))


def test_fp8_empty_inputs_give_float32_zeros():
    q8, k8, v8, d = fp8_inputs(np.random.default_rng(10), Nq=0)
    out, lse = course_lib.attention(q8, k8, v8, impl="flash_numpy", return_lse=True, **d)
    assert out.shape == (2, 4, 0, 32) and out.dtype == np.float32 and lse.dtype == np.float32


# -- the precision hook ---------------------------------------------------------------------------

@pytest.mark.parametrize("p", ["fp32", "fp16", "bf16", "fp8"])
def test_attention_at_returns_the_models_dtype_and_errs_like_its_precision(p):
    q, k, v = make_qkv(11, 1, 2, 2, 40, 40, 16, dtype=np.float32)
    exact = course_lib.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal=True)
    out = precision.precision_attention(p)(q, k, v, causal=True)
    assert out.dtype == np.float32 and out.shape == exact.shape
    bound = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 5e-2, "fp8": 0.3}[p]
    assert 0 < np.abs(out - exact).max() < bound


def test_auto_precision_needs_a_budget():
    x = np.zeros((1, 1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="budget"):
        precision.attention_at("auto", x, x, x)
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.precision_attention("fp4")


# -- the error study --------------------------------------------------------------------------------

def test_each_source_alone_and_the_exact_recipe():
    q, k, v = study.study_inputs(np.random.default_rng(12), seqlen_k=1024, seqlen_q=16)
    r = study.measure(q, k, v, {"exact": study.Recipe(), **study.SOURCES, **study.RECIPES})
    assert r["exact"]["out_max"] == 0.0
    assert r["fp8 P alone"]["lse_max"] == 0.0          # l sums the unrounded P: lse does not see P rounding
    assert r["fp8"]["out_max"] > r["fp16"]["out_max"] * 10
    assert r["fp16 P alone"]["out_max"] < r["fp8 P alone"]["out_max"]


def test_fa3s_recipe_shifts_p_by_2_to_the_8_and_lse_takes_it_back():
    """hopper/softmax.h: Max_offset = 8 for fp8, subtracted from the row max before exp2, so P lies in
    [0, 256]; finalize divides the row sum by 2**8 before lse's log."""
    fa3, plain = study.RECIPES["fp8 FA3"], study.RECIPES["fp8"]
    assert fa3.p_shift == study.FA3_MAX_OFFSET == 8 and plain.p_shift == 0
    assert (fa3.inputs, fa3.p) == (plain.inputs, plain.p) == ("float8_e4m3fn", "float8_e4m3fn")
    assert study.flush_below(fa3) == 2.0 ** -18 and study.flush_below(plain) == 2.0 ** -10
    q, k, v = study.study_inputs(np.random.default_rng(21), seqlen_k=2048, seqlen_q=16)
    r = study.measure(q, k, v, {"shifted": study.SOURCES["fp8 FA3 P alone"], "plain": study.SOURCES["fp8 P alone"]})
    assert r["shifted"]["lse_max"] < 1e-12      # the 2**8 is taken back out of lse, exactly
    s = q @ np.swapaxes(k, -1, -2) / 8.0
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    for recipe in (study.SOURCES["fp8 FA3 P alone"], study.SOURCES["fp8 P alone"]):   # exact inputs: S as above
        flushed = study.weights(q, k, recipe) == 0
        assert np.array_equal(flushed, p <= study.flush_below(recipe))   # ties (exactly half a subnormal) go to 0
    assert (p <= 2.0 ** -10).sum() > 10 * max(1, (p <= 2.0 ** -18).sum())   # the shift keeps most of them


def test_the_saturating_cast_clamps_where_numpys_cast_gives_nan_or_inf():
    x = np.array([1.0, 448.0, 464.0, 465.0, 1e5, -1e5, np.inf, np.nan], np.float32)
    plain = formats.cast(x, "float8_e4m3fn").astype(np.float32)
    clamped = formats.cast(x, "float8_e4m3fn", saturate=True).astype(np.float32)
    assert np.array_equal(plain[:3], [1, 448, 448]) and np.isnan(plain[3:]).all()
    assert np.array_equal(clamped[:7], [1, 448, 448, 448, 448, -448, 448]) and np.isnan(clamped[7])
    assert np.array_equal(formats.cast(np.float32(1e5), "float16", saturate=True), np.float16(65504))
    x8, d = formats.quantize(np.full((1, 1, 4, 4), 3.0), descale=np.full((1, 1), 2.0 ** -8, np.float32), saturate=True)
    assert np.all(formats.dequantize(x8, d) == 448 * 2.0 ** -8)   # a stale descale: clipped, not NaN


def test_row_kl_is_zero_for_the_same_rows_and_finite_where_a_weight_is_flushed():
    p = np.array([[0.5, 0.5, 0.0], [0.9, 0.1, 0.0]])
    assert np.allclose(study.row_kl(p, p), 0)
    kl = study.row_kl(p, np.array([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0]]))
    assert np.isfinite(kl).all() and kl[0] > 1 and kl[1] == 0


# -- the fallback policy (adversarial inputs) ---------------------------------------------------------

def _inputs(rng, outlier=1.0, scale=1.0, n=1024):
    return study.study_inputs(rng, seqlen_k=n, seqlen_q=128, logit_scale=scale, outlier=outlier)


def test_plain_inputs_take_fp8_at_a_loose_budget():
    choice = fallback.choose_precision(*_inputs(np.random.default_rng(13)), budget=0.05)
    assert choice.precision == "fp8" and "within the budget" in choice.reason


def test_an_outlier_channel_in_k_falls_back_to_fp16():
    choice = fallback.choose_precision(*_inputs(np.random.default_rng(14), outlier=100.0), budget=0.05)
    assert choice.precision == "fp16" and choice.predicted["fp8"] > 0.05


def test_a_stale_descale_that_k_overflows_refuses_fp8():
    q, k, v = _inputs(np.random.default_rng(15))
    stale = [formats.descale_for(formats.amax(x, "head", 1)) for x in (q, k, v)]
    k = k * 4  # today's K is 4x yesterday's amax
    choice = fallback.choose_precision(q, k, v, budget=0.05, descales=stale)
    assert choice.precision == "fp16" and "K's amax" in choice.reason and "fp8" not in choice.predicted
    ratio = float(np.abs(k).max() / (448 * stale[1].max()))
    assert f"clip its largest values by {1 - 1 / ratio:.0%}" in choice.reason and "NaN" not in choice.reason


def test_descales_computed_from_the_inputs_themselves_never_count_as_an_overflow():
    q, k, v = _inputs(np.random.default_rng(15))
    v = v * (3.5 * (1 + 2.0 ** -30) / np.abs(v).max())  # amax / 448 = 2**-7 (1 + 2**-30): float32 drops the tail
    own = [formats.descale_for(formats.amax(x, "head", 1)) for x in (q, k, v)]
    assert np.abs(v).max() / own[2].max() > 448  # so amax / descale is a hair above 448, and rounds to 448
    assert fallback.choose_precision(q, k, v, budget=1.0, descales=own).precision == "fp8"
    assert fallback.choose_precision(q, k * 1.1, v, budget=1.0, descales=own).precision == "fp16"


def test_values_beyond_float16_and_nan_fall_back_to_fp32():
    q, k, v = _inputs(np.random.default_rng(16))
    assert fallback.choose_precision(q, k, v * 1e5, budget=1e-9).precision == "fp32"
    v[0, 0, 3, 3] = np.nan
    assert fallback.choose_precision(q, k, v, budget=1.0).precision == "fp32"


def test_a_tight_budget_falls_back_step_by_step():
    args = _inputs(np.random.default_rng(17))
    chosen = [fallback.choose_precision(*args, budget=b).precision for b in (0.1, 1e-3, 1e-7)]
    assert chosen == ["fp8", "fp16", "fp32"]


def test_the_prediction_bounds_the_full_error_on_every_row():
    q, k, v = _inputs(np.random.default_rng(18), scale=2.0)
    predicted = fallback.predicted_error(q, k, v, study.RECIPES["fp8"])
    exact, _ = study.emulate(q, k, v)
    out, _ = study.emulate(q, k, v, study.RECIPES["fp8"])
    assert np.abs(out - exact).max() <= predicted


# -- conversion placement --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [E4M3, np.float16])
def test_every_place_of_the_conversion_computes_the_same_scores(dtype):
    pytest.importorskip("numba")
    rng = np.random.default_rng(19)
    q = rng.standard_normal((70, 16)).astype(np.float32)
    low = rng.standard_normal((130, 16)).astype(dtype)
    bits, table = conversion.as_bits(low), conversion.decode_table(low.dtype)
    expected = q @ low.astype(np.float32).T
    k32 = np.empty((130, 16), np.float32)
    conversion.decode_all(bits, table, k32)
    results = [np.empty((70, 130), np.float32) for _ in range(3)]
    conversion.scores_f32(q, k32, results[0])
    conversion.scores_tile(q, bits, table, results[1], 32, 64)
    conversion.scores_in_loop(q, bits, table, results[2])
    for s in results:
        assert np.allclose(s, expected, atol=1e-4)


def test_conversion_counts_grow_with_the_place():
    assert [conversion.conversions(256, 1024, 64, p, 64) for p in ("once", "tile", "in_loop")] == \
        [1024 * 64, 4 * 1024 * 64, 256 * 1024 * 64]


# -- the schedule model --------------------------------------------------------------------------------

COSTS = {"load": 1.0, "gemm0": 4.0, "softmax": 2.0, "gemm1": 4.0}


@pytest.mark.parametrize("name", overlap.SCHEDULES)
def test_the_simulator_tends_to_the_closed_form(name):
    per_tile = overlap.run(name, COSTS, n_tiles=200)["per_tile"]
    assert per_tile == pytest.approx(overlap.steady_state(name, COSTS), rel=0.02)


def test_no_resource_runs_two_ops_at_once_and_dependencies_hold():
    spans = overlap.simulate(overlap.build("pingpong_intra", COSTS, 6))
    for resource in {s.op.resource for s in spans}:
        mine = sorted((s.start, s.end) for s in spans if s.op.resource == resource)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(mine, mine[1:]))
    ends = [s.end for s in spans]
    assert all(ends[d] <= s.start + 1e-12 for s in spans for d in s.op.deps)


def test_serial_is_the_sum_and_pingpong_hides_a_softmax_half_the_gemms():
    serial = overlap.run("serial", COSTS, 10)
    assert serial["time"] == pytest.approx(10 * sum(COSTS.values()))
    assert overlap.run("pingpong", COSTS, 100)["tc_busy"] > 0.97
    assert overlap.run("async_loads", COSTS, 100)["tc_busy"] == pytest.approx(8 / 10, rel=0.02)


def test_stage_costs_follow_the_published_rates():
    c = overlap.stage_costs("h100_sxm", kv_sharing=1e9)
    # FA3, section 3: at head dim 128 the exponentials take about half the time of the two GEMMs
    assert c["softmax"] / (c["gemm0"] + c["gemm1"]) == pytest.approx(0.5, rel=0.02)
    assert c["load"] < 1e-3 * c["gemm0"]


def test_unknown_schedules_are_refused():
    with pytest.raises(ValueError, match="schedule must be one of"):
        overlap.build("warp_magic", COSTS, 4)
