"""The backward pass (chapter 12): every backward impl against the float64 gradient, the float64
gradient against finite differences and PyTorch's autograd, every option of the forward, the
tolerance rule failing on planted mistakes, and bad input refused with the argument named."""
import ml_dtypes
import numba
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import course_lib
from course_lib import checks
from course_lib.core.backward_options import call_backward
from course_lib.core.reference_backward import backward_math

from conftest import attention_problems, make_qkv

IMPLS = [name for name in course_lib.available_backward_impls() if name != "reference"]
SLOPES4 = np.array([0.3, 0.1, 0.2, 0.4])
CASES = {
    "plain": {},
    "causal": dict(causal=True),
    "causal top-left": dict(causal=True, causal_align="top_left"),
    "window": dict(window_size=(5, 3)),
    "softcap": dict(softcap=2.0),
    "alibi + softcap + causal": dict(alibi_slopes=SLOPES4, softcap=1.5, causal=True),
    "odd tiles": dict(block_q=7, block_k=5, causal=True, window_size=(9, -1)),
}


def problem(rng, batch=2, heads=4, heads_k=2, nq=37, nk=29, d=16, dv=12, dtype=np.float64, **options):
    """q, k, v, dout and the forward's out, lse (float64 forward, then cast: a fair start for every dtype)."""
    q, k, v = make_qkv(rng, batch, heads, heads_k, nq, nk, d, dv, dtype)
    out, lse = course_lib.attention(q, k, v, return_lse=True, **options)
    dout = rng.standard_normal(out.shape).astype(dtype)
    return q, k, v, out, lse, dout


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("impl", IMPLS)
def test_every_backward_impl_matches_the_float64_gradient(impl, case):
    """GQA (4 query heads on 2 K/V heads), tails, Nq != Nk, in float64 and float32."""
    options = CASES[case]
    for dtype in (np.float64, np.float32):
        q, k, v, out, lse, dout = problem(np.random.default_rng(0), dtype=dtype, **options)
        grads = course_lib.attention_backward(q, k, v, out, lse, dout, impl=impl, **options)
        assert [g.dtype for g in grads] == [q.dtype] * 3
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
        checks.check_attention_backward(grads, q, k, v, out, lse, dout, **options)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("impl", ["flash_numpy", "flash_numba_cpu"])
def test_low_precision_gradients_are_in_the_input_dtype_within_twice_naive(impl, dtype):
    options = dict(causal=True, softcap=3.0)
    q, k, v, out, lse, dout = problem(np.random.default_rng(1), dtype=dtype, **options)
    grads = course_lib.attention_backward(q, k, v, out, lse, dout, impl=impl, **options)
    assert [g.dtype for g in grads] == [np.dtype(dtype)] * 3
    checks.check_attention_backward(grads, q, k, v, out, lse, dout, **options)


def _loss(q, k, v, w, **options):
    return float(np.sum(course_lib.attention(q, k, v, **options) * w))


@pytest.mark.parametrize("case", ["plain", "causal", "alibi + softcap + causal", "window"])
def test_the_float64_gradient_is_the_finite_difference_of_the_forward(case):
    options = CASES[case]
    rng = np.random.default_rng(2)
    q, k, v, out, lse, w = problem(rng, batch=1, heads=4, heads_k=2, nq=5, nk=6, d=3, dv=2, **options)
    grads = course_lib.attention_backward(q, k, v, out, lse, w, impl="reference", **options)
    h = 1e-6
    for which, grad in enumerate(grads):
        x = (q, k, v)[which]
        numeric = np.zeros_like(x)
        for index in np.ndindex(x.shape):
            args = [a.copy() for a in (q, k, v)]
            args[which][index] += h
            up = _loss(*args, w, **options)
            args[which][index] -= 2 * h
            numeric[index] = (up - _loss(*args, w, **options)) / (2 * h)
        np.testing.assert_allclose(grad, numeric, atol=1e-7, rtol=1e-6)


