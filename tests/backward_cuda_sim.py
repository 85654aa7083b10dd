"""Run by tests/test_backward_cuda.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (numba's simulator must be
chosen before numba is imported): the CUDA backward on every case through ``course_lib.attention_backward``,
checked against the float64 gradient, and the planted mistakes, one JSON line of verdicts on stdout."""
import contextlib
import io
import json

import numpy as np

from course_lib.bench.cases import BACKWARD_CASES, run_backward_case
from course_lib.kernels import backward_numba_cuda as bk


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
        return run_backward_case(name, seed=1)
    finally:
        bk.plan = real


if __name__ == "__main__":
    results = {}
    with contextlib.redirect_stdout(io.StringIO()):   # the checks print their verdicts; we keep ours
        for name in BACKWARD_CASES:
            results[name] = run_backward_case(name)
        for kind in ("gqa_not_summed", "mask_forgotten"):
            results[f"planted/{kind}"] = planted(kind)
    print(json.dumps(results))
