"""Where FlashAttention's kernels answer differently from this course, and by how much.

The course follows FlashAttention 2.1+'s semantics (``course_lib.api``), but a
learner who compares numbers with a real kernel meets four conventions that
differ.  None changes an output that both define; each changes what you read
if you compare the wrong thing.

- ALiBi: the course adds -slope * |i + Nk - Nq - j|.  FA2's kernel, when the
  mask is causal, adds +slope * j instead: the two differ by -slope * (i + Nk
  - Nq) on every key a row sees, a constant per row.  Softmax does not see a
  constant, so outputs are identical; lse is not: FA2's is larger by
  slope * (i + Nk - Nq) (``fa2_causal_alibi_lse``).
- A row that sees no key: output 0 everywhere, but lse = -inf here and in
  FA3, +inf in FA2's kernel, 0 in PyTorch's CPU flash kernel
  (``FULLY_MASKED_LSE``).
- Windows: FA2's C++ entry point rewrites a window side >= seqlen_k to -1
  (unbounded).  That changes nothing when Nq <= Nk, but when Nq > Nk the
  right side seen by early rows (bottom-right alignment puts them before key
  0) grows (``fa2_window``).
- Head dims: FA2 (v2.8) compiles kernels for head dims 32, 64, 96, 128, 192
  and 256 and runs a smaller one in the next of them (``fa2_head_dim``), so a
  D = 80 head costs what D = 96 costs, and D = 160 what D = 192 costs.
"""
from __future__ import annotations

import math

import numpy as np

from .masks import diagonal_offset

FA2_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # HEADDIM_SWITCH in FA2's static_switch.h

FULLY_MASKED_LSE = {  # the lse of a row that sees no key, impl by impl (every one gives output 0)
    "course_lib": -math.inf,
    "FlashAttention-3": -math.inf,
    "FlashAttention-2 kernel": math.inf,
    "PyTorch CPU flash kernel": 0.0,
}


def fa2_causal_alibi_lse(lse, alibi_slopes, seqlen_q: int, seqlen_k: int):
    """The lse FA2's kernel returns for causal ALiBi, from the course's: lse + slope * (i + Nk - Nq).

    lse: (B, H, Nq) from ``course_lib.attention(..., causal=True, alibi_slopes=...,
    return_lse=True)``; alibi_slopes: (H,) or (B, H).  Rows that see no key
    keep their lse.
    """
    lse = np.asarray(lse, dtype=np.float64)
    slopes = np.broadcast_to(np.asarray(alibi_slopes, dtype=np.float64), lse.shape[:2])
    shift = np.arange(seqlen_q) + diagonal_offset(seqlen_q, seqlen_k)  # i + Nk - Nq
    return np.where(np.isfinite(lse), lse + slopes[..., None] * shift, lse)


def fa2_window(window_size, seqlen_q: int, seqlen_k: int) -> tuple:
    """The window FA2's C++ entry point passes on: each side >= seqlen_k becomes -1 (unbounded).

    Equal to the course's meaning when Nq <= Nk; when Nq > Nk a right side
    of Nk or more no longer stops the early rows (they sit before key 0).
    """
    if seqlen_q < 1 or seqlen_k < 1:
        raise ValueError(f"seqlen_q and seqlen_k must be >= 1, got {seqlen_q} and {seqlen_k}")
    return tuple(-1 if w >= seqlen_k else int(w) for w in window_size)


def fa2_head_dim(head_dim: int) -> int:
    """The head dim whose compiled FA2 kernel runs a head of ``head_dim`` (the next in FA2_HEAD_DIMS)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    for d in FA2_HEAD_DIMS:
        if head_dim <= d:
            return d
    raise ValueError(f"head_dim must be at most {FA2_HEAD_DIMS[-1]} for FlashAttention-2, got {head_dim}")
