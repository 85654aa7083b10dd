"""cudacheck on chapter 10's vec kernels as a GPU compiles them, off the GPU.  (chapter 10)

    PYTHONPATH=. python benchmarks/cudacheck_steps.py tiled_rebuilt tiled_shuffle tiled_reorder tiled_aligned tiled_vec4

numba's simulator runs these kernels with the row max and sum through shared memory (it has no
warp shuffles), so the tests never see their shuffle path; cudacheck models shuffles, and here
runs each step's kernel built for a GPU (not under NUMBA_ENABLE_CUDASIM) on small tilings (one
warp with TX = 8; two warps with TX = 16) and awkward shapes, then checks the output against the
float64 reference.  cudacheck does not model dynamic shared memory, so this script alone gives
the kernel's one dynamic buffer the size the plan asks for.  ``tiled_staged`` reads K / V at flat
offsets, which cudacheck's bounds check refuses, so it is not for this script.  Exit status 1 if
any step has a finding or a wrong answer.
"""
import argparse
import sys
from dataclasses import replace

import numpy as np

from course_lib import checks, cudacheck
from course_lib.core.options import call_forward
from course_lib.cudacheck import checked_launch as cudacheck_launch
from course_lib.kernels import cuda_steps as cs

SHARED = {}   # floats the dynamic buffer of the launch being checked gets
_allocate = cudacheck_launch.Launch.allocate


def _sized_allocate(self, space, shape, dtype, frame):
    if space == "shared" and shape in (0, (0,), ()):
        shape = (SHARED["floats"],)
    return _allocate(self, space, shape, dtype, frame)


cudacheck_launch.Launch.allocate = _sized_allocate

TILINGS = [dict(Br=16, Bc=8, threads=32, tx=8), dict(Br=32, Bc=16, threads=64, tx=16)]
CASES = [((1, 2, 1, 19, 21, 8, 6), {"causal": True}),
         ((1, 1, 1, 13, 11, 7, 5), {"softcap": 1.5, "alibi_slopes": np.array([0.5])}),
         ((1, 1, 1, 33, 20, 8, 8), {"causal": True, "causal_align": "top_left"})]


def check_step(step, tiling, B, H, Hk, Nq, Nk, D, Dv, **options):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, Nq, D)).astype(np.float32)
    k = rng.standard_normal((B, Hk, Nk, D)).astype(np.float32)
    v = rng.standard_normal((B, Hk, Nk, Dv)).astype(np.float32)
    got = {}

    def grab(q_, k_, v_, opts, mask):
        got["plan"] = cs.plan(step, q_, k_, v_, opts, mask, tiling=tiling)
        return np.zeros(1), np.zeros(1)
    call_forward(grab, q, k, v, **options)
    p = got["plan"]
    SHARED["floats"] = p.shared // 4
    out = np.full((1, *p.out_shape), np.nan, np.float32)
    lse = np.full((1, *p.out_shape[:3]), np.nan, np.float32)
    report = cudacheck.check(p.kernel, p.griddim, p.blockdim, q, k, v, *p.args, out, lse)
    try:
        checks.check_attention(out[0], q, k, v, lse=lse[0], **options)
        right = "right"
    except AssertionError as error:
        right = "WRONG " + (str(error).splitlines() or [""])[0][:200]
    verdict = "clean" if report.ok else str(report)
    print(f"{step} {tiling.Br}x{tiling.Bc}/{tiling.threads} tx={tiling.tx} {(B, H, Hk, Nq, Nk, D, Dv)} "
          f"{ {a: b for a, b in options.items() if a != 'alibi_slopes'} }: {verdict} | {right}", flush=True)
    return report.ok and right == "right"


STEPS = ("tiled_rebuilt", "tiled_shuffle", "tiled_reorder", "tiled_aligned", "tiled_vec4")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="*", default=list(STEPS), help=f"chapter 10's steps (default: {' '.join(STEPS)})")
    good = True
    for step in parser.parse_args(argv).steps:
        for numbers in TILINGS:
            for shape, options in CASES:
                good &= check_step(step, replace(cs.STEP_TILING[step], **numbers), *shape, **options)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
