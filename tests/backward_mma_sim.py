"""Run by tests/test_backward_mma.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (numba's simulator must be
chosen before numba is imported): the tensor-core backward (``cuda_mma_f16``, its mma.sync emulated by
``tensor_cores.sim``) on small awkward cases in float16 / bfloat16 through ``course_lib.attention_backward``, checked
against the float64 gradient, and three planted mistakes; one JSON line of verdicts on stdout.

Two warps and inner tiles of 16 rows (the GPU's default is 4 and 64): the same code with every tile
boundary, tail and edge reached at shapes the simulator finishes in seconds."""
import contextlib
import io
import json

import ml_dtypes
import numpy as np

import course_lib
from course_lib import checks
from course_lib.bench.cases import with_slopes
from course_lib.bench.timing import verdict
from course_lib.core import rules
from course_lib.kernels.tensor_cores import backward as tb
from course_lib.kernels.tensor_cores import sim as mma_sim

from conftest import make_qkv
from forward_mma_sim import one_warp_mma

SMALL = tb.BackwardTiling(warps=2, Bi=16)
tb.default_tiling = lambda kind, D, Dv: SMALL

# name: (B, H, Hk, Nq, Nk, D, Dv, options, dtype)
CASES = {
    "tails_gqa_causal": (1, 2, 1, 21, 27, 8, 8, {"causal": True}, "float16"),
    "nq_gt_nk_odd_dims_bf16": (1, 1, 1, 35, 9, 7, 5, {}, "bfloat16"),
    "softcap_alibi_top_left": (1, 2, 2, 13, 33, 8, 8, {"softcap": 1.5, "causal": True, "causal_align": "top_left",
                                                      "alibi_slopes": [0.5, 0.1]}, "float16"),
    "empty_rows": (1, 1, 1, 12, 9, 4, 4, {"window_size": (0, 0), "causal_align": "top_left"}, "float16"),
    "aligned_causal": (1, 1, 1, 48, 64, 8, 8, {"causal": True}, "float16"),   # tiles away from every tail
    # many more queries than keys: ALiBi's bias runs to about 200, rebased it stays small
    "alibi_far_from_the_diagonal_mqa": (1, 2, 1, 64, 3, 8, 8, {"alibi_slopes": [3.0, 0.9]}, "float16"),
}


def run_case(name, seed=0):
    B, H, Hk, Nq, Nk, D, Dv, options, dtype = CASES[name]
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    options = with_slopes(options)
    rng = np.random.default_rng(seed)
    q, k, v = make_qkv(rng, B, H, Hk, Nq, Nk, D, Dv, dt)
    out, lse = course_lib.attention(q, k, v, impl="reference", return_lse=True, **options)
    out, lse = out.astype(dt), lse.astype(np.float32)
    dout = rng.standard_normal(out.shape).astype(dt)

    def go():
        grads = course_lib.attention_backward(q, k, v, out, lse, dout, impl="cuda_mma_f16", **options)
        assert all(g.dtype == q.dtype and not np.isnan(g.astype(np.float32)).any() for g in grads), \
            "FAIL a gradient nobody wrote, or not in q's dtype"
        checks.check_attention_backward(grads, q, k, v, out, lse, dout, **options)
        if name == "empty_rows":     # rows that see no key: zero dQ
            assert (grads[0][:, :, Nk:].astype(np.float32) == 0).all(), "FAIL dQ of a row that saw no key"
    return verdict(go)


def mma_unit(kind, seed=3):
    """One warp's mma through ``sim`` against numpy: A (16 x 16) B^T (B 8 x 16) + C, fragments placed by
    the PTX ISA's tables; the verdict says how far the emulated instruction is from float64's product."""
    dt = ml_dtypes.bfloat16 if kind == "bf16" else np.float16
    op = mma_sim.mma_bf16 if kind == "bf16" else mma_sim.mma_f16
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((16, 16)).astype(dt), rng.standard_normal((8, 16)).astype(dt)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    aw, bw = (x.view(np.uint16).astype(np.uint32) for x in (A, B))
    aw, bw = aw[:, 0::2] | (aw[:, 1::2] << 16), bw[:, 0::2] | (bw[:, 1::2] << 16)    # two halves a word
    D = one_warp_mma(op, aw, bw, C)
    want = A.astype(np.float64) @ B.astype(np.float64).T + C
    err = float(np.max(np.abs(D - want)))
    return "PASS" if err <= 1e-5 * float(np.max(np.abs(want))) else f"FAIL mma_{kind}: max error {err:.3g}"


def planted(kind):
    """The check must fail on each: GQA's dK / dV not summed over the group (only the first query head of
    each group), the mask forgotten in the recomputed P (every tile FULL), and A's registers of P^T / dS^T
    packed in the wrong order (the fragment table of ``layout.HALF_A`` with its second and third
    registers swapped, as one misreading the PTX ISA's figure would write it)."""
    real_plan, real_half = tb.plan, tb.HALF_A

    def bad_plan(*args, **kw):
        dkdv, dq, grid_kv, grid_q, threads, args_kv, args_q, kind_ = real_plan(*args, **kw)
        tiles_kv, group, *rest = args_kv
        tiles_q, *rest_q = args_q
        if kind == "gqa_not_summed":
            group = 1
        elif kind == "mask_forgotten":
            tiles_kv, tiles_q = np.full_like(tiles_kv, rules.FULL), np.full_like(tiles_q, rules.FULL)
        return dkdv, dq, grid_kv, grid_q, threads, (tiles_kv, group, *rest), (tiles_q, *rest_q), kind_
    tb.plan = bad_plan
    if kind == "half_a_swapped":
        tb.HALF_A = (real_half[0], real_half[2], real_half[1], real_half[3])
    tb._KERNELS.clear()
    try:
        # the mask is applied on PARTIAL and edge tiles only: forgetting it shows where tiles are interior
        return run_case("aligned_causal" if kind == "mask_forgotten" else "tails_gqa_causal", seed=1)
    finally:
        tb.plan, tb.HALF_A = real_plan, real_half
        tb._KERNELS.clear()


if __name__ == "__main__":
    results = {}
    with contextlib.redirect_stdout(io.StringIO()):   # the checks print their verdicts; we keep ours
        for name in CASES:
            results[name] = run_case(name)
        for kind in ("f16", "bf16"):
            results[f"unit/mma_{kind}"] = mma_unit(kind)
        for kind in ("gqa_not_summed", "mask_forgotten", "half_a_swapped"):
            results[f"planted/{kind}"] = planted(kind)
    print(json.dumps(results))