def _torch_grads(q, k, v, dout, causal=False, causal_align="bottom_right", window_size=(-1, -1),
                 softcap=0.0, alibi_slopes=None):
    """PyTorch's autograd: through SDPA where it has the option, else through the explicit ops."""
    tq, tk, tv = (torch.tensor(x.astype(np.float64) if x.dtype != np.float32 else x, requires_grad=True)
                  for x in (q, k, v))
    H, Hk, Nq, Nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    if softcap == 0 and alibi_slopes is None and window_size == (-1, -1) and (not causal or causal_align == "top_left"):
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=H != Hk)
    else:
        kk, vv = (t.repeat_interleave(H // Hk, dim=1) for t in (tk, tv))
        s = tq @ kk.transpose(-1, -2) / np.sqrt(q.shape[-1])
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        i, j = torch.arange(Nq)[:, None], torch.arange(Nk)[None, :]
        offset = Nk - Nq if causal_align == "bottom_right" else 0
        if alibi_slopes is not None:
            s = s - torch.tensor(alibi_slopes, dtype=s.dtype)[:, None, None] * (i + offset - j).abs()
        left, right = window_size[0], 0 if causal else window_size[1]
        hidden = ((j > i + offset + right) if right >= 0 else torch.zeros_like(i + j, dtype=torch.bool))
        if left >= 0:
            hidden = hidden | (j < i + offset - left)
        blind = hidden.all(dim=-1, keepdim=True)            # rows that see no key: out 0, no gradient
        out = (torch.softmax(s.masked_fill(hidden & ~blind, -torch.inf), dim=-1) @ vv) * ~blind
    out.backward(torch.tensor(dout.astype(tq.detach().numpy().dtype)))
    return tuple(t.grad.numpy() for t in (tq, tk, tv))


@pytest.mark.parametrize("case", ["plain", "causal top-left", "causal", "window", "alibi + softcap + causal"])
def test_pytorch_autograd_gives_the_same_gradient(case):
    """Through SDPA (plain, top-left causal, GQA) and through torch's explicit ops for the rest;
    float64 tight, and PyTorch's float32 gradient passes the course's float32 rule."""
    options = CASES[case]
    q, k, v, out, lse, dout = problem(np.random.default_rng(3), **options)
    ours = course_lib.attention_backward(q, k, v, out, lse, dout, impl="flash_numpy", **options)
    for mine, theirs in zip(ours, _torch_grads(q, k, v, dout, **options)):
        np.testing.assert_allclose(mine, theirs, atol=1e-10, rtol=1e-9)
    q32, k32, v32, dout32 = (x.astype(np.float32) for x in (q, k, v, dout))
    out32, lse32 = course_lib.attention(q32, k32, v32, return_lse=True, **options)
    checks.check_attention_backward(_torch_grads(q32, k32, v32, dout32, **options),
                                    q32, k32, v32, out32, lse32, dout32, **options)


# -- the tolerance rule catches what a backward typically gets wrong ---------------

def _no_group_sum(q, k, v, out, lse, dout, opts, mask):
    """dK, dV of the first query head of each group only: GQA's sum forgotten."""
    dq, dk, dv = backward_math(q, k, v, out, lse, dout, opts, mask)
    g = q.shape[1] // k.shape[1]
    heads = np.arange(0, q.shape[1], g)
    kv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    _, dk_heads, dv_heads = backward_math(q, *kv, out, lse, dout, opts, mask)
    return dq, dk_heads[:, heads], dv_heads[:, heads]


def _mask_forgotten(q, k, v, out, lse, dout, opts, mask):
    """P recomputed without the causal mask."""
    from dataclasses import replace
    return backward_math(q, k, v, out, lse, dout, replace(opts, causal=False), replace(mask, causal=False))


def _d_from_p(q, k, v, out, lse, dout, opts, mask):
    """D_i taken as rowsum(dO_i) instead of rowsum(dO_i * O_i)."""
    return backward_math(q, k, v, np.ones_like(out), lse, dout, opts, mask)


@pytest.mark.parametrize("bug", [_no_group_sum, _mask_forgotten, _d_from_p])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_the_gradient_rule_fails_planted_mistakes(bug, dtype):
    options = dict(causal=True)
    q, k, v, out, lse, dout = problem(np.random.default_rng(4), dtype=dtype, **options)
    grads = call_backward(bug, q, k, v, out, lse, dout, **options)
    with pytest.raises(checks.CheckFailed):
        checks.check_attention_backward(tuple(g.astype(dtype) for g in grads), q, k, v, out, lse, dout, **options)


# -- edges: rows that see nothing, varlen, threads, NaN ------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_rows_that_see_no_key_get_zero_gradient(impl):
    """Bottom-right causal with Nq > Nk: the first Nq - Nk rows see no key."""
    q, k, v, out, lse, dout = problem(np.random.default_rng(5), nq=20, nk=8, causal=True, block_q=4, block_k=4)
    dq, dk, dv = course_lib.attention_backward(q, k, v, out, lse, dout, impl=impl, causal=True, block_q=4, block_k=4)
    assert np.all(dq[:, :, :12] == 0) and np.all(np.isfinite(dq))
    checks.check_attention_backward((dq, dk, dv), q, k, v, out, lse, dout, causal=True)


@pytest.mark.parametrize("impl", ["flash_numpy", "flash_numba_cpu"])
def test_varlen_backward_is_the_dense_backward_of_each_sequence(impl):
    rng = np.random.default_rng(6)
    lengths_q, lengths_k = [5, 0, 17, 9], [7, 3, 17, 4]
    cq, ck = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lengths_q, lengths_k))
    q, k, v = (rng.standard_normal((n, h, 8)) for n, h in ((cq[-1], 4), (ck[-1], 2), (ck[-1], 2)))
    options = dict(causal=True, alibi_slopes=rng.uniform(0.1, 0.5, (4, 4)))
    out, lse = course_lib.attention_varlen(q, k, v, cq, ck, return_lse=True, **options)
    dout = rng.standard_normal(out.shape)
    dq, dk, dv = course_lib.attention_backward_varlen(q, k, v, out, lse, dout, cq, ck, impl=impl, **options)
    for b in range(4):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        dense = [x[None].transpose(0, 2, 1, 3) for x in (q[rows], k[keys], v[keys], out[rows], dout[rows])]
        qb, kb, vb, ob, dob = dense
        expected = course_lib.attention_backward(qb, kb, vb, ob, lse[None, :, rows], dob, impl="reference",
                                                 causal=True, alibi_slopes=options["alibi_slopes"][b:b + 1])
        for got, want in zip((dq[rows], dk[keys], dv[keys]), expected):
            np.testing.assert_allclose(got, want[0].transpose(1, 0, 2), atol=1e-12)


