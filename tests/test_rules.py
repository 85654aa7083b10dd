"""The scalar rules every kernel shares (course_lib.core.rules): each one against
its definition, the vectorised numpy forms held equal to them, the same source
compiled by numba giving the same answers, and the precision rule read by every
kernel, model and check (a change planted in it shows in each of them)."""
import math

import ml_dtypes
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib
from course_lib import checks, kernels
from course_lib.core import rules
from course_lib.core.masks import MaskSpec, apply_softcap
from course_lib.core.online_softmax import finalize, init_state, online_update
from course_lib.kernels import counted
from course_lib.kernels.cpu_steps import tile as compiled
from course_lib.models import iomodel, memory, sram

from conftest import make_qkv

masks = st.builds(
    MaskSpec,
    seqlen_q=st.integers(1, 30), seqlen_k=st.integers(1, 30), causal=st.booleans(),
    causal_align=st.sampled_from(["bottom_right", "top_left"]),
    window_size=st.tuples(st.integers(-1, 9), st.integers(-1, 9)))


def scalar_visible(mask, rule=rules.visible):
    left, right = mask.window
    return np.array([[rule(i, j, mask.offset, left, right) for j in range(mask.seqlen_k)]
                     for i in range(mask.seqlen_q)])


@settings(max_examples=120, deadline=None)
@given(mask=masks)
def test_maskspec_visible_equals_the_scalar_rule(mask):
    rows, cols = np.arange(mask.seqlen_q), np.arange(mask.seqlen_k)
    assert np.array_equal(mask.visible(rows, cols), scalar_visible(mask))


@settings(max_examples=120, deadline=None)
@given(mask=masks, block_q=st.integers(1, 11), block_k=st.integers(1, 11))
def test_tile_kind_is_empty_partial_or_full_as_its_elements(mask, block_q, block_k):
    seen = scalar_visible(mask)
    left, right = mask.window
    for q0 in range(0, mask.seqlen_q, block_q):
        for k0 in range(0, mask.seqlen_k, block_k):
            q1, k1 = min(q0 + block_q, mask.seqlen_q), min(k0 + block_k, mask.seqlen_k)
            tile = seen[q0:q1, k0:k1]
            expected = rules.FULL if tile.all() else rules.EMPTY if not tile.any() else rules.PARTIAL
            assert rules.tile_kind(q0, q1, k0, k1, mask.offset, left, right) == expected


@settings(max_examples=60, deadline=None)
@given(mask=masks, block_q=st.integers(1, 11), block_k=st.integers(1, 11))
def test_the_host_tile_plan_is_the_rule_tile_by_tile(mask, block_q, block_k):
    codes = mask.tile_codes(block_q, block_k)
    names = mask.tile_map(block_q, block_k)
    left, right = mask.window
    for t in range(codes.shape[0]):
        for c in range(codes.shape[1]):
            q0, k0 = t * block_q, c * block_k
            code = rules.tile_kind(q0, min(q0 + block_q, mask.seqlen_q), k0, min(k0 + block_k, mask.seqlen_k),
                                   mask.offset, left, right)
            assert codes[t, c] == code and names[t, c] == rules.KIND_NAMES[code]


def test_an_empty_range_is_an_empty_tile():
    assert rules.tile_kind(5, 5, 0, 8, 0, -1, -1) == rules.EMPTY
    assert rules.tile_kind(0, 8, 3, 3, 0, -1, -1) == rules.EMPTY


@settings(max_examples=60, deadline=None)
@given(mask=masks, slope=st.floats(0.01, 2.0))
def test_maskspec_alibi_bias_is_minus_slope_times_distance(mask, slope):
    rows, cols = np.arange(mask.seqlen_q), np.arange(mask.seqlen_k)
    expected = np.array([[-slope * rules.alibi_distance(i, j, mask.offset) for j in cols] for i in rows])
    assert np.array_equal(mask.alibi_bias(slope, rows, cols), expected)


@pytest.mark.parametrize("cap", [0.0, 0.5, 30.0])
def test_apply_softcap_equals_the_scalar_rule(cap):
    s = np.linspace(-200, 200, 101)
    assert np.allclose(apply_softcap(s, cap), [rules.softcap(x, cap) for x in s], rtol=1e-15, atol=0)
    if cap:
        assert np.all(np.abs([rules.softcap(x, cap) for x in s]) <= cap)


