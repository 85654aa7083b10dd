"""The online softmax and the merge of partial results (course_lib.core.online_softmax).

Expectations are computed directly in the tests: softmax as exp(s - logsumexp(s))
with numpy's own ``np.logaddexp.reduce``, never with the module under test.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.core import online_softmax as osm

SETTINGS = settings(max_examples=50, deadline=None)


def direct_lse(s):
    """log sum_j exp(s_j), by numpy; -inf for an empty or all -inf row."""
    return np.logaddexp.reduce(s, axis=-1, initial=-np.inf)


def direct_attention(s, v):
    """softmax(s) v and lse, straight from the definition; 0 for rows that see nothing."""
    lse = direct_lse(s)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - lse[..., None])
    p = np.nan_to_num(p, nan=0.0)
    return p @ v, lse


def scores(rng, rows, cols, scale=3.0, hidden=0.2, dead_rows=True):
    """Random scores with some hidden (-inf) entries and, optionally, all-hidden rows."""
    s = scale * rng.standard_normal((rows, cols))
    s[rng.random((rows, cols)) < hidden] = -np.inf
    if dead_rows and rows > 1:
        s[rng.integers(rows)] = -np.inf
    return s


def partial_state(s, v, keys):
    """(m, l, O) over a subset of the keys, from the definition."""
    sub = s[:, keys]
    m = np.max(sub, axis=-1, initial=-np.inf)
    shift = np.where(np.isneginf(m), 0, m)
    p = np.exp(sub - shift[:, None])
    return m, p.sum(-1), p @ v[keys]


# -- safe softmax and the running (m, l) -------------------------------------------------

def test_safe_softmax_matches_the_direct_definition():
    rng = np.random.default_rng(0)
    s = scores(rng, 9, 13)
    p = osm.safe_softmax(s)
    with np.errstate(invalid="ignore"):  # -inf - -inf in the all-hidden row
        expected = np.nan_to_num(np.exp(s - direct_lse(s)[:, None]), nan=0.0)
    np.testing.assert_allclose(p, expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("big", [1e4, -1e4, 1e15])
def test_safe_softmax_is_stable_for_huge_logits(big):
    s = np.array([[big, big - 1.0, big - 2.0], [big, big, big]])
    p = osm.safe_softmax(s)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p[0], np.exp([0, -1, -2]) / np.exp([0, -1, -2]).sum())
    np.testing.assert_allclose(p[1], [1 / 3] * 3)


def test_safe_softmax_of_an_all_minus_inf_row_is_zero_not_nan():
    p = osm.safe_softmax(np.full((2, 5), -np.inf))
    assert np.array_equal(p, np.zeros((2, 5)))


@SETTINGS
@given(rows=st.integers(1, 6), cols=st.integers(0, 40), block=st.integers(1, 45), seed=st.integers(0, 2**16))
def test_running_max_sum_gives_max_and_logsumexp_for_any_block(rows, cols, block, seed):
    s = scores(np.random.default_rng(seed), rows, cols)
    with np.errstate(all="raise", under="ignore"):  # no inf - inf, no 0/0 on the way
        m, l = osm.running_max_sum(s, block)
    np.testing.assert_array_equal(m, np.max(s, axis=-1, initial=-np.inf))
    with np.errstate(divide="ignore"):
        got_lse = np.where(l > 0, np.where(np.isneginf(m), 0, m) + np.log(l), -np.inf)
    np.testing.assert_allclose(got_lse, direct_lse(s), rtol=1e-12, atol=1e-12)


# -- the running state (m, l, O) ------------------------------------------------------------

@SETTINGS
@given(rows=st.integers(1, 6), cols=st.integers(0, 40), dv=st.integers(1, 7), block=st.integers(1, 45),
       seed=st.integers(0, 2**16))
def test_online_update_then_finalize_equals_softmax_times_v(rows, cols, dv, block, seed):
    rng = np.random.default_rng(seed)
    s, v = scores(rng, rows, cols), rng.standard_normal((cols, dv))
    m, l, o = osm.init_state(rows, dv)
    with np.errstate(all="raise", under="ignore"):
        for c0 in range(0, cols, block):
            m, l, o, _ = osm.online_update(m, l, o, s[:, c0:c0 + block], v[c0:c0 + block])
        out, lse = osm.finalize(m, l, o)
    expected, expected_lse = direct_attention(s, v)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)


def test_skipping_the_rescale_is_wrong_when_the_max_rises():
    """The rescale is not optional: drop alpha and a rising max breaks the answer."""
    s = np.array([[0.0, 1.0, 10.0, 11.0]])
    v = np.arange(8.0).reshape(4, 2)
    m, l, o = osm.init_state(1, 2)
    m, l, o, _ = osm.online_update(m, l, o, s[:, :2], v[:2])
    m2, l2, o2, p = osm.online_update(m, l, o, s[:, 2:], v[2:])
    wrong_l = l + p.sum(-1)  # old l measured against the old max, not rescaled
    assert not np.allclose(wrong_l, l2)
    np.testing.assert_allclose(osm.finalize(m2, l2, o2)[0], direct_attention(s, v)[0])


def test_online_update_rounds_p_to_low_precision_before_pv():
    rng = np.random.default_rng(1)
    s, v = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    m, l, o = osm.init_state(3, 4, np.float32)
    _, l1, o1, p = osm.online_update(m, l, o, s, v, p_dtype=np.float16)
    np.testing.assert_array_equal(o1, p.astype(np.float16).astype(np.float32) @ v)
    np.testing.assert_allclose(l1, p.sum(-1))  # l from the unrounded P
    assert o1.dtype == np.float32


def test_finalize_gives_rows_that_saw_nothing_0_and_minus_inf():
    m, l, o = osm.init_state((2, 3), 4)
    out, lse = osm.finalize(m, l, o)
    assert np.array_equal(out, np.zeros((2, 3, 4))) and np.all(np.isneginf(lse))


# -- merging partial results -----------------------------------------------------------------

@SETTINGS
@given(rows=st.integers(1, 5), cols=st.integers(0, 30), dv=st.integers(1, 5), parts=st.integers(2, 4),
       seed=st.integers(0, 2**16))
def test_merging_any_split_of_the_keys_gives_the_full_answer(rows, cols, dv, parts, seed):
    rng = np.random.default_rng(seed)
    s, v = scores(rng, rows, cols), rng.standard_normal((cols, dv))
    owner = rng.integers(parts, size=cols)  # any split, not just contiguous tiles
    states = [partial_state(s, v, np.flatnonzero(owner == p)) for p in range(parts)]
    m, l, o = states[0]
    for state in states[1:]:
        m, l, o = osm.merge(m, l, o, *state)
    out, lse = osm.finalize(m, l, o)
    expected, expected_lse = direct_attention(s, v)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)
    # the same through the normalised (out, lse) form
    normalised = [osm.finalize(*state) for state in states]
    out2, lse2 = osm.merge_all([n[0] for n in normalised], [n[1] for n in normalised])
    np.testing.assert_allclose(out2, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse2, expected_lse, rtol=1e-12, atol=1e-12)


def three_partials(seed, scale=3.0):
    rng = np.random.default_rng(seed)
    s, v = scores(rng, 6, 24, scale=scale), rng.standard_normal((24, 3))
    owner = rng.integers(3, size=24)
    return [partial_state(s, v, np.flatnonzero(owner == p)) for p in range(3)]


@SETTINGS
@given(seed=st.integers(0, 2**16), scale=st.sampled_from([1.0, 30.0, 1e4]))
def test_merge_is_associative_and_commutative(seed, scale):
    a, b, c = three_partials(seed, scale)
    left = osm.merge(*osm.merge(*a, *b), *c)
    right = osm.merge(*a, *osm.merge(*b, *c))
    for x, y in zip(osm.finalize(*left), osm.finalize(*right)):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)
    for x, y in zip(osm.merge(*a, *b), osm.merge(*b, *a)):
        np.testing.assert_array_equal(x, y)


@SETTINGS
@given(seed=st.integers(0, 2**16), scale=st.sampled_from([1.0, 30.0, 1e4]))
def test_merge_lse_is_associative_and_commutative(seed, scale):
    a, b, c = (osm.finalize(*p) for p in three_partials(seed, scale))
    left = osm.merge_lse(*osm.merge_lse(*a, *b), *c)
    right = osm.merge_lse(*a, *osm.merge_lse(*b, *c))
    for x, y in zip(left, right):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)
    for x, y in zip(osm.merge_lse(*a, *b), osm.merge_lse(*b, *a)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("lse1, lse2", [(1e4, 1e4 - 3), (-1e4, -1e4 + 2), (1e4, -1e4), (-np.inf, 5.0),
                                        (5.0, -np.inf), (-np.inf, -np.inf), (1e300, 1e300)])
def test_merge_lse_is_stable_for_huge_logits_and_empty_sides(lse1, lse2):
    out1, out2 = np.array([[1.0, 2.0]]), np.array([[-3.0, 4.0]])
    with np.errstate(all="raise", under="ignore"):
        out, lse = osm.merge_lse(out1, np.array([lse1]), out2, np.array([lse2]))
    expected_lse = np.logaddexp(lse1, lse2)
    np.testing.assert_allclose(lse, [expected_lse])
    if np.isneginf(expected_lse):
        assert np.array_equal(out, np.zeros((1, 2)))
    else:
        w1 = np.exp(lse1 - expected_lse) if np.isfinite(lse1) else 0.0
        w2 = np.exp(lse2 - expected_lse) if np.isfinite(lse2) else 0.0
        np.testing.assert_allclose(out, w1 * out1 + w2 * out2, rtol=1e-12)


@pytest.mark.parametrize("big", [1e4, -1e4])
def test_merge_of_states_is_stable_for_huge_logits(big):
    s = np.array([[big, big - 1, big + 2, big - 5]])
    v = np.eye(4)
    a, b = partial_state(s, v, [0, 1]), partial_state(s, v, [2, 3])
    with np.errstate(all="raise", under="ignore"):
        out, lse = osm.finalize(*osm.merge(*a, *b))
    expected, expected_lse = direct_attention(s, v)
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-15)


def test_merging_two_empty_states_gives_an_empty_state_no_nan():
    empty = osm.init_state(3, 2)
    with np.errstate(all="raise", under="ignore"):
        m, l, o = osm.merge(*empty, *empty)
        out, lse = osm.finalize(m, l, o)
    assert np.all(np.isneginf(m)) and np.array_equal(l, np.zeros(3))
    assert np.array_equal(out, np.zeros((3, 2))) and np.all(np.isneginf(lse))


def test_an_empty_side_is_the_identity_of_the_merge():
    a = three_partials(7)[0]
    merged = osm.merge(*a, *osm.init_state(6, 3))
    for x, y in zip(merged, a):
        np.testing.assert_array_equal(x, y)


def test_to_state_and_finalize_round_trip():
    out, lse = osm.finalize(*three_partials(3)[1])
    out2, lse2 = osm.finalize(*osm.to_state(out, lse))
    np.testing.assert_allclose(out2, out)
    np.testing.assert_array_equal(lse2, lse)


def test_logaddexp_agrees_with_numpy_including_infinities():
    a = np.array([0.0, 1e4, -1e4, -np.inf, -np.inf, 3.0, 1e300])
    b = np.array([0.0, 1e4 - 1, 5.0, 2.0, -np.inf, -np.inf, 1e300])
    with np.errstate(all="raise", under="ignore"):
        got = osm.logaddexp(a, b)
    np.testing.assert_allclose(got, np.logaddexp(a, b))


def test_merge_all_needs_matching_non_empty_lists():
    with pytest.raises(ValueError, match="as many outs as lses"):
        osm.merge_all([np.zeros((1, 2))], [])
