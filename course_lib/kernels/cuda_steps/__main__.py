"""Check one step against the float64 reference and, on a GPU, time it.

    python -m course_lib.kernels.cuda_steps STEP [--sim] [--n 4096] [--d 64 128] [--bh 64]

Without a GPU (or with ``--sim``) the step runs in numba's simulator, on small
awkward shapes only (tails, Nq != Nk, GQA / MQA, causal both ways, window,
softcap, ALiBi, rows that see no key, split-KV); the simulator must be chosen
before numba is imported, so the command starts itself again with
``NUMBA_ENABLE_CUDASIM=1``.  On a GPU it also checks and times the step at
B*H = ``--bh``, N = ``--n`` for each head dim in ``--d``: CUDA events around
the kernel launches on device arrays, TFLOP/s counting 4 N^2 D per (batch,
head) (non-causal).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace

import numpy as np

from ...core import reference
from ...core.flops import attention_flops
from ...core.options import call_forward
from .device import on_gpu
from .run import SIMT_STEPS, attention, launcher, plan

# name: (B, H, Hk, Nq, Nk, D, Dv, options, splits)
CASES = {
    "tails_gqa_causal": (1, 4, 2, 21, 27, 16, 16, {"causal": True}, 1),
    "nq_gt_nk_odd_dims": (1, 2, 2, 19, 9, 7, 5, {}, 1),
    "nq_lt_nk_window_mqa": (1, 3, 1, 5, 30, 8, 6, {"window_size": (4, 2)}, 1),
    "softcap_alibi_causal_top_left": (2, 2, 2, 13, 11, 8, 8, {"softcap": 1.5, "causal": True,
                                                              "causal_align": "top_left",
                                                              "alibi_slopes": np.array([0.5, 0.1])}, 1),
    "empty_rows": (1, 2, 2, 12, 9, 4, 4, {"window_size": (0, 0), "causal_align": "top_left"}, 1),
    "split_kv_causal": (1, 2, 1, 9, 40, 8, 8, {"causal": True}, 3),
}
RTOL, ATOL = 1e-4, 1e-5    # float32 with fast exp2: a few ulps of each output


def problem(B, H, Hk, Nq, Nk, D, Dv, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, Nq, D)).astype(np.float32),
            rng.standard_normal((B, Hk, Nk, D)).astype(np.float32),
            rng.standard_normal((B, Hk, Nk, Dv)).astype(np.float32))


def check(step, q, k, v, splits=1, **options):
    """None when ``step`` matches the reference on (q, k, v), else what is wrong."""
    out, lse = attention(q, k, v, step=step, splits=splits, return_lse=True, **options)
    ref_out, ref_lse = call_forward(reference.attention_forward, q.astype(np.float64), k.astype(np.float64),
                                    v.astype(np.float64), return_lse=True, **options)
    if np.isnan(out).any():
        return "an output element was never written (NaN)"
    if not np.allclose(out, ref_out, rtol=RTOL, atol=ATOL):
        return f"out differs from the reference by up to {np.abs(out - ref_out).max():.3g}"
    if not np.allclose(lse, ref_lse, rtol=RTOL, atol=ATOL, equal_nan=True):
        return f"lse differs from the reference by up to {np.nanmax(np.abs(lse - ref_lse)):.3g}"
    return None


def time_step(step, B, H, N, D, repeats=10):
    """Median seconds of one launch of ``step`` at (B, H, N, N, D), CUDA events around it."""
    from numba import cuda
    q, k, v = problem(B, H, H, N, N, D, D, seed=1)
    got = {}

    def grab(q, k, v, opts, mask):
        got["plan"] = plan(step, q, k, v, opts, mask)
        return np.zeros(1), np.zeros(1)
    call_forward(grab, q, k, v)
    p = got["plan"]
    p = replace(p, args=tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in p.args))
    arrays = [cuda.to_device(a) for a in (q, k, v)]
    out, lse = cuda.device_array((B, H, N, D), np.float32), cuda.device_array((B, H, N), np.float32)
    run = launcher(p, *arrays, out, lse)
    run()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)    # milliseconds
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m course_lib.kernels.cuda_steps",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=SIMT_STEPS)
    parser.add_argument("--sim", action="store_true", help="run in numba's simulator even with a GPU")
    parser.add_argument("--n", type=int, default=4096, help="sequence length to time at (GPU only)")
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dims to time at (GPU only)")
    parser.add_argument("--bh", type=int, default=64, help="batch x heads to time at (GPU only)")
    args = parser.parse_args(argv)
    import numba
    if (args.sim or not on_gpu()) and not numba.config.ENABLE_CUDASIM:
        env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
        argv = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, "-m", "course_lib.kernels.cuda_steps", *argv], env)
    where = "gpu" if on_gpu() else "numba simulator"
    failed = 0
    for name, (B, H, Hk, Nq, Nk, D, Dv, options, splits) in CASES.items():
        if splits > 1 and args.step in ("row", "row_exp2"):
            continue                          # split-KV is the micro-tiled kernels' only
        wrong = check(args.step, *problem(B, H, Hk, Nq, Nk, D, Dv), splits=splits, **options)
        failed += wrong is not None
        print(f"{args.step} {name:32s} {'FAIL ' + wrong if wrong else 'PASS'}  ({where})", flush=True)
    if where == "gpu" and not failed:
        for D in args.d:
            wrong = check(args.step, *problem(1, 4, 4, 1000, 1000, D, D, seed=2))
            if wrong:
                failed += 1
                print(f"{args.step} D={D} N=1000: FAIL {wrong}")
                continue
            seconds = time_step(args.step, 1, args.bh, args.n, D)
            tflops = attention_flops(1, args.bh, args.n, args.n, D) / seconds / 1e12
            print(f"{args.step} B*H={args.bh} N={args.n} D={D}: {seconds * 1e3:.3f} ms, {tflops:.1f} TFLOP/s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
