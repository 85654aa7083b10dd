"""Which keys each query may see, and the position bias ALiBi adds.

Every impl in the course (reference, naive, the tiled kernels) asks this module
and nothing else, so a mask means the same thing everywhere.

Positions are aligned on the diagonal ``offset``: query ``i`` is treated as if
it stood at key position ``i + offset``.  FlashAttention 2.1+ aligns to the
bottom-right corner (``offset = Nk - Nq``: the last query sees the last key);
PyTorch's ``is_causal`` aligns to the top-left (``offset = 0``).  The two agree
only when ``Nq == Nk``.

A window ``(left, right)`` lets query ``i`` see keys ``j`` with
``i + offset - left <= j <= i + offset + right``; ``-1`` means unbounded on that
side.  Causal is the window ``(-1, 0)`` (and causal clips ``right`` to 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALIGNMENTS = ("bottom_right", "top_left")
FULL, PARTIAL, EMPTY = "full", "partial", "empty"


def tile_ranges(n: int, block: int) -> list:
    """(start, stop) of each tile of ``block`` along an axis of length n; the last may be short (a tail)."""
    return [(start, min(start + block, n)) for start in range(0, n, block)]


def diagonal_offset(seqlen_q: int, seqlen_k: int, causal_align: str = "bottom_right") -> int:
    """Key position that query 0 is aligned with."""
    return seqlen_k - seqlen_q if causal_align == "bottom_right" else 0


@dataclass(frozen=True)
class MaskSpec:
    """The mask of one (Nq, Nk) attention problem, for one sequence."""

    seqlen_q: int
    seqlen_k: int
    causal: bool = False
    causal_align: str = "bottom_right"
    window_size: tuple = (-1, -1)

    @property
    def offset(self) -> int:
        return diagonal_offset(self.seqlen_q, self.seqlen_k, self.causal_align)

    @property
    def window(self) -> tuple:
        """(left, right) after causal is folded in; -1 is unbounded."""
        left, right = self.window_size
        if self.causal:
            right = 0
        return int(left), int(right)

    @property
    def is_trivial(self) -> bool:
        """True when every query sees every key: no elementwise mask at all."""
        return self.window == (-1, -1)

    # -- rows ---------------------------------------------------------------
    def key_bounds(self, rows):
        """First and last visible key (inclusive, unclipped) of each query row."""
        rows = np.asarray(rows, dtype=np.int64)
        left, right = self.window
        centre = rows + self.offset
        lo = centre - left if left >= 0 else np.full_like(rows, np.iinfo(np.int64).min // 4)
        hi = centre + right if right >= 0 else np.full_like(rows, np.iinfo(np.int64).max // 4)
        return lo, hi

    def visible(self, rows, cols) -> np.ndarray:
        """Boolean (len(rows), len(cols)): may query row i see key j?"""
        lo, hi = self.key_bounds(rows)
        cols = np.asarray(cols, dtype=np.int64)
        return (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])

    # -- tiles --------------------------------------------------------------
    def tile_kind(self, q_start: int, q_stop: int, k_start: int, k_stop: int) -> str:
        """Classify the tile rows [q_start, q_stop) x keys [k_start, k_stop).

        ``empty``: no query in the tile sees any key in it (skip the tile);
        ``full``: every query sees every key (no elementwise mask needed);
        ``partial``: anything else.  Both key bounds grow with the row, so the
        first and last rows of the tile decide.
        """
        if q_stop <= q_start or k_stop <= k_start:
            return EMPTY
        lo, hi = self.key_bounds([q_start, q_stop - 1])
        if hi[1] < k_start or lo[0] > k_stop - 1:
            return EMPTY
        if lo[1] <= k_start and hi[0] >= k_stop - 1:
            return FULL
        return PARTIAL

    def tile_map(self, block_q: int, block_k: int) -> np.ndarray:
        """(Tr, Tc) array of tile kinds for tiles of block_q x block_k."""
        rows, cols = tile_ranges(self.seqlen_q, block_q), tile_ranges(self.seqlen_k, block_k)
        kinds = np.empty((len(rows), len(cols)), dtype=object)
        for i, (q_start, q_stop) in enumerate(rows):
            for j, (k_start, k_stop) in enumerate(cols):
                kinds[i, j] = self.tile_kind(q_start, q_stop, k_start, k_stop)
        return kinds

    # -- ALiBi --------------------------------------------------------------
    def alibi_bias(self, slope: float, rows, cols) -> np.ndarray:
        """-slope * |i + offset - j| for the given rows and keys, float64."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        distance = np.abs(rows[:, None] + self.offset - cols[None, :])
        return -float(slope) * distance.astype(np.float64)


def apply_softcap(scores: np.ndarray, softcap: float) -> np.ndarray:
    """softcap * tanh(s / softcap); softcap == 0 leaves the scores alone."""
    if softcap > 0:
        return softcap * np.tanh(scores / softcap)
    return scores