# -- the online softmax, one row and one score at a time ------------------------------

def scalar_row(scores_by_tile, values_by_tile):
    """The scalar rules run on one row, tile by tile: (lse, out)."""
    m, l = -math.inf, 0.0
    o = np.zeros(values_by_tile[0].shape[1])
    for s_tile, v_tile in zip(scores_by_tile, values_by_tile):
        m_new = m
        for s in s_tile:
            m_new = rules.max_nan(m_new, s)
        alpha, shift = rules.rescale(m, m_new), rules.shift_of(m_new)
        p = np.array([math.exp(s - shift) for s in s_tile])
        l = alpha * l + p.sum()
        o = alpha * o + p @ v_tile
        m = m_new
    lse, inv_l = rules.finalize(m, l)
    return lse, o * inv_l


tile_rows = st.lists(st.lists(st.one_of(st.floats(-30, 30), st.just(-math.inf)), min_size=1, max_size=5),
                     min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(tiles=tile_rows, seed=st.integers(0, 1000))
def test_the_scalar_online_step_equals_online_update(tiles, seed):
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal((len(t), 3)) for t in tiles]
    lse, out = scalar_row(tiles, values)
    m, l, o = init_state(1, 3)
    for s_tile, v_tile in zip(tiles, values):
        m, l, o, _ = online_update(m, l, o, np.array([s_tile]), v_tile)
    out_v, lse_v = finalize(m, l, o)
    assert np.allclose(out, out_v[0], rtol=1e-12, atol=1e-12)
    assert lse == pytest.approx(lse_v[0], rel=1e-12, abs=1e-12) or (math.isinf(lse) and lse == lse_v[0])


def test_a_row_seeing_nothing_finalizes_to_zero_and_minus_inf():
    lse, out = scalar_row([[-math.inf, -math.inf], [-math.inf]], [np.ones((2, 2)), np.ones((1, 2))])
    assert lse == -math.inf and np.array_equal(out, [0.0, 0.0])
    assert rules.rescale(-math.inf, -math.inf) == 0.0 and rules.shift_of(-math.inf) == 0.0


def test_a_nan_score_reaches_the_max_the_sum_and_the_lse():
    assert math.isnan(rules.max_nan(math.nan, 1.0)) and math.isnan(rules.max_nan(1.0, math.nan))
    assert math.isnan(rules.max_nan(-math.inf, math.nan))
    lse, out = scalar_row([[0.5, math.nan], [1.0]], [np.ones((2, 2)), np.ones((1, 2))])
    assert math.isnan(lse) and np.isnan(out).all()
    lse, _ = rules.finalize(math.nan, math.nan)
    assert math.isnan(lse)  # never -inf: that would say "saw no key"


row_states = st.one_of(
    st.tuples(st.floats(-50, 50), st.floats(1.0, 1e4), st.floats(-10, 10)),  # saw keys: l >= 1 (the max's own p)
    st.just((-math.inf, 0.0, 0.0)),                                          # saw nothing
    st.just((math.nan, math.nan, math.nan)))                                 # saw a NaN score


@settings(max_examples=100, deadline=None)
@given(state=row_states)
def test_numpy_finalize_is_the_scalar_finalize_on_arrays(state):
    m, l, o = state
    lse, inv_l = rules.finalize(m, l)
    out_v, lse_v = finalize(np.array([m]), np.array([l]), np.array([[o]]))
    assert lse_v[0] == pytest.approx(lse, rel=1e-15, nan_ok=True) or lse_v[0] == lse
    assert out_v[0, 0] == pytest.approx(o * inv_l, rel=1e-15, nan_ok=True)


def test_rescale_is_exp_of_the_max_growth():
    assert rules.rescale(1.0, 3.0) == pytest.approx(math.exp(-2.0))
    assert rules.rescale(2.0, 2.0) == 1.0


# -- precision ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,acc,p", [
    (np.float64, np.float64, None), (np.float32, np.float32, None),
    (np.float16, np.float32, np.float16), (ml_dtypes.bfloat16, np.float32, ml_dtypes.bfloat16)])