@pytest.mark.parametrize("impl", ["flash_numba_cpu", "flash_numba_cpu_dq_pass"])
def test_the_compiled_gradient_does_not_depend_on_the_number_of_threads(impl):
    """dQ from per-thread partials or from a second pass: no race, whatever the threads."""
    q, k, v, out, lse, dout = problem(np.random.default_rng(7), nq=90, nk=70, dtype=np.float32, causal=True,
                                      block_q=16, block_k=16)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = course_lib.attention_backward(q, k, v, out, lse, dout, impl=impl, causal=True, block_q=16, block_k=16)
    finally:
        numba.set_num_threads(threads)
    many = course_lib.attention_backward(q, k, v, out, lse, dout, impl=impl, causal=True, block_q=16, block_k=16)
    for a, b in zip(one, many):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_in_dout_reaches_the_gradients_it_touches(impl):
    """A NaN in row i of dO: dq row i and the dk, dv rows of every key row i sees are NaN."""
    q, k, v, out, lse, dout = problem(np.random.default_rng(8), heads=2, heads_k=2, nq=12, nk=12)
    dout[0, 1, 5, 0] = np.nan
    dq, dk, dv = course_lib.attention_backward(q, k, v, out, lse, dout, impl=impl, causal=True)
    assert np.isnan(dq[0, 1, 5]).all() and np.isnan(dv[0, 1, :6]).any(axis=-1).all()
    assert np.isnan(dk[0, 1, :6]).all()
    assert np.isfinite(dq[1]).all() and np.isfinite(dq[0, 0]).all()   # other heads untouched


