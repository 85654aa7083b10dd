"""Split-KV's last step: ``merge_kernel`` combines the partial (out, lse) of the splits.

With ``splits > 1`` each query tile's list of key tiles is cut into that many
pieces, one block each, each writing a partial (out, lse); one thread per
(b, h, i) then merges them with chapter 04's logsumexp rule.
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
        """part_out (S, B, H, Nq, Dv), part_lse (S, B, H, Nq) -> out (B, H, Nq, Dv), lse (B, H, Nq)."""
        S, B, H, Nq, Dv = part_out.shape
        g = cuda.grid(1)
        if g >= B * H * Nq:
            return
        i = g % Nq
        h = (g // Nq) % H
        b = g // (Nq * H)
        top = float32(-math.inf)
        for z in range(S):
            top = max_nan(top, part_lse[z, b, h, i])
        shift = float32(shift_of(top))
        total = float32(0.0)
        for z in range(S):
            total += math.exp(part_lse[z, b, h, i] - shift)
        row_lse, inv = finalize(shift, total)   # lse = top + log(sum of e^(lse_z - top))
        for e in range(Dv):
            acc = float32(0.0)
            for z in range(S):
                w = math.exp(part_lse[z, b, h, i] - shift)
                if w > 0:                         # a split that saw nothing adds nothing (not 0 * NaN)
                    acc += w * part_out[z, b, h, i, e]
            out[b, h, i, e] = acc * float32(inv)
        lse[b, h, i] = row_lse

    _KERNELS["merge"] = merge_kernel
    return merge_kernel
