"""Split-KV's last step: ``merge_kernel`` combines the partial (out, lse) of the splits.

With ``splits > 1`` each query tile's list of key tiles is cut into that many
pieces, one block each, each writing a partial (out, lse); one thread per
output element (b, h, i, e) then merges them with chapter 04's logsumexp rule.
A thread a row instead (B H Nq of them, 128 at decode's B = 8, H = 16: one
block on one SM, each thread walking Dv x S strided loads) made the merge the
cost of a split: at 64 pieces it took longer than the tensor-core kernel.
"""
from __future__ import annotations

import math

try:
    from numba import cuda, float32
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    cuda = None

from .device import finalize, max_nan, shift_of

_KERNELS = {}


def make_merge_kernel():
    """Split-KV's last step: one thread per (b, h, i) merges the S partials with the lse rule."""
    if "merge" in _KERNELS:
        return _KERNELS["merge"]

    @cuda.jit
    def merge_kernel(part_out, part_lse, out, lse):
        """part_out (S, B, H, Nq, Dv), part_lse (S, B, H, Nq) -> out (B, H, Nq, Dv), lse (B, H, Nq).

        Thread g merges element e = g % Dv of row g // Dv: neighbouring threads read neighbouring words
        of each part; each works out its row's weights itself (S exponentials, in the same order for
        every e, so the row's elements and its lse agree bit for bit)."""
        S, B, H, Nq, Dv = part_out.shape
        g = cuda.grid(1)
        if g >= B * H * Nq * Dv:
            return
        e = g % Dv
        row = g // Dv
        i = row % Nq
        h = (row // Nq) % H
        b = row // (Nq * H)
        top = float32(-math.inf)
        for z in range(S):
            top = max_nan(top, part_lse[z, b, h, i])
        shift = float32(shift_of(top))
        total = float32(0.0)
        acc = float32(0.0)
        for z in range(S):
            w = math.exp(part_lse[z, b, h, i] - shift)
            total += w
            if w > 0:                         # a split that saw nothing adds nothing (not 0 * NaN)
                acc += w * part_out[z, b, h, i, e]
        row_lse, inv = finalize(shift, total)   # lse = top + log(sum of e^(lse_z - top))
        out[b, h, i, e] = acc * float32(inv)
        if e == 0:
            lse[b, h, i] = row_lse

    _KERNELS["merge"] = merge_kernel
    return merge_kernel
