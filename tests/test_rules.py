"""The scalar rules every kernel shares (course_lib.core.rules): each one against
its definition, the vectorised numpy forms held equal to them, and the same
source compiled by numba giving the same answers."""
import math

import ml_dtypes
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.core import rules
from course_lib.core.masks import MaskSpec, apply_softcap
from course_lib.core.online_softmax import finalize, init_state, online_update
from course_lib.core.reference import lse_dtype
from course_lib.kernels import flash_numba_cpu as compiled

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
def test_tile_kind_is_empty_partial_or_full_exactly_as_its_elements_are(mask, block_q, block_k):
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
def test_maskspec_alibi_bias_is_minus_slope_times_the_scalar_distance(mask, slope):
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
def test_the_scalar_online_step_equals_the_vectorised_online_update(tiles, seed):
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal((len(t), 3)) for t in tiles]
    lse, out = scalar_row(tiles, values)
    m, l, o = init_state(1, 3)
    for s_tile, v_tile in zip(tiles, values):
        m, l, o, _ = online_update(m, l, o, np.array([s_tile]), v_tile)
    out_v, lse_v = finalize(m, l, o)
    assert np.allclose(out, out_v[0], rtol=1e-12, atol=1e-12)
    assert lse == pytest.approx(lse_v[0], rel=1e-12, abs=1e-12) or (math.isinf(lse) and lse == lse_v[0])


def test_a_row_that_sees_nothing_stays_minus_inf_zero_and_finalizes_to_zero_and_minus_inf():
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


def test_rescale_is_exp_of_the_max_growth():
    assert rules.rescale(1.0, 3.0) == pytest.approx(math.exp(-2.0))
    assert rules.rescale(2.0, 2.0) == 1.0


# -- precision ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,acc,p", [
    (np.float64, np.float64, None), (np.float32, np.float32, None),
    (np.float16, np.float32, np.float16), (ml_dtypes.bfloat16, np.float32, ml_dtypes.bfloat16)])
def test_dtype_rules(dtype, acc, p):
    assert rules.acc_dtype(dtype) == np.dtype(acc)
    assert rules.lse_dtype(dtype) == lse_dtype(dtype)
    assert (rules.p_round_dtype(dtype) is None) == (p is None)
    if p is not None:
        assert rules.p_round_dtype(dtype) == np.dtype(p)


@pytest.mark.parametrize("name,dtype", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)])
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
        assert compiled.alibi_distance(i, j, offset) == rules.alibi_distance(i, j, offset)
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
