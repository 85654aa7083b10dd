"""Run by tests/test_cuda_steps.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (numba's simulator
must be chosen before numba is imported): every CUDA impl of the registry on every case through
``course_lib.attention``, split-KV on every micro-tiled step, and the planted mistakes, one JSON
line of verdicts on stdout."""
import json
import sys
from dataclasses import replace

import numpy as np
from numba import cuda

import course_lib
from course_lib import checks
from course_lib.bench.cases import CUDA_IMPLS, FORWARD_CASES, with_slopes
from course_lib.bench.timing import verdict
from course_lib.core import rules
from course_lib.kernels import cuda_steps as cs

from conftest import make_qkv


def problem(B, H, Hk, Nq, Nk, D, Dv, seed):
    """Read-only inputs, as a check cell hands them: a kernel must never write them."""
    return checks.readonly(*make_qkv(seed, B, H, Hk, Nq, Nk, D, Dv, np.float32))


def run_case(impl, name, seed=0):
    """impl (a registry name) on case ``name`` through course_lib.attention; a split-KV case runs
    cuda_steps.attention with step ``impl`` and the case's splits."""
    B, H, Hk, Nq, Nk, D, Dv, options, splits = FORWARD_CASES[name]
    q, k, v = problem(B, H, Hk, Nq, Nk, D, Dv, seed)
    options = with_slopes(options)
    tiling = replace(cs.DECODE_TILING, Bc=8, threads=8, tx=8) if name.startswith("decode") else None

    def go():
        if splits > 1:
            out, lse = cs.attention(q, k, v, step=impl, tiling=tiling, splits=splits, return_lse=True, **options)
        else:
            out, lse = course_lib.attention(q, k, v, impl=impl, return_lse=True, **options)
        assert out.dtype == np.float32 and lse.dtype == np.float32
        assert not np.isnan(out).any(), "an output element was never written (still the NaN poison)"
        checks.check_attention(out, q, k, v, lse=lse, **options)
        if name.startswith("alibi_far"):   # float32's own bounds too: no baseline's error to widen them
            expected = course_lib.attention(*(x.astype(np.float64) for x in (q, k, v)), impl="reference",
                                            return_lse=True, **options)
            checks.check_close("out", out, expected[0], dtype=np.float32)
            checks.check_close("lse", lse, expected[1], dtype=np.float32)
        if name == "empty_rows":
            assert np.isneginf(lse[:, :, Nk:]).all() and (out[:, :, Nk:] == 0).all()
    return verdict(go)


def planted(kind):
    """The check must fail on each of these wrong answers (a plan or a launch edited on the host)."""
    q, k, v = problem(1, 2, 1, 19, 23, 8, 8, 3)
    causal = kind in ("partial_tile_marked_full", "skip_a_needed_tile")
    real_plan = cs.run.plan

    def bad_plan(step, q, k, v, opts, mask, **kw):
        p = real_plan(step, q, k, v, opts, mask, **kw)
        visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right = p.args
        if kind == "partial_tile_marked_full":      # the diagonal tile's mask is skipped
            tiles = np.where(tiles == rules.PARTIAL, rules.FULL, tiles).astype(np.int8)
        elif kind == "skip_a_needed_tile":          # the first key tile of every row is left out
            visit = np.roll(visit, -1, axis=1)
            nvisit = np.maximum(nvisit - 1, 0).astype(np.int32)
        elif kind == "natural_scale_in_base_2":     # log2(e) forgotten: exp2 of natural-unit scores
            scale = np.float32(opts.softmax_scale)
        elif kind == "wrong_kv_head":               # GQA: each query head reads the other group's K / V head
            kv_head = (kv_head + 1) % 2
        return replace(p, args=(visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right))
    if kind == "wrong_kv_head":
        q, k, v = problem(1, 4, 2, 19, 23, 8, 8, 4)
    cs.run.plan = bad_plan
    try:
        def go():
            out, lse = cs.attention(q, k, v, step="tuned", causal=causal, return_lse=True)
            checks.check_attention(out, q, k, v, lse=lse, causal=causal)
        return verdict(go)
    finally:
        cs.run.plan = real_plan


def planted_merge():
    """Split-KV whose partial results are averaged instead of merged by their lse: must fail."""
    q, k, v = problem(1, 2, 2, 1, 40, 8, 8, 5)
    real = cs.run.make_merge_kernel

    @cuda.jit
    def mean_merge(part_out, part_lse, out, lse):
        S, B, H, Nq, Dv = part_out.shape
        g = cuda.grid(1)
        if g < B * H * Nq:
            i, h, b = g % Nq, (g // Nq) % H, g // (Nq * H)
            for e in range(Dv):
                acc = 0.0
                for z in range(S):
                    acc += part_out[z, b, h, i, e]
                out[b, h, i, e] = acc / S
            lse[b, h, i] = part_lse[0, b, h, i]
    cs.run.make_merge_kernel = lambda: mean_merge
    try:
        def go():
            out, lse = cs.attention(q, k, v, step="tuned", splits=4, return_lse=True)
            checks.check_attention(out, q, k, v, lse=lse)
        return verdict(go)
    finally:
        cs.run.make_merge_kernel = real


if __name__ == "__main__":
    import contextlib
    import io
    results = {}
    with contextlib.redirect_stdout(io.StringIO()):   # the checks print their verdicts; we keep ours
        for name, case in FORWARD_CASES.items():
            for impl in (cs.SPLIT_KV_STEPS if case[-1] > 1 else CUDA_IMPLS):
                results[f"{impl}/{name}"] = run_case(impl, name)
        for kind in ("partial_tile_marked_full", "skip_a_needed_tile", "natural_scale_in_base_2", "wrong_kv_head"):
            results[f"planted/{kind}"] = planted(kind)
        results["planted/mean_merge"] = planted_merge()
        results["where"] = "numba simulator" if not cs.on_gpu() else "gpu"
    print(json.dumps(results))
    sys.exit(0)
