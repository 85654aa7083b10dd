"""The tolerance rule of ``checks.check_attention`` for float32: grounded on naive
float32's error, so that correct kernels pass FlashAttention's own test inputs
(where fixed bounds reject them) and every planted mistake still fails."""
import numpy as np
import pytest

import course_lib
from course_lib import checks

from conftest import make_qkv


def _fa_softcap_inputs():
    """FlashAttention's own softcap test inputs: softcap 50, q scaled by softcap / 4, causal."""
    return make_qkv(5, 1, 2, 2, 64, 1024, 256, dtype=np.float32, q_scale=12.5), dict(softcap=50.0, causal=True)


def test_fixed_float32_bounds_reject_correct_kernels_on_fa_input():
    (q, k, v), options = _fa_softcap_inputs()
    out = course_lib.attention(q, k, v, impl="flash_numpy", **options)
    expected = course_lib.attention(*(x.astype(np.float64) for x in (q, k, v)), **options)
    fixed = checks.compare("flash", out, expected, atol=1e-5, rtol=1e-4)  # fixed bounds alone
    assert not fixed.passed  # float32 itself is off by ~2e-5 here: naive float32 fails them too
    assert not checks.compare("naive", course_lib.attention(q, k, v, impl="naive", **options), expected,
                              atol=1e-5, rtol=1e-4).passed


@pytest.mark.parametrize("impl", ["naive", "flash_numpy"])
def test_float32_kernels_pass_fa_softcap_and_alibi_inputs(impl, capsys):
    (q, k, v), options = _fa_softcap_inputs()
    out, lse = course_lib.attention(q, k, v, impl=impl, return_lse=True, **options)
    checks.check_attention(out, q, k, v, lse=lse, **options)
    rng = np.random.default_rng(2)
    q, k, v = make_qkv(rng, 2, 4, 4, 113, 203, 128, 128, np.float32)
    alibi = dict(alibi_slopes=rng.uniform(0, 1, (2, 4)) * 0.3, causal=True, block_q=64, block_k=32)
    out, lse = course_lib.attention(q, k, v, impl=impl, return_lse=True, **alibi)
    checks.check_attention(out, q, k, v, lse=lse, **alibi)


def _planted_mistakes():
    """Wrong float32 answers a learner might write, each with the inputs that expose it."""
    rng = np.random.default_rng(3)
    q, k, v = make_qkv(rng, 1, 2, 2, 40, 56, 16, 16, np.float32)
    ref = lambda **o: course_lib.attention(q, k, v, **o)  # float32 reference, then perturbed
    yield "no softmax scale", ref(softmax_scale=1.0), {}
    yield "causal aligned top-left", ref(causal=True, causal_align="top_left"), dict(causal=True)
    yield "window off by one", ref(window_size=(4, 0)), dict(window_size=(3, 0))
    yield "softcap ignored", ref(), dict(softcap=2.0)
    yield "last key tile dropped", course_lib.attention(q, k[:, :, :48], v[:, :, :48]), {}
    yield "P rounded to float16", course_lib.attention(*(x.astype(np.float16) for x in (q, k, v))).astype(
        np.float32), {}
    yield "one row wrong by 1e-4", ref() + np.where(np.arange(16) == 3, 1e-4, 0).astype(np.float32), {}
    return q, k, v


@pytest.mark.parametrize("case", range(7))
def test_the_grounded_float32_rule_fails_every_planted_mistake(case, capsys):
    rng = np.random.default_rng(3)
    q, k, v = make_qkv(rng, 1, 2, 2, 40, 56, 16, 16, np.float32)
    name, wrong, options = list(_planted_mistakes())[case]
    expected = course_lib.attention(*(x.astype(np.float64) for x in (q, k, v)), **options)
    assert not checks.compare(name, wrong, expected, atol=1e-5, rtol=1e-4).passed  # fails fixed bounds
    with pytest.raises(checks.CheckFailed):
        checks.check_attention(wrong, q, k, v, name=name, **options)  # and the grounded rule


def test_a_wrong_float32_lse_still_fails(capsys):
    rng = np.random.default_rng(4)
    q, k, v = make_qkv(rng, 1, 2, 2, 30, 30, 16, 16, np.float32)
    out, lse = course_lib.attention(q, k, v, impl="flash_numpy", return_lse=True)
    checks.check_attention(out, q, k, v, lse=lse)
    with pytest.raises(checks.CheckFailed, match="lse"):
        checks.check_attention(out, q, k, v, lse=lse + np.float32(1e-3))


@pytest.mark.parametrize("dtype,runs", [(np.float64, 0), (np.float32, 1), (np.float16, 1)])
def test_one_check_runs_the_naive_baseline_at_most_once(dtype, runs, monkeypatch, capsys):
    from course_lib.kernels import naive

    calls = []
    baseline = naive.attention_forward
    monkeypatch.setattr(naive, "attention_forward", lambda *args: calls.append(args) or baseline(*args))
    q, k, v = make_qkv(np.random.default_rng(7), 1, 2, 1, 20, 24, 8, 8, dtype)
    out, lse = course_lib.attention(q, k, v, impl="flash_numpy", causal=True, return_lse=True)
    checks.check_attention(out, q, k, v, lse=lse, causal=True)
    assert len(calls) == runs  # for out and lse together
