"""Split-KV's last step: ``merge_kernel`` combines the partial (out, lse) of the splits.

With ``splits > 1`` each query tile's list of key tiles is cut into that many
pieces, one block each, each writing a partial (out, lse); the merge then
combines them with chapter 04's logsumexp rule, for each output element
(b, h, i, e).  A thread a row (B H Nq of them, 128 at decode's B = 8, H = 16: one
block on one SM, each thread walking Dv x S strided loads) made the merge the
cost of a split: at 64 pieces it took longer than the tensor-core kernel.  A
thread an element still walked all S pieces one after another: 8,192 threads at
decode's D = 64, each with 2 S dependent steps, 42 us of a 105 us decode at 128
pieces (ncu, H100, notebooks/records/gpu_decode.jsonl).  So ``PIECES`` threads
share an element, each taking every ``PIECES``-th piece, and their sums meet
by warp shuffles.
"""
from __future__ import annotations

import math

try:
    from numba import cuda, float32
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    cuda = None

from .device import SIMULATOR, finalize, max_nan, shift_of

_KERNELS = {}


PIECES = 4       # threads an output element: a warp is 8 neighbouring elements x 4 slices of the pieces
ALL_LANES = 0xFFFFFFFF
# The simulator has no warp shuffles: there the first lane of each element walks every piece itself.
FIRST, STEP = (0, 1) if SIMULATOR else (None, PIECES)


def merge_threads(elements):
    """Threads the merge takes for ``elements`` outputs: ``PIECES`` each, in whole warps."""
    return -(-elements // 8) * 32


def make_merge_kernel():
    """Split-KV's last step: ``PIECES`` threads per output element merge the S partials with the lse rule."""
    if "merge" in _KERNELS:
        return _KERNELS["merge"]

    @cuda.jit
    def merge_kernel(part_out, part_lse, out, lse):
        """part_out (S, B, H, Nq, Dv), part_lse (S, B, H, Nq) -> out (B, H, Nq, Dv), lse (B, H, Nq).

        Lane 8 p + x of warp w merges element 8 w + x (row (8 w + x) // Dv) over pieces p, p + 4, ...:
        neighbouring lanes read neighbouring words of each part.  Each lane works out its share of its
        row's weights itself, and the four shares meet by shuffles in the same order for every element, so
        a row's elements and its lse agree bit for bit.  Lanes past the last element compute on a clamped
        one and write nothing: every lane takes part in the shuffles.  (In the simulator, which has no
        shuffles, lane 8 p + x walks every piece and only p = 0's result is written.)"""
        S, B, H, Nq, Dv = part_out.shape
        g = cuda.grid(1)
        lane = g % 32
        p = lane // 8
        element = (g // 32) * 8 + lane % 8
        last = B * H * Nq * Dv - 1
        mine = element <= last
        element = min(element, last)
        e = element % Dv
        row = element // Dv
        i = row % Nq
        h = (row // Nq) % H
        b = row // (Nq * H)
        first = p if FIRST is None else FIRST
        top = float32(-math.inf)
        for z in range(first, S, STEP):
            top = max_nan(top, part_lse[z, b, h, i])
        if not SIMULATOR:
            top = max_nan(top, cuda.shfl_xor_sync(ALL_LANES, top, 8))
            top = max_nan(top, cuda.shfl_xor_sync(ALL_LANES, top, 16))
        shift = float32(shift_of(top))
        total = float32(0.0)
        acc = float32(0.0)
        for z in range(first, S, STEP):
            w = math.exp(part_lse[z, b, h, i] - shift)
            total += w
            if w > 0:                         # a split that saw nothing adds nothing (not 0 * NaN)
                acc += w * part_out[z, b, h, i, e]
        if not SIMULATOR:
            total += cuda.shfl_xor_sync(ALL_LANES, total, 8)
            total += cuda.shfl_xor_sync(ALL_LANES, total, 16)
            acc += cuda.shfl_xor_sync(ALL_LANES, acc, 8)
            acc += cuda.shfl_xor_sync(ALL_LANES, acc, 16)
        row_lse, inv = finalize(shift, total)   # lse = top + log(sum of e^(lse_z - top))
        if mine and p == 0:
            out[b, h, i, e] = acc * float32(inv)
            if e == 0:
                lse[b, h, i] = row_lse

    _KERNELS["merge"] = merge_kernel
    return merge_kernel
