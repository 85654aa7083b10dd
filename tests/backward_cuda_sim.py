"""Run by tests/test_backward_cuda.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (numba's simulator must be
chosen before numba is imported): the CUDA backward on every case through ``course_lib.attention_backward``,
checked against the float64 gradient, and the planted mistakes, one JSON line of verdicts on stdout."""
import contextlib
import io
import json

import numpy as np

import course_lib
from course_lib import checks
from course_lib.kernels import backward_numba_cuda as bk

from conftest import make_qkv
from cuda_steps_sim import verdict  # one verdict line for both simulator runners

# name: (B, H, Hk, Nq, Nk, D, Dv, options)
CASES = {
    "tails_gqa_causal": (1, 4, 2, 37, 45, 8, 8, {"causal": True}),
    "nq_gt_nk_odd_dims": (1, 2, 2, 35, 9, 7, 5, {}),
    "nq_lt_nk_window_mqa": (1, 3, 1, 5, 40, 8, 6, {"window_size": (4, 2)}),
    "softcap_alibi_causal_top_left": (2, 2, 2, 13, 33, 8, 8,
                                      {"softcap": 1.5, "causal": True, "causal_align": "top_left",
                                       "alibi_slopes": [0.5, 0.1]}),
    "empty_rows": (1, 2, 2, 12, 9, 4, 4, {"window_size": (0, 0), "causal_align": "top_left"}),
}


def problem(B, H, Hk, Nq, Nk, D, Dv, options, seed):
    rng = np.random.default_rng(seed)
    q, k, v = make_qkv(rng, B, H, Hk, Nq, Nk, D, Dv, np.float32)
    out, lse = course_lib.attention(q, k, v, impl="reference", return_lse=True, **options)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    return q, k, v, out.astype(np.float32), lse.astype(np.float32), dout


def run_case(name, seed=0):
    B, H, Hk, Nq, Nk, D, Dv, options = CASES[name]
    options = {a: (np.array(b) if a == "alibi_slopes" else b) for a, b in options.items()}
    q, k, v, out, lse, dout = problem(B, H, Hk, Nq, Nk, D, Dv, options, seed)

    def go():
        grads = course_lib.attention_backward(q, k, v, out, lse, dout, impl="flash_numba_cuda", **options)
        assert all(g.dtype == np.float32 and not np.isnan(g).any() for g in grads), "a gradient nobody wrote"
        checks.check_attention_backward(grads, q, k, v, out, lse, dout, **options)
        if name == "empty_rows":     # rows that see no key: zero dQ
            assert (grads[0][:, :, Nk:] == 0).all()
    return verdict(go)


def planted(kind):
    """The check must fail on each: GQA's dK / dV not summed over the group (only the first query head of
    each group counted), and the causal mask forgotten in the recomputed P."""
    name = "tails_gqa_causal"
    real = bk.plan

    def bad_plan(q, k, v, opts, mask):
        dkdv, dq, grid_kv, grid_q, args = real(q, k, v, opts, mask)
        tiles, kv_head, group, *rest = args
        if kind == "gqa_not_summed":
            group = 1
        elif kind == "mask_forgotten":
            from course_lib.core import rules
            tiles = np.full_like(tiles, rules.FULL)
        return dkdv, dq, grid_kv, grid_q, (tiles, kv_head, group, *rest)
    bk.plan = bad_plan
    try:
        return run_case(name, seed=1)
    finally:
        bk.plan = real


if __name__ == "__main__":
    results = {}
    with contextlib.redirect_stdout(io.StringIO()):   # the checks print their verdicts; we keep ours
        for name in CASES:
            results[name] = run_case(name)
        for kind in ("gqa_not_summed", "mask_forgotten"):
            results[f"planted/{kind}"] = planted(kind)
    print(json.dumps(results))
