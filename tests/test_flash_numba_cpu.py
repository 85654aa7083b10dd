"""impl flash_numba_cpu (chapter 08): the compiled tiled kernel against the
reference on random problems, its pieces (the micro-kernel, the vectorised
exp), the host's tile plan, threads, and the rule that an impl which fails to
import is an error, not a silent drop from available_impls()."""
import dataclasses
import math
import sys

import ml_dtypes
import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import course_lib
from course_lib import checks, kernels
from course_lib.core import rules
from course_lib.core.options import attention_options
from course_lib.kernels import cpu_steps as fnc
from course_lib.kernels import launch
from course_lib.kernels.cpu_steps import tile as cpu_tile
from course_lib.kernels.cpu_steps import versions

from conftest import attention_problems, make_qkv

DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]


# chapter 08's kernel on a batch of two: every mask, softcap, ALiBi per (batch, head), any tile
PROBLEMS = attention_problems(batch=st.just(2), seqlen=st.integers(1, 40), head_dim=st.integers(1, 33),
                              head_dim_v=st.integers(1, 9), heads_k=st.integers(1, 2), window=st.integers(-1, 6),
                              softcap=st.sampled_from([0.0, 2.0]), block=st.integers(1, 20),
                              alibi=st.sampled_from([None, "batch_heads"]), dtype=st.sampled_from(DTYPES))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=PROBLEMS)
def test_matches_the_reference_on_random_problems(problem):
    shape, options, dtype, seed = problem
    q, k, v = make_qkv(seed, dtype=dtype, **shape)
    out, lse = course_lib.attention(q, k, v, impl="flash_numba_cpu", return_lse=True, **options)
    assert out.dtype == q.dtype and lse.dtype == rules.lse_dtype(dtype)
    checks.check_attention(out, q, k, v, lse=lse, **options)


def test_the_answer_does_not_depend_on_the_number_of_threads():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 70, 24)).astype(np.float32) for _ in range(3))
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = course_lib.attention(q, k, v, impl="flash_numba_cpu", causal=True, block_q=16, block_k=16)
    finally:
        numba.set_num_threads(threads)
    every = course_lib.attention(q, k, v, impl="flash_numba_cpu", causal=True, block_q=16, block_k=16)
    assert np.array_equal(one, every)  # each work item owns its rows: same arithmetic, same bits


# -- the pieces ----------------------------------------------------------------------

@pytest.mark.parametrize("rows,cols,depth", [(4, 2, 1), (8, 6, 59), (64, 64, 64), (12, 10, 3)])
def test_matmul_nt_is_a_times_b_transposed(rows, cols, depth):
    rng = np.random.default_rng(rows + cols + depth)
    A = rng.standard_normal((rows, depth + 3)).astype(np.float32)
    B = rng.standard_normal((cols, depth + 3)).astype(np.float32)
    C = np.full((rows, cols + 1), 7.0, np.float32)
    fnc.matmul_nt(A, B, C, rows, cols, depth)
    assert np.allclose(C[:, :cols], A[:, :depth] @ B[:, :depth].T, rtol=1e-5, atol=1e-5)
    assert np.all(C[:, cols:] == 7.0)  # nothing outside the block it was asked for


def test_exp_row_is_within_two_ulps_and_exact_at_the_edges():
    rng = np.random.default_rng(2)
    x = np.concatenate([-rng.random(20000) * 87, -rng.random(1000) * 1e-3, [0.0]]).astype(np.float32)
    p = x.copy()
    fnc.exp_row(p, p.size, np.float32(0.0), np.zeros(p.size, np.int32))
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(p - exact) / exact) <= 2 * np.finfo(np.float32).eps
    edges = np.array([-np.inf, -1e30, -87.5, np.nan, 0.0], np.float32)
    fnc.exp_row(edges, 5, np.float32(0.0), np.zeros(5, np.int32))
    assert edges[0] == 0 and edges[1] == 0 and edges[2] == 0 and np.isnan(edges[3]) and edges[4] == 1.0


def test_exp_row_subtracts_the_shift():
    p = np.array([3.0, 2.0, -np.inf], np.float32)
    fnc.exp_row(p, 3, np.float32(3.0), np.zeros(3, np.int32))
    assert np.allclose(p, [1.0, math.exp(-1.0), 0.0], rtol=3e-7)


# -- the host's tile plan is what the kernel does ----------------------------------------

def run_with_plan(q, k, v, opts, mask, change_plan):
    plan, qa, ka, va = launch.prepare(q, k, v, opts, mask, 16, 16)
    return fnc.run_kernel(dataclasses.replace(plan, tiles=change_plan(plan.tiles.copy())), qa, ka, va)


@pytest.mark.parametrize("change,what", [
    (lambda t: np.where(t == rules.PARTIAL, rules.FULL, t).astype(np.int8), "diagonal tiles left unmasked"),
    (lambda t: np.where(t == rules.FULL, rules.EMPTY, t).astype(np.int8), "full tiles skipped"),
])
def test_the_kernel_does_what_the_host_plan_says(change, what):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 48, 8)) for _ in range(3))
    opts = attention_options(batch=1, heads=2, head_dim=8, **{"causal": True})
    mask = opts.mask(48, 48)
    out, lse = run_with_plan(q, k, v, opts, mask, lambda t: t)
    checks.check_attention(out, q, k, v, lse=lse, causal=True)
    wrong, wrong_lse = run_with_plan(q, k, v, opts, mask, change)
    with pytest.raises(checks.CheckFailed):
        checks.check_attention(wrong, q, k, v, lse=wrong_lse, causal=True, name=what)


