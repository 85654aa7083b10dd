"""The reference and naive impls against an independent float64 oracle, and
every semantic of the public API (shared/DESIGN.md), one test per rule.  The
rules every impl keeps beyond these (varlen, untouched inputs, a NaN in one
row) are tests/test_every_impl.py's; the check's tolerance rule is
tests/test_checks_tolerance.py's, other libraries' conventions
tests/test_conventions.py's."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import course_lib
from course_lib import checks

from conftest import attention_problems, make_qkv
from oracle import oracle_attention

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), BF16]
# Independent bounds for an impl in a given dtype against the float64 oracle,
# for unit-normal inputs and head_dim <= 16 (a few roundings of O(1) values).
ORACLE_BOUND = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-2, "bfloat16": 1.2e-1}
BASE_IMPLS = ["reference", "naive"]


def assert_matches_oracle(out, lse, q, k, v, **options):
    expected, expected_lse = oracle_attention(q, k, v, **options)
    bound = ORACLE_BOUND[q.dtype.name]
    assert out.shape == expected.shape and out.dtype == q.dtype
    err = np.abs(out.astype(np.float64) - expected)
    assert np.all(err <= bound * (1 + np.abs(expected))), f"max error {err.max():.3g} > {bound}"
    assert lse.shape == expected_lse.shape
    assert np.array_equal(np.isneginf(lse), np.isneginf(expected_lse))
    finite = np.isfinite(expected_lse)
    assert np.all(np.abs(lse.astype(np.float64)[finite] - expected_lse[finite])
                  <= bound * (1 + np.abs(expected_lse[finite])))


# -- property tests ------------------------------------------------------------

# small problems (Nq, Nk < 10, head_dim <= 16: ORACLE_BOUND's) in every dtype, every mask and a softmax scale
PROBLEMS = attention_problems(softmax_scale=st.sampled_from([None, 0.3, 1.7]))


@pytest.mark.parametrize("impl", BASE_IMPLS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=PROBLEMS)
def test_impl_matches_independent_oracle(impl, problem):
    shape, options, dtype, seed = problem
    q, k, v = make_qkv(seed, dtype=dtype, **shape)
    out, lse = course_lib.attention(q, k, v, impl=impl, return_lse=True, **options)
    assert lse.dtype == (np.float64 if dtype == np.float64 else np.float32)
    assert not np.isnan(out.astype(np.float64)).any()
    assert_matches_oracle(out, lse, q, k, v, **options)


@settings(max_examples=25, deadline=None)
@given(problem=PROBLEMS)
def test_naive_passes_the_course_check(problem):
    shape, options, dtype, seed = problem
    q, k, v = make_qkv(seed, dtype=dtype, **shape)
    out, lse = course_lib.attention(q, k, v, impl="naive", return_lse=True, **options)
    checks.check_attention(out, q, k, v, lse=lse, **options)


# -- one test per semantic ----------------------------------------------------------

@pytest.fixture
def qkv():
    return make_qkv(np.random.default_rng(7), 2, 4, 2, 5, 8, 6, 3)


@pytest.mark.parametrize("impl", BASE_IMPLS)
def test_scale_defaults_to_one_over_sqrt_head_dim(impl, qkv):
    q, k, v = qkv
    assert np.allclose(course_lib.attention(q, k, v, impl=impl),
                       course_lib.attention(q, k, v, impl=impl, softmax_scale=1 / math.sqrt(6)))
    assert not np.allclose(course_lib.attention(q, k, v, impl=impl),
                           course_lib.attention(q, k, v, impl=impl, softmax_scale=1.0))


def test_softcap_squashes_scores_through_tanh(qkv):
    q, k, v = qkv
    capped, lse = course_lib.attention(q, k, v, softcap=0.5, return_lse=True)
    assert_matches_oracle(capped, lse, q, k, v, softcap=0.5)
    # every capped score lies in (-0.5, 0.5), so lse is within log(Nk) +- 0.5
    assert np.all(np.abs(lse - math.log(8)) < 0.5)
    # a cap far above every score changes nothing
    assert np.allclose(course_lib.attention(q, k, v, softcap=1e6), course_lib.attention(q, k, v))


def test_alibi_adds_minus_slope_times_the_aligned_distance():
    q, k, v = make_qkv(np.random.default_rng(1), 1, 2, 2, 3, 5, 4, 2)
    slopes = np.array([0.25, 1.5])
    _, lse = course_lib.attention(q, k, v, alibi_slopes=slopes, return_lse=True)
    scale = 1 / math.sqrt(4)
    for h in range(2):
        for i in range(3):
            s = [scale * q[0, h, i] @ k[0, h, j] - slopes[h] * abs(i + 5 - 3 - j) for j in range(5)]
            assert lse[0, h, i] == pytest.approx(math.log(sum(math.exp(x) for x in s)), rel=1e-12)


def test_alibi_slopes_per_batch_equal_per_head_when_rows_agree(qkv):
    q, k, v = qkv
    per_head = np.array([0.1, 0.2, 0.4, 0.8])
    out_h = course_lib.attention(q, k, v, alibi_slopes=per_head)
    out_bh = course_lib.attention(q, k, v, alibi_slopes=np.stack([per_head, per_head]))
    assert np.array_equal(out_h, out_bh)
    out_other = course_lib.attention(q, k, v, alibi_slopes=np.stack([per_head, 2 * per_head]))
    assert np.array_equal(out_other[0], out_h[0]) and not np.allclose(out_other[1], out_h[1])


def test_causal_aligns_bottom_right_by_default():
    # Nq = 2 queries over Nk = 5 keys: the last query sees every key.
    q, k, v = make_qkv(np.random.default_rng(2), 1, 1, 1, 2, 5, 4, 5)
    v = np.eye(5)[None, None]  # O row = attention probabilities
    p = course_lib.attention(q, k, v, causal=True)[0, 0]
    assert np.all(p[0, 4:] == 0) and np.all(p[0, :4] > 0)
    assert np.all(p[1] > 0)
    p_top = course_lib.attention(q, k, v, causal=True, causal_align="top_left")[0, 0]
    assert np.all(p_top[0, 1:] == 0) and np.all(p_top[1, 2:] == 0)


def test_causal_alignments_agree_when_nq_equals_nk(qkv):
    q, k, v = qkv
    k, v = k[:, :, :5], v[:, :, :5]
    assert np.array_equal(course_lib.attention(q, k, v, causal=True),
                          course_lib.attention(q, k, v, causal=True, causal_align="top_left"))


def test_decode_query_sees_all_keys_bottom_right_one_top_left():
    q, k, v = make_qkv(np.random.default_rng(3), 1, 2, 1, 1, 6, 4, 6)
    v = np.eye(6)[None, None]
    p = course_lib.attention(q, k, v, causal=True)[0]
    assert np.all(p > 0)
    p_top = course_lib.attention(q, k, v, causal=True, causal_align="top_left")[0]
    assert np.allclose(p_top[..., 0], 1) and np.all(p_top[..., 1:] == 0)


def test_causal_equals_window_minus_one_zero(qkv):
    q, k, v = qkv
    assert np.array_equal(course_lib.attention(q, k, v, causal=True),
                          course_lib.attention(q, k, v, window_size=(-1, 0)))
    # causal clips the right side of any window to 0
    assert np.array_equal(course_lib.attention(q, k, v, causal=True, window_size=(2, 3)),
                          course_lib.attention(q, k, v, window_size=(2, 0)))


def test_window_bounds_are_inclusive_around_the_aligned_diagonal():
    q, k, v = make_qkv(np.random.default_rng(4), 1, 1, 1, 4, 6, 3, 6)
    v = np.eye(6)[None, None]
    p = course_lib.attention(q, k, v, window_size=(1, 1))[0, 0]
    for i in range(4):
        centre = i + 6 - 4
        seen = [j for j in range(6) if p[i, j] > 0]
        assert seen == [j for j in range(centre - 1, centre + 2) if 0 <= j < 6]


@pytest.mark.parametrize("impl", BASE_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_fully_masked_rows_give_zero_and_minus_inf_lse(impl, dtype):
    # bottom-right causal with Nq > Nk: the first Nq - Nk queries see no key
    q, k, v = make_qkv(np.random.default_rng(5), 2, 2, 1, 7, 3, 5, 4, dtype)
    out, lse = course_lib.attention(q, k, v, impl=impl, causal=True, return_lse=True)
    assert np.all(out[:, :, :4] == 0) and np.all(np.isneginf(lse[:, :, :4]))
    assert np.all(np.isfinite(lse[:, :, 4:]))
    assert not np.isnan(out.astype(np.float64)).any()


@pytest.mark.parametrize("impl", BASE_IMPLS)
def test_no_keys_gives_zero_output_and_minus_inf_lse(impl):
    q, k, v = make_qkv(np.random.default_rng(6), 2, 3, 3, 4, 0, 5, 2)
    out, lse = course_lib.attention(q, k, v, impl=impl, return_lse=True)
    assert out.shape == (2, 3, 4, 2) and np.all(out == 0) and np.all(np.isneginf(lse))


@pytest.mark.parametrize("impl", BASE_IMPLS)
@pytest.mark.parametrize("batch,heads,heads_k,nq", [(0, 2, 1, 3), (2, 0, 0, 3), (2, 2, 2, 0)])
def test_empty_batch_heads_or_queries_give_empty_outputs(impl, batch, heads, heads_k, nq):
    q, k, v = make_qkv(np.random.default_rng(0), batch, heads, heads_k, nq, 4, 5, 3, np.float32)
    out, lse = course_lib.attention(q, k, v, impl=impl, return_lse=True)
    assert out.shape == (batch, heads, nq, 3) and out.dtype == np.float32
    assert lse.shape == (batch, heads, nq) and lse.dtype == np.float32


@pytest.mark.parametrize("impl", BASE_IMPLS)
def test_gqa_equals_mha_with_repeated_kv_heads(impl):
    q, k, v = make_qkv(np.random.default_rng(8), 2, 6, 2, 5, 7, 4, 3)
    grouped = course_lib.attention(q, k, v, impl=impl, causal=True)
    repeated = course_lib.attention(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), impl=impl, causal=True)
    assert np.array_equal(grouped, repeated)
    mqa = course_lib.attention(q, k[:, :1], v[:, :1], impl=impl)
    assert np.array_equal(mqa, course_lib.attention(q, np.repeat(k[:, :1], 6, 1), np.repeat(v[:, :1], 6, 1), impl=impl))


@pytest.mark.parametrize("impl", BASE_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_output_keeps_the_input_dtype(impl, dtype, qkv):
    q, k, v = (x.astype(dtype) for x in qkv)
    out, lse = course_lib.attention(q, k, v, impl=impl, return_lse=True)
    assert out.dtype == dtype
    assert lse.dtype == (np.float64 if dtype == np.float64 else np.float32)


def test_available_impls_start_with_reference_and_naive():
    impls = course_lib.available_impls()
    assert impls[:2] == ["reference", "naive"]


# -- bad input --------------------------------------------------------------------

def _good():
    return make_qkv(np.random.default_rng(10), 2, 4, 2, 3, 5, 6, 4, np.float32)


def _bad_calls():
    q, k, v = _good()
    yield "rank", lambda: course_lib.attention(q[0], k, v), ValueError, "q must be 4-D"
    yield "batch", lambda: course_lib.attention(q, k[:1], v[:1]), ValueError, "batch"
    yield "head_dim", lambda: course_lib.attention(q, k[..., :5], v), ValueError, "head_dim"
    yield "heads", lambda: course_lib.attention(q[:, :3], k, v), ValueError, "multiple of heads"
    yield "kv_heads", lambda: course_lib.attention(q, k, v[:, :1]), ValueError, "k and v must have the same number of heads"
    yield "seqlen_k", lambda: course_lib.attention(q, k, v[:, :, :4]), ValueError, "seqlen_k"
    yield "int_dtype", lambda: course_lib.attention(q.astype(np.int32), k, v), TypeError, "q must be float16"
    yield "mixed_dtype", lambda: course_lib.attention(q, k.astype(np.float64), v), TypeError, "share one dtype"
    yield "not_array", lambda: course_lib.attention(q.tolist(), k, v), TypeError, "q must be a numpy array"
    yield "window_type", lambda: course_lib.attention(q, k, v, window_size=3), TypeError, "window_size"
    yield "window_value", lambda: course_lib.attention(q, k, v, window_size=(-2, 0)), ValueError, "window_size"
    yield "softcap", lambda: course_lib.attention(q, k, v, softcap=-1.0), ValueError, "softcap"
    yield "softcap_nan", lambda: course_lib.attention(q, k, v, softcap=float("nan")), ValueError, "softcap"
    yield "slopes_shape", lambda: course_lib.attention(q, k, v, alibi_slopes=np.ones(3)), ValueError, "alibi_slopes"
    yield "slopes_dtype", lambda: course_lib.attention(q, k, v, alibi_slopes=np.ones(4, int)), TypeError, "alibi_slopes"
    yield "scale", lambda: course_lib.attention(q, k, v, softmax_scale="big"), TypeError, "softmax_scale"
    yield "block_q", lambda: course_lib.attention(q, k, v, block_q=0), ValueError, "block_q"
    yield "block_k", lambda: course_lib.attention(q, k, v, block_k=2.5), TypeError, "block_k"
    yield "causal", lambda: course_lib.attention(q, k, v, causal="yes"), TypeError, "causal"
    yield "align", lambda: course_lib.attention(q, k, v, causal_align="diagonal"), ValueError, "causal_align"
    yield "impl", lambda: course_lib.attention(q, k, v, impl="fastest"), ValueError, "impl"
    qp, kp, vp = q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2)
    cu = np.array([0, 1, 3])
    ck = np.array([0, 2, 5])
    yield "cu_float", lambda: course_lib.attention_varlen(qp, kp, vp, cu.astype(float), ck), TypeError, "cu_seqlens_q"
    yield ("cu_start", lambda: course_lib.attention_varlen(qp, kp, vp, cu, np.array([1, 2, 5])), ValueError,
           "cu_seqlens_k must start at 0")
    yield ("cu_order", lambda: course_lib.attention_varlen(qp, kp, vp, np.array([0, 2, 1, 3]), np.array([0, 1, 2, 5])),
           ValueError, "non-decreasing")
    yield ("cu_end", lambda: course_lib.attention_varlen(qp, kp, vp, np.array([0, 1, 2]), ck), ValueError,
           "end at the packed length")
    yield "cu_batch", lambda: course_lib.attention_varlen(qp, kp, vp, cu, np.array([0, 5])), ValueError, "one batch"
    yield "varlen_rank", lambda: course_lib.attention_varlen(q, k, v, cu, ck), ValueError, "q must be 3-D"


@pytest.mark.parametrize("name,call,error,message", list(_bad_calls()), ids=[c[0] for c in _bad_calls()])
def test_bad_input_raises_an_error_naming_the_argument(name, call, error, message):
    with pytest.raises(error, match=message):
        call()


# -- the NaN rule: a NaN output row gets a NaN lse ------------------------------------

@pytest.mark.parametrize("impl", ["reference", "naive", "flash_numpy", "flash_numpy_fa1", "flash_numba_cpu",
                                  "flash_numba_cuda"])
def test_nan_in_v_reaches_rows_that_cannot_see_it_with_nan_lse(impl):
    rng = np.random.default_rng(21)
    q, k, v = make_qkv(rng, 1, 2, 2, 24, 24, 8, 4, np.float32)
    v[0, 1, 5, 2] = np.nan  # key 5 of head 1; causal rows 0-4 cannot see it
    options = dict(causal=True, block_q=8, block_k=8)
    out, lse = course_lib.attention(q, k, v, impl=impl, return_lse=True, **options)
    nan_rows = np.isnan(out).any(axis=-1)
    assert nan_rows[0, 1, 5:].all() and not nan_rows[0, 0].any()  # rows that see key 5, and not the other head
    # 0 * NaN: a tiled impl spreads it to the rows of the key's tile that cannot see it (rows 0-4 here) ...
    if impl.startswith("flash"):
        assert nan_rows[0, 1, :5].all()
    # ... every impl: a NaN row has a NaN lse, never -inf or a number that looks healthy
    assert np.array_equal(np.isnan(lse), nan_rows)


def test_the_nan_rule_gives_nan_lse_and_keeps_clean_rows():
    from course_lib.core.reference import nan_lse_where_out_is_nan

    out = np.array([[[0.0, 1.0], [np.nan, 2.0], [0.0, 0.0]]])
    lse = np.array([[0.5, 1.5, -np.inf]], dtype=np.float32)
    fixed = nan_lse_where_out_is_nan(out, lse)
    assert fixed.dtype == np.float32
    assert fixed[0, 0] == 0.5 and np.isnan(fixed[0, 1]) and np.isneginf(fixed[0, 2])
