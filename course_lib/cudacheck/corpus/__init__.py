"""Small CUDA kernels with one planted bug each, beside their fixed twins: cudacheck's test bench.

Each ``Case`` holds a kernel with a bug a learner really makes (a missing
barrier, a read past the tail, an early return before ``syncthreads``...), the
same kernel fixed, a launch and the numpy answer the fixed twin must give.
``basics`` holds the bugs of a first kernel; ``gpu_model`` those a simulator
only sees when it models the GPU exactly (one shared array per block, arguments
that alias, the GPU's arithmetic); ``attention``, ``tiles`` and ``reductions``
learner-style kernels cudacheck was not written against (tiled attention pieces,
matmul and staging tiles, int8, reductions, scans, warp operations, fences).  ``tests/test_cudacheck.py`` holds cudacheck
to them on every CI run; ``benchmarks/sanitizer_corpus.py`` runs the very same
kernels on a GPU under NVIDIA's ``compute-sanitizer`` and records what each
tool flagged beside what cudacheck flagged (``sanitizer_record`` reads that record).

    from course_lib import cudacheck
    from course_lib.cudacheck.corpus import CASES
    for case in CASES:
        print(case.name, cudacheck.check(case.buggy, case.griddim, case.blockdim, *case.args()).kinds)
"""
from __future__ import annotations

from . import attention, basics, gpu_model, reductions, tiles
from .case import Case

CASES = basics.CASES + gpu_model.CASES + attention.CASES + tiles.CASES + reductions.CASES


def case(name) -> Case:
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(f"no corpus case {name!r}; the cases are {', '.join(c.name for c in CASES)}")
