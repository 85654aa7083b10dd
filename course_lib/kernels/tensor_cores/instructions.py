"""The instructions a tensor-core kernel calls, for where it runs, and how its pieces are inlined.

- ``ops``: ``mma``'s inline PTX on a GPU; ``sim``'s emulation of the same instructions in numba's
  simulator (``NUMBA_ENABLE_CUDASIM=1``), which cannot run inline PTX.  A kernel calls ``ops.mma_f16``,
  ``ops.ldmatrix_x4``, ``ops.cp_async16``, ``ops.shfl_xor_sync``, ... and is the same code in both.
- ``inlined()``: the decorator of a device function written out where it is called (``forceinline`` on
  a GPU: a fragment indexed by a constant stays in registers; the simulator takes no such option).
"""
from __future__ import annotations

from numba import cuda

from ..cuda_steps.device import SIMULATOR
from . import mma, sim

ops = sim if SIMULATOR else mma


def inlined():
    """cuda.jit for a device function, inlined on the GPU (the simulator takes no ``forceinline``)."""
    return cuda.jit(device=True) if SIMULATOR else cuda.jit(device=True, forceinline=True)