def test_empty_problems_give_empty_or_zero_gradients():
    rng = np.random.default_rng(9)
    q, k, v = make_qkv(rng, 1, 2, 2, 0, 3, 4)
    out, lse = course_lib.attention(q, k, v, return_lse=True)
    grads = course_lib.attention_backward(q, k, v, out, lse, out)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape] and np.all(grads[1] == 0)
    q, k, v = make_qkv(rng, 1, 2, 2, 3, 0, 4)
    out, lse = course_lib.attention(q, k, v, return_lse=True)
    dq, _, _ = course_lib.attention_backward(q, k, v, out, lse, np.ones_like(out))
    assert np.all(dq == 0)


# -- bad input ----------------------------------------------------------------------

def _bad(mutate, **options):
    q, k, v, out, lse, dout = problem(np.random.default_rng(10), nq=10, nk=6, **options)
    args = dict(q=q, k=k, v=v, out=out, lse=lse, dout=dout)
    mutate(args)
    return args, options


@pytest.mark.parametrize("mutate, error, words", [
    (lambda a: a.update(dout=a["dout"][:, :, :-1]), ValueError, "dout must have the forward's output shape"),
    (lambda a: a.update(out=a["out"][..., :-1]), ValueError, "out must have the forward's output shape"),
    (lambda a: a.update(dout=a["dout"].astype(np.float32)), TypeError, "dout must have q's dtype"),
    (lambda a: a.update(lse=a["lse"][..., None]), ValueError, "lse must have shape"),
    (lambda a: a.update(lse=a["lse"].astype(np.int64)), TypeError, "lse must be a float numpy array"),
    (lambda a: a.update(dout=list(a["dout"])), TypeError, "dout must be a numpy array"),
    (lambda a: a["lse"].__setitem__((0, 0, 0), np.inf), ValueError, "+inf"),
    (lambda a: a["lse"].__setitem__((0, 0, 9), -np.inf), ValueError, "sees keys"),
], ids=["dout shape", "out shape", "dout dtype", "lse shape", "lse dtype", "dout type", "lse +inf", "lse -inf"])
def test_bad_saved_tensors_are_refused_naming_the_argument(mutate, error, words):
    args, options = _bad(mutate)
    with pytest.raises(error, match=words.replace("+", r"\+")):
        course_lib.attention_backward(**args, **options)


def test_an_lse_from_another_mask_is_refused():
    """The forward ran causal (rows 0-3 of Nq=10 over Nk=6 see no key: lse = -inf); the
    backward is asked without the mask, or with the top-left alignment."""
    args, _ = _bad(lambda a: None, causal=True)
    with pytest.raises(ValueError, match="lse is -inf on a query row that sees keys"):
        course_lib.attention_backward(**args)
    args, _ = _bad(lambda a: None)
    with pytest.raises(ValueError, match="lse is finite on a query row that sees no key"):
        course_lib.attention_backward(**args, causal=True)


def test_bad_options_are_refused_as_the_forward_refuses_them():
    args, _ = _bad(lambda a: None)
    with pytest.raises(ValueError, match="impl must be one of"):
        course_lib.attention_backward(**args, impl="nope")
    with pytest.raises(ValueError, match="window_size"):
        course_lib.attention_backward(**args, window_size=(-2, 0))
    with pytest.raises(TypeError, match="softcap"):
        course_lib.attention_backward(**args, softcap="big")


# -- a property over random shapes and masks -------------------------------------------

