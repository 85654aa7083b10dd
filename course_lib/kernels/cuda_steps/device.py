"""What every step's kernel shares on the device.

- the scalar rules (mask, softcap, ALiBi distance, the online-softmax step in
  base 2, finalize): ``course_lib.core.rules``, as chapter 09's module compiled
  them for the GPU;
- ``SIMULATOR``: True when numba's simulator runs the kernels (it has no warp
  shuffles, takes no shared-memory alignment and checks every array's bounds,
  so the vectorised kernels say a few things differently there);
- ``on_gpu``: whether a real GPU runs them;
- ``tile_slot``: where each of a thread's loads of a K / V tile falls.
"""
from __future__ import annotations

try:
    import numba
    from numba import cuda
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    numba = None

from .. import flash_numba_cuda as ch09

SIMULATOR = numba is not None and bool(numba.config.ENABLE_CUDASIM)

if numba is not None:
    visible, alibi_distance, softcap, max_nan = ch09.visible, ch09.alibi_distance, ch09.softcap, ch09.max_nan
    shift_of, rescale_exp2, finalize = ch09.shift_of, ch09.rescale_exp2, ch09.finalize


def on_gpu() -> bool:
    return ch09.on_gpu()


def tile_slot(NT, Bc, W):
    """Where the u-th of thread t's loads falls when NT threads load a Bc x W tile: (row c, column,
    whether it is inside the tile).  When the threads cover whole rows (NT % W == 0), thread t
    always loads column ``col`` = t % W of rows ``row0`` + (NT // W) u, with ``row0`` = t // W (both
    computed once, before the loops); otherwise it walks the flat tile."""
    whole_rows, rows = NT % W == 0, max(1, NT // W)

    @cuda.jit(device=True)
    def slot(u, t, row0, col):
        if whole_rows:
            c = row0 + u * rows
            return c, col, Bc % rows == 0 or c < Bc
        x = t + u * NT
        return x // W, x % W, x < Bc * W
    return slot