def test_causal_skips_the_tiles_above_the_diagonal():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 1, 1024, 8)) for _ in range(3))
    opts = attention_options(batch=1, heads=1, head_dim=8, **{"causal": True})
    plan = launch.prepare(q, k, v, opts, opts.mask(1024, 1024), 64, 64)[0]
    assert plan.computed_tiles == 136  # of 256: the diagonal and below


# -- failures are errors, not a silently shorter list of impls ----------------------------

def test_an_impl_that_fails_to_import_is_an_error_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "course_lib.kernels.broken_kernel", None)  # import raises
    monkeypatch.setitem(kernels.IMPLS, "broken_kernel", kernels.Impl("course_lib.kernels.broken_kernel", "broken"))
    with pytest.raises(ImportError, match="broken_kernel"):
        kernels.load("broken_kernel")
    with pytest.raises(ImportError, match="broken_kernel"):
        course_lib.available_impls()


def test_only_a_missing_optional_package_hides_an_impl(monkeypatch, tmp_path):
    (tmp_path / "needs_missing_package.py").write_text("import a_package_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(kernels.IMPLS, "needs_missing_package", kernels.Impl("needs_missing_package", "needs a package"))
    assert kernels.load("needs_missing_package") is None
    assert "needs_missing_package" not in course_lib.available_impls()
    assert "flash_numba_cpu" in course_lib.available_impls()


def test_a_syntax_error_in_an_impl_is_an_error(monkeypatch, tmp_path):
    (tmp_path / "typo_kernel.py").write_text("def attention_forward(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(kernels.IMPLS, "typo_kernel", kernels.Impl("typo_kernel", "a typo"))
    with pytest.raises(ImportError, match="typo_kernel.*SyntaxError"):
        kernels.load("typo_kernel")


def test_a_nan_row_comes_back_nan_with_a_nan_lse_never_minus_inf():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 40, 16)).astype(np.float32) for _ in range(3))
    q[0, 1, 21, 3] = np.nan
    out, lse = course_lib.attention(q, k, v, impl="flash_numba_cpu", causal=True, block_q=16, block_k=16,
                                    return_lse=True)
    ref_out, ref_lse = course_lib.attention(q, k, v, impl="reference", causal=True, return_lse=True)
    assert np.isnan(out[0, 1, 21]).all() and np.isnan(lse[0, 1, 21])
    assert np.array_equal(np.isnan(lse), np.isnan(ref_lse)) and np.array_equal(np.isnan(out), np.isnan(ref_out))


def test_a_compile_failure_is_an_error_naming_the_kernel(monkeypatch):
    def fails(*args):
        raise numba.core.errors.TypingError("cannot type this")
    monkeypatch.setattr(versions, "handout_kernel", fails)
    q = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(RuntimeError, match="flash_numba_cpu failed to compile for float32 inputs: cannot type this"):
        course_lib.attention(q, q, q, impl="flash_numba_cpu")


# -- the base-2 row pass (steps exp2 and after) ------------------------------------------

def test_exp2_and_sum_is_within_three_ulps_and_exact_at_the_edges():
    rng = np.random.default_rng(3)
    x = np.concatenate([-rng.random(20000) * 126, -rng.random(1000) * 1e-3, [0.0, -1.0, -0.5]]).astype(np.float32)
    p = x.copy()
    total = cpu_tile.exp2_and_sum(p, p.size, np.float32(0.0))
    exact = np.exp2(x.astype(np.float64))
    assert np.max(np.abs(p - exact) / exact) <= 3 * np.finfo(np.float32).eps
    assert math.isclose(total, exact.sum(), rel_tol=1e-5)
    edges = np.array([-np.inf, -1e30, -127.5, np.nan, 0.0, 2.5], np.float32)
    cpu_tile.exp2_and_sum(edges, 6, np.float32(2.5))
    assert edges[0] == 0 and edges[1] == 0 and edges[2] == 0 and np.isnan(edges[3]) and edges[5] == 1.0
    assert math.isclose(edges[4], 2.0 ** -2.5, rel_tol=3e-7)


def test_the_row_max_lets_a_nan_through_from_either_side():

    @numba.njit
    def row_max(row):
        m = np.float32(-np.inf)
        for c in range(row.size):
            m = cpu_tile.maximum(m, row[c])
        return m
    row = np.array([1.0, -np.inf, 3.0, -0.0] * 8, np.float32)
    assert row_max(row) == 3.0
    row[5] = np.nan
    assert np.isnan(row_max(row))
    assert row_max(np.full(16, -np.inf, np.float32)) == -np.inf


@pytest.mark.parametrize("options", [dict(causal=True), dict(softcap=2.0), dict(window_size=(3, 1)),
                                     dict(alibi_slopes=np.array([0.3, 0.7]))])
def test_scores_in_log2_units_give_natural_log_lse(options):
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 50, 16)).astype(np.float32) for _ in range(3))
    for impl in ("flash_numba_cpu_exp2", "flash_numba_cpu"):
        out, lse = course_lib.attention(q, k, v, impl=impl, block_q=16, block_k=24, return_lse=True, **options)
        checks.check_attention(out, q, k, v, lse=lse, block_q=16, block_k=24, **options)
