"""Chapter 10: the CUDA forward kernel, optimised one measured step at a time.

Every step is a real kernel, checked against the float64 reference before it
is timed (``tests/test_cuda_steps.py`` in the simulator, at small awkward
shapes; ``benchmarks/gpu_steps.py`` on the H200, at large ones;
``python -m course_lib.kernels.cuda_steps STEP`` for one step).  Like llm.c's
``attention_forward.cu``, the versions live side by side, each module a diff
on the one before (the table of steps and their speeds is the impl
registry's, ``course_lib.kernels``):

    row, row_exp2     chapter 09's kernel (``flash_numba_cuda.make_kernel``), in base e / base 2
    tiled.py          tiled, tiled_unsigned, tiled_padded: register micro-tiles
    tiled_prefetch.py the same with the next K / V tile loaded a tile ahead
    tiled_vec4.py     the micro-tiles rebuilt around 16-byte shared loads, one kernel a change:
                      tiled_rebuilt, tiled_shuffle, tiled_reorder, tiled_aligned (and tiled_vec4,
                      its larger tiles), from device functions they share
    tiled_staged.py   the same with a whole K / V tile in flight at once (and ``tuned``)
    merge.py          split-KV's merge of the partial (out, lse)

and the host side: ``tiling`` (each step's compile-time shape), ``run`` (plan,
launch, run), ``tuning`` (autotune, decode_splits, resources), ``device`` (the
rules compiled for the GPU, shared by every kernel).  What a block costs a
multiprocessor is ``core.hardware.occupancy``.

These kernels run on a GPU or in numba's simulator (``NUMBA_ENABLE_CUDASIM=1``);
``course_lib.cudacheck`` does not model dynamic shared memory.
"""
from .device import on_gpu
from .merge import make_merge_kernel
from .run import (
                  SIMT_STEPS,
                  SPLIT_KV_STEPS,
                  Plan,
                  allow_shared,
                  attention,
                  available,
                  factory,
                  forward,
                  launcher,
                  plan,
                  tiling_for,
                  visit_lists,
)
from .tiled import make_tiled_kernel
from .tiled_prefetch import make_prefetch_kernel
from .tiled_staged import make_staged_kernel
from .tiled_vec4 import make_aligned_kernel, make_rebuilt_kernel, make_reorder_kernel, make_shuffle_kernel
from .tiling import CANDIDATES, DECODE_TILING, MAX_SHARED, SIM_TILING, STATIC_SHARED, STEP_TILING, TUNED, Tiling
from .tuning import DECODE_WAVES, autotune, decode_splits, resources

__all__ = ["CANDIDATES", "DECODE_TILING", "DECODE_WAVES", "MAX_SHARED", "Plan", "SIM_TILING",
           "SIMT_STEPS", "SPLIT_KV_STEPS", "STATIC_SHARED", "STEP_TILING", "TUNED", "Tiling",
           "allow_shared", "attention", "autotune", "available", "decode_splits", "factory", "forward", "launcher",
           "make_aligned_kernel", "make_merge_kernel", "make_prefetch_kernel", "make_rebuilt_kernel",
           "make_reorder_kernel", "make_shuffle_kernel", "make_staged_kernel", "make_tiled_kernel", "on_gpu", "plan",
           "resources", "tiling_for", "visit_lists"]
