"""The one FLOP convention every speed in the course is quoted in: the pairs a mask lets through.

Every benchmark, record and chapter that turns a time into FLOP/s counts the
work with ``attention_flops``, so a causal or windowed kernel is credited with
the work its mask leaves, not with the work of the full square.
"""
from __future__ import annotations

import numpy as np

from .masks import MaskSpec


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool = False, causal_align: str = "bottom_right",
                  window_size=(-1, -1)) -> int:
    """How many (query, key) pairs the mask lets through: the work attention must do (``MaskSpec.key_bounds``)."""
    mask = MaskSpec(int(seqlen_q), int(seqlen_k), bool(causal), causal_align, tuple(window_size))
    lo, hi = mask.key_bounds(np.arange(mask.seqlen_q))
    return int(np.maximum(np.minimum(hi, mask.seqlen_k - 1) - np.maximum(lo, 0) + 1, 0).sum())


def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal=False, *, causal_align="bottom_right",
                    window_size=(-1, -1), head_dim_v=None) -> float:
    """The FLOP count speeds are quoted in: 2 (D + Dv) per visible (query, key) pair, per batch and head.

    Two matmuls, 2 FLOPs a multiply-add: the convention of the FlashAttention
    papers and Triton's tutorial, 4 B H Nq Nk D without a mask.  A mask counts
    only the pairs it lets through, so a kernel that skips masked tiles is
    credited with the work the mask leaves: about half for causal at Nq = Nk
    (N (N + 1) / 2 pairs), and every key for decode (Nq = 1, bottom-right).
    """
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    pairs = visible_pairs(seqlen_q, seqlen_k, causal, causal_align, window_size)
    return float(2 * batch * heads * pairs * (head_dim + head_dim_v))