def test_dtype_rules(dtype, acc, p):
    assert rules.acc_dtype(dtype) == np.dtype(acc)
    assert rules.lse_dtype(dtype) is np.dtype(acc).type  # lse in the accumulation dtype
    assert (rules.p_round_dtype(dtype) is None) == (p is None) == (not rules.is_low_precision(dtype))
    if p is not None:
        assert rules.p_round_dtype(dtype) == np.dtype(p)


@pytest.mark.parametrize("dtype,name,size", [
    (np.float64, "float64", 8), ("fp32", "float32", 4), (np.dtype(np.float16), "float16", 2), ("half", "float16", 2),
    (ml_dtypes.bfloat16, "bfloat16", 2), ("bf16", "bfloat16", 2), ("fp8", "float8_e4m3fn", 1),
    (ml_dtypes.float8_e5m2, "float8_e5m2", 1)])
def test_a_dtype_by_type_or_short_name_has_one_name_and_itemsize(dtype, name, size):
    assert rules.dtype_name(dtype) == name and rules.itemsize(dtype) == size
    assert rules.acc_dtype(dtype) == (np.float64 if name == "float64" else np.float32)


def test_itemsize_refuses_an_unknown_dtype_naming_the_known():
    with pytest.raises(ValueError, match=r"dtype must be one of \['bfloat16'.*got 'int8'"):
        rules.itemsize("int8")


def _every_caller(q, k, v):
    """(out, lse) of every impl and counted schedule for (q, k, v), causal, 8 x 8 tiles."""
    options = dict(causal=True, block_q=8, block_k=8)
    results = {impl: course_lib.attention(q, k, v, impl=impl, return_lse=True, **options)
               for impl in course_lib.available_impls() if q.dtype == np.float32 or not kernels.IMPLS[impl].cuda}
    for schedule in counted.SCHEDULES:
        run = counted.run_counted(q, k, v, schedule=schedule, return_lse=True, **options)
        results[f"counted {schedule}"] = run.out, run.lse
    return results


def _cuda(name):
    return name in kernels.IMPLS and kernels.IMPLS[name].cuda


def test_a_planted_lse_dtype_is_what_every_impl_returns(monkeypatch):
    q, k, v = make_qkv(6, 1, 2, 1, 16, 24, 32, 8, np.float32)
    monkeypatch.setattr(rules, "lse_dtype", lambda dtype: np.float64)
    for name, (out, lse) in _every_caller(q, k, v).items():
        assert out.dtype == np.float32 and lse.dtype == np.float64, name
    empty = course_lib.attention(q[:0], k[:0], v[:0], return_lse=True)[1]
    assert empty.dtype == np.float64


def test_a_planted_accumulator_reaches_kernels_models_and_checks(monkeypatch):
    q, k, v = make_qkv(6, 1, 2, 1, 16, 24, 32, 8, np.float32)
    expected = course_lib.attention(*(x.astype(np.float64) for x in (q, k, v)), causal=True)
    before = _every_caller(q, k, v)
    budget, io = sram.tile_budget(64, 64, 64, "float32"), iomodel.attention_io("fa1", 256, 256, 64, "float32")
    bound = checks.attention_tolerance(q, k, v, expected, causal=True)[0]
    monkeypatch.setattr(rules, "acc_dtype", lambda dtype: np.dtype(np.float64))
    after = _every_caller(q, k, v)
    for name, (out, lse) in after.items():
        assert out.dtype == np.float32 and lse.dtype == np.float64, name  # lse follows the accumulator
        if name != "reference" and not _cuda(name):  # float64 throughout; the CUDA kernels float32 only
            assert not np.array_equal(out, before[name][0]), f"{name} did not accumulate in float64"
    assert sram.tile_budget(64, 64, 64, "float32").register_bytes > budget.register_bytes
    assert iomodel.attention_io("fa1", 256, 256, 64, "float32").bytes > io.bytes  # FA1's O, l, m scratch
    assert checks.attention_tolerance(q, k, v, expected, causal=True)[0] != bound  # naive, the baseline, too


