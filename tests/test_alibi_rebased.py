"""ALiBi far from the diagonal keeps float32's digits: every impl measures the bias from each row's anchor
(the key nearest its diagonal, ``rules.alibi_anchor``), a constant less per row than the bias itself, and
takes that constant back in lse (forward) or adds it to the lse it is given (backward).

With many more queries than keys (FlashAttention's test shapes: 799 queries on 3 keys, d = 80, MQA) the
bias -slope * |i + Nk - Nq - j| of the first rows runs to hundreds, and float32 rounded it, and the
scores with it, to a few 1e-5; at 16384 queries on 4 keys every impl's output was off by 2e-4, seventeen
times float32's own bounds.  The CUDA impls run these cases in numba's simulator
(``bench.cases.FORWARD_CASES``, tests/test_cuda_steps.py, tests/test_flash_numba_cuda.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib
from course_lib import checks, kernels
from course_lib.core import rules
from course_lib.core.masks import MaskSpec

CPU_IMPLS = [name for name in course_lib.available_impls() if not kernels.IMPLS[name].cuda]
CPU_BACKWARD = [name for name, impl in kernels.BACKWARD_IMPLS.items() if not impl.cuda]

# name: (B, H, Nq, Nk, D); one K / V head (MQA), not causal, FlashAttention's slopes (rand * 0.3)
CASES = {"fa_799_queries_on_3_keys": (2, 4, 799, 3, 80), "16384_queries_on_4_keys": (1, 2, 16384, 4, 80)}


def problem(B, H, Nq, Nk, D, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Nq, D)).astype(np.float32)
    k = rng.standard_normal((B, 1, Nk, D)).astype(np.float32)
    v = rng.standard_normal((B, 1, Nk, D)).astype(np.float32)
    return q, k, v, rng.uniform(0.0, 0.3, (B, H))


def float64_truth(q, k, v, slopes):
    """out and lse of the float64 reference, not cast back to float32."""
    return course_lib.attention(*(x.astype(np.float64) for x in (q, k, v)), impl="reference", alibi_slopes=slopes,
                                return_lse=True)


def assert_within_float32s_bounds(name, actual, expected):
    """Float32's own tolerance (atol, rtol), with no baseline's error to widen it."""
    atol, rtol = checks.tolerance(np.float32)
    verdict = checks.compare(name, actual, expected, atol=atol, rtol=rtol, rule=f"atol {atol:g}, rtol {rtol:g}")
    assert verdict.passed, str(verdict)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_alibi_far_from_the_diagonal_keeps_float32s_accuracy_and_the_lse(impl, case):
    q, k, v, slopes = problem(*CASES[case])
    out, lse = course_lib.attention(q, k, v, impl=impl, alibi_slopes=slopes, return_lse=True)
    checks.check_attention(out, q, k, v, lse=lse, alibi_slopes=slopes, name=impl)
    expected, expected_lse = float64_truth(q, k, v, slopes)
    assert_within_float32s_bounds(f"{impl} out", out, expected)
    assert_within_float32s_bounds(f"{impl} lse", lse, expected_lse)


@pytest.mark.parametrize("impl", CPU_BACKWARD)
def test_the_backward_rebases_the_lse_it_is_given(impl):
    q, k, v, slopes = problem(1, 2, 2048, 4, 16, seed=1)
    out, lse = float64_truth(q, k, v, slopes)
    out, lse = out.astype(np.float32), lse.astype(np.float32)
    dout = np.random.default_rng(2).standard_normal(out.shape).astype(np.float32)
    grads = course_lib.attention_backward(q, k, v, out, lse, dout, impl=impl, alibi_slopes=slopes)
    checks.check_attention_backward(grads, q, k, v, out, lse, dout, alibi_slopes=slopes, name=impl)
    expected = course_lib.attention_backward(*(x.astype(np.float64) for x in (q, k, v, out, lse, dout)),
                                             impl="reference", alibi_slopes=slopes)
    for name, got, want in zip(checks.GRAD_NAMES, grads, expected):
        assert_within_float32s_bounds(f"{impl} {name}", got, want)


masks = st.builds(MaskSpec, seqlen_q=st.integers(0, 40), seqlen_k=st.integers(1, 12),
                  causal=st.booleans(), causal_align=st.sampled_from(["bottom_right", "top_left"]))


@settings(max_examples=80, deadline=None)
@given(mask=masks)
def test_the_rebased_distance_is_the_distance_less_a_constant_per_row(mask):
    rows, cols = np.arange(mask.seqlen_q), np.arange(mask.seqlen_k)
    rebased = np.array([[rules.alibi_rebased_distance(i, j, mask.offset, mask.seqlen_k) for j in cols]
                        for i in rows], dtype=np.int64).reshape(len(rows), len(cols))
    assert np.array_equal(mask.alibi_rebased_distance(rows, cols), rebased)
    distance = -mask.alibi_bias(1.0, rows, cols)
    assert np.array_equal(distance - rebased, np.repeat(mask.alibi_row_distance(rows)[:, None], len(cols), 1))
    anchors = [rules.alibi_anchor(i, mask.offset, mask.seqlen_k) for i in rows]
    assert np.array_equal(mask.alibi_anchor(rows), np.array(anchors, dtype=np.int64))
    # the anchor is the visible key nearest the diagonal: its rebased distance is 0, and no key is nearer
    assert all(rebased[i, a] == 0 and distance[i, a] == distance[i].min() for i, a in enumerate(anchors))