# one batch, GQA, tails, every mask and tile size, in float64 and float32
PROBLEMS = attention_problems(batch=st.just(1), seqlen=st.integers(1, 30), head_dim=st.integers(1, 17),
                              head_dim_v=st.integers(1, 9), heads_k=st.integers(1, 2), window=st.integers(-1, 6),
                              softcap=st.sampled_from([0.0, 2.0]), block=st.integers(1, 16),
                              alibi=st.sampled_from([None, "heads"]), dtype=st.sampled_from([np.float64, np.float32]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=PROBLEMS)
def test_tiled_backwards_match_the_float64_gradient_on_random_problems(case):
    shape, options, dtype, seed = case
    q, k, v, out, lse, dout = problem(np.random.default_rng(seed), dtype=dtype, **shape, **options)
    for impl in ("flash_numpy", "flash_numba_cpu"):
        grads = course_lib.attention_backward(q, k, v, out, lse, dout, impl=impl, **options)
        checks.check_attention_backward(grads, q, k, v, out, lse, dout, **options)


# -- chapter 12's package: the counted traffic and the training run -------------------------

@pytest.mark.parametrize("schedule", ["fa2", "fa1", "naive"])
@pytest.mark.parametrize("case", [dict(), dict(causal=True), dict(window_size=(10, 3)),
                                  dict(causal=True, causal_align="top_left")])
def test_the_counted_backward_moves_what_the_model_says(schedule, case):
    from course_lib.backward.traffic import backward_io, run_counted_backward
    for dtype, (Nq, Nk, Hk) in ((np.float32, (37, 29, 1)), (np.float16, (64, 70, 2)), (np.float64, (33, 65, 1))):
        q, k, v, out, lse, dout = problem(np.random.default_rng(11), heads=2, heads_k=Hk, nq=Nq, nk=Nk, d=16, dv=8,
                                          dtype=dtype, **case)
        counted = run_counted_backward(q, k, v, out, lse, dout, schedule=schedule, block_q=16, block_k=16, **case)
        model = backward_io(2, 2, Nq, Nk, 16, 8, dtype=np.dtype(dtype).name, schedule=schedule,
                            block_q=16, block_k=16, lse_dtype=lse.dtype, **case)
        assert counted.traffic == model
        checks.check_attention_backward(counted.grads, q, k, v, out, lse, dout, **case)


def test_fa2_reads_o_once_where_fa1_reads_it_once_per_key_tile():
    from course_lib.backward.traffic import backward_io
    fa1, fa2 = (backward_io(1, 1, 1024, 1024, 64, dtype="float16", schedule=s, block_q=64, block_k=64)
                for s in ("fa1", "fa2"))
    assert fa1.reads["O"] == 16 * fa2.reads["O"] and fa2.bytes < fa1.bytes
    naive = backward_io(1, 1, 1024, 1024, 64, dtype="float16", schedule="naive")
    assert naive.reads["P"] == 2 * 1024 * 1024 * 2


def test_one_layer_trained_with_the_course_backward_follows_the_float64_gradient():
    """The layer's gradient (course backward + projection matmuls) against finite differences."""
    from course_lib.backward import training
    shape = training.LayerShape(d_model=6, heads=2, head_dim=3, seqlen=5, batch=2)
    x, target, start = training.task(shape, seed=3, dtype=np.float64)
    loss, grads = training.loss_and_grads(start, x, target, shape)
    h = 1e-6
    for name in training.PARAMS:
        for index in [(0, 0), (1, 2), (5, 1)]:
            params = {n: w.copy() for n, w in start.items()}
            params[name][index] += h
            up = np.mean((training.layer(params, x, shape) - target) ** 2)
            params[name][index] -= 2 * h
            down = np.mean((training.layer(params, x, shape) - target) ** 2)
            assert grads[name][index] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-9)
    losses = training.train(x, target, start, shape, steps=40, lr=3e-2)
    assert losses[-1] < 0.5 * losses[0]