def test_a_planted_p_rounding_reaches_the_tiled_kernels_and_sram(monkeypatch):
    q, k, v = make_qkv(6, 1, 2, 1, 16, 24, 32, 8, np.float32)
    before = _every_caller(q, k, v)
    assert "P in float32" not in [item.name for item in sram.tile_budget(64, 64, 64, "float32").items]
    monkeypatch.setattr(rules, "p_round_dtype", lambda dtype: np.dtype(np.float16))
    after = _every_caller(q, k, v)
    # the reference is exact; counted naive stores S and P in the input dtype; the CUDA kernel is float32 only
    for name, (out, _) in after.items():
        unrounded = name in ("reference", "counted naive") or _cuda(name)
        assert np.array_equal(out, before[name][0]) == unrounded, name
    assert "P in float32" in [item.name for item in sram.tile_budget(64, 64, 64, "float32").items]


def test_a_planted_itemsize_reaches_every_model(monkeypatch):
    monkeypatch.setattr(rules, "itemsize", lambda dtype: 3)
    assert memory.score_bytes(1, 2, 5, 7, "float16") == 2 * 5 * 7 * 3
    assert memory.qkvo_bytes(1, 1, 5, 4, "float16") == 4 * 5 * 4 * 3
    assert sram.tile_budget(16, 8, 4, "float16").shared_bytes == (16 + 8 + 8) * 4 * 3
    assert iomodel.matmul_io(2, 3, 4, "float16").bytes == (2 * 4 + 4 * 3 + 2 * 3) * 3


@pytest.mark.parametrize("name,dtype", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16),
                                        ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
                                        ("float8_e5m2", ml_dtypes.float8_e5m2)])
def test_round_to_bits_is_a_cast_to_the_low_precision_dtype(name, dtype):
    rng = np.random.default_rng(3)
    # P's values: 0..1, down into the subnormals, and the halfway cases
    x = np.concatenate([rng.random(3000), np.exp(-rng.random(3000) * 110), [0.0, 1.0, 2.0 ** -25, 2.0 ** -24]])
    x = x.astype(np.float32)
    bits, min_exponent = rules.ROUNDING[name]
    ours = np.array([rules.round_to_bits(float(v), bits, min_exponent) for v in x], dtype=np.float32)
    assert np.array_equal(ours, x.astype(dtype).astype(np.float32))
    assert rules.round_to_bits(0.3, 0, 0) == 0.3


# -- the same source, compiled -----------------------------------------------------------

def test_the_rules_compiled_by_numba_give_the_python_answers():
    rng = np.random.default_rng(4)
    for _ in range(200):
        i, j, offset = (int(x) for x in rng.integers(-20, 20, 3))
        left, right = (int(x) for x in rng.integers(-1, 6, 2))
        assert compiled.visible(i, j, offset, left, right) == rules.visible(i, j, offset, left, right)
        n_keys = int(rng.integers(1, 12))
        assert compiled.alibi_rebased_distance(i, j, offset, n_keys) == rules.alibi_rebased_distance(i, j, offset,
                                                                                                     n_keys)
        assert compiled.alibi_anchor(i, offset, n_keys) == rules.alibi_anchor(i, offset, n_keys)
        a, b = rng.standard_normal(2) * 10
        assert compiled.softcap(a, 3.0) == pytest.approx(rules.softcap(a, 3.0), rel=1e-15)
        assert compiled.rescale(min(a, b), max(a, b)) == pytest.approx(rules.rescale(min(a, b), max(a, b)), rel=1e-15)
        assert compiled.finalize(a, abs(b)) == pytest.approx(rules.finalize(a, abs(b)), rel=1e-15)
    assert math.isnan(compiled.max_nan(1.0, math.nan)) and math.isnan(compiled.max_nan(math.nan, 1.0))
    assert compiled.finalize(-math.inf, 0.0) == (-math.inf, 0.0)
    assert compiled.shift_of(-math.inf) == 0.0
    tile_kind = numba.njit(rules.tile_kind)  # the host decides tiles, but the rule compiles too
    for q0, q1, k0, k1 in [(0, 4, 0, 4), (8, 12, 0, 4), (0, 4, 8, 12), (3, 9, 2, 7)]:
        assert tile_kind(q0, q1, k0, k1, 0, -1, 0) == rules.tile_kind(q0, q1, k0, k1, 0, -1, 0)
    round_to_bits = compiled.round_to_bits
    for x in rng.random(100):
        assert round_to_bits(x, 11, -24) == rules.round_to_bits(x, 11, -24)
