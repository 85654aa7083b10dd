"""The awkward cases every CUDA attention kernel is checked on, in the simulator and on a GPU.

Tails, Nq != Nk, GQA / MQA, causal both ways, a window, softcap with ALiBi,
ALiBi far from the diagonal, rows that see no key, split-KV and decode: the tests run them in numba's
simulator at these sizes, and the GPU benchmarks run the same cases (and
larger ones) before they time anything, so a speed is only ever quoted for a
kernel that passed them.

- ``CUDA_IMPLS``: the registry's CUDA impls that run in the simulator too (not the tensor-core ones);
- ``FORWARD_CASES``: name -> (B, H, Hk, Nq, Nk, D, Dv, options, splits); splits > 1 is split-KV's;
- ``BACKWARD_CASES``: name -> (B, H, Hk, Nq, Nk, D, Dv, options);
- ``run_backward_case``: the CUDA backward on one case, checked against the float64 gradient.
"""
from __future__ import annotations

import numpy as np

from .. import api, checks
from ..kernels import IMPLS
from .timing import verdict

CUDA_IMPLS = [name for name, impl in IMPLS.items() if impl.cuda and not impl.gpu_only]

FORWARD_CASES = {
    "tails_gqa_causal": (1, 4, 2, 21, 27, 16, 16, {"causal": True}, 1),
    "nq_gt_nk_odd_dims": (1, 2, 2, 19, 9, 7, 5, {}, 1),
    "nq_lt_nk_window_mqa": (1, 3, 1, 5, 30, 8, 6, {"window_size": (4, 2)}, 1),
    "softcap_alibi_causal_top_left": (2, 2, 2, 13, 11, 8, 8,
                                      {"softcap": 1.5, "causal": True, "causal_align": "top_left",
                                       "alibi_slopes": [0.5, 0.1]}, 1),
    "empty_rows": (1, 2, 2, 12, 9, 4, 4, {"window_size": (0, 0), "causal_align": "top_left"}, 1),
    "nk_below_one_tile": (1, 2, 1, 11, 3, 8, 8, {}, 1),
    "split_kv_causal": (1, 2, 1, 9, 40, 8, 8, {"causal": True}, 3),
    "decode_split_kv": (2, 2, 1, 1, 45, 16, 16, {}, 4),
    # many more queries than keys: ALiBi's bias of the first rows runs to hundreds (rebased, it stays small)
    "alibi_far_from_the_diagonal_mqa": (1, 2, 1, 256, 3, 8, 8, {"alibi_slopes": [3.0, 0.9]}, 1),
}

BACKWARD_CASES = {
    "tails_gqa_causal": (1, 4, 2, 37, 45, 8, 8, {"causal": True}),
    "nq_gt_nk_odd_dims": (1, 2, 2, 35, 9, 7, 5, {}),
    "nq_lt_nk_window_mqa": (1, 3, 1, 5, 40, 8, 6, {"window_size": (4, 2)}),
    "softcap_alibi_causal_top_left": (2, 2, 2, 13, 33, 8, 8,
                                      {"softcap": 1.5, "causal": True, "causal_align": "top_left",
                                       "alibi_slopes": [0.5, 0.1]}),
    "empty_rows": (1, 2, 2, 12, 9, 4, 4, {"window_size": (0, 0), "causal_align": "top_left"}),
    "alibi_far_from_the_diagonal_mqa": (1, 2, 1, 256, 3, 8, 8, {"alibi_slopes": [3.0, 0.9]}),
}


def with_slopes(options: dict) -> dict:
    """A case's options as a kernel takes them: ALiBi's slopes as an array (the cases keep plain lists)."""
    return {a: (np.array(b) if a == "alibi_slopes" else b) for a, b in options.items()}


def backward_problem(B, H, Hk, Nq, Nk, D, Dv, options, seed):
    """float32 (q, k, v, out, lse, dout): random inputs, the reference's output and lse, a random dout."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, Nq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hk, Nk, D)).astype(np.float32)
    v = rng.standard_normal((B, Hk, Nk, Dv)).astype(np.float32)
    out, lse = api.attention(q, k, v, impl="reference", return_lse=True, **options)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    return q, k, v, out.astype(np.float32), lse.astype(np.float32), dout


def run_backward_case(name, case=None, seed=0) -> str:
    """The verdict of ``flash_numba_cuda``'s backward on case ``name`` (``case``: its tuple, by default
    ``BACKWARD_CASES[name]``)."""
    B, H, Hk, Nq, Nk, D, Dv, options = BACKWARD_CASES[name] if case is None else case
    options = with_slopes(options)
    q, k, v, out, lse, dout = backward_problem(B, H, Hk, Nq, Nk, D, Dv, options, seed)

    def go():
        grads = api.attention_backward(q, k, v, out, lse, dout, impl="flash_numba_cuda", **options)
        assert all(g.dtype == np.float32 and not np.isnan(g).any() for g in grads), "a gradient nobody wrote"
        checks.check_attention_backward(grads, q, k, v, out, lse, dout, **options)
        if name == "empty_rows":     # rows that see no key: zero dQ
            assert (grads[0][:, :, Nk:] == 0).all()
    return verdict(go)
