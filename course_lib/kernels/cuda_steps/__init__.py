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
    tiled_vec4.py     the micro-tiles rebuilt around 16-byte shared loads, one switch a step:
                      tiled_rebuilt, tiled_shuffle, tiled_reorder, tiled_aligned, tiled_vec4
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
from .run import (FACTORY, SIMT_STEPS, SPLIT_KV_STEPS, Plan, allow_shared, attention, available, forward, launcher,
                  plan, tiling_for, visit_lists)
from .tiled import make_tiled_kernel
from .tiled_prefetch import make_prefetch_kernel
from .tiled_staged import make_staged_kernel
from .tiled_vec4 import make_vec4_kernel
from .tiling import (CANDIDATES, DECODE_TILING, MAX_SHARED, SIM_TILING, STATIC_SHARED, STEP_TILING, TUNED,
                     Tiling)
from .tuning import DECODE_WAVES, autotune, decode_splits, resources

__all__ = ["CANDIDATES", "DECODE_TILING", "DECODE_WAVES", "FACTORY", "MAX_SHARED", "Plan", "SIM_TILING",
           "SIMT_STEPS", "SPLIT_KV_STEPS", "STATIC_SHARED", "STEP_TILING", "TUNED", "Tiling",
           "allow_shared", "attention", "autotune", "available", "decode_splits", "forward", "launcher",
           "make_merge_kernel", "make_prefetch_kernel", "make_staged_kernel", "make_tiled_kernel",
           "make_vec4_kernel", "on_gpu", "plan", "resources", "tiling_for", "visit_lists"]
