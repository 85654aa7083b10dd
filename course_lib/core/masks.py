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

The rules themselves (may query i see key j, the kind of a tile, the ALiBi
distance, softcap) are the scalar functions of ``course_lib.core.rules``, which the
compiled kernels call too; this module gives them numpy's shapes and names:
``MaskSpec.tile_kind`` asks ``rules.tile_kind``, and the vectorised
``visible``, ``alibi_bias`` and ``alibi_rebased_distance`` are held equal to
``rules.visible``, ``rules.alibi_distance`` and ``rules.alibi_rebased_distance``
by property tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import rules

ALIGNMENTS = ("bottom_right", "top_left")
# The tile kinds by name (``rules`` numbers them for compiled code).
FULL, PARTIAL, EMPTY = (rules.KIND_NAMES[kind] for kind in (rules.FULL, rules.PARTIAL, rules.EMPTY))


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
        first and last rows of the tile decide (``rules.tile_kind``).
        """
        return rules.KIND_NAMES[self.tile_code(q_start, q_stop, k_start, k_stop)]

    def tile_code(self, q_start: int, q_stop: int, k_start: int, k_stop: int) -> int:
        """``tile_kind`` as the small int a compiled kernel branches on (``rules.EMPTY`` ...)."""
        left, right = self.window
        return rules.tile_kind(int(q_start), int(q_stop), int(k_start), int(k_stop), self.offset, left, right)

    def tile_map(self, block_q: int, block_k: int) -> np.ndarray:
        """(Tr, Tc) array of tile kinds (names) for tiles of block_q x block_k."""
        names = np.array([rules.KIND_NAMES[code] for code in sorted(rules.KIND_NAMES)], dtype=object)
        return names[self.tile_codes(block_q, block_k)]

    def tile_codes(self, block_q: int, block_k: int) -> np.ndarray:
        """(Tr, Tc) int8 array of ``rules`` tile kinds: the plan a compiled kernel
        is launched with, so that which tiles to skip is decided once, here."""
        rows, cols = tile_ranges(self.seqlen_q, block_q), tile_ranges(self.seqlen_k, block_k)
        codes = np.empty((len(rows), len(cols)), dtype=np.int8)
        for i, (q_start, q_stop) in enumerate(rows):
            for j, (k_start, k_stop) in enumerate(cols):
                codes[i, j] = self.tile_code(q_start, q_stop, k_start, k_stop)
        return codes

    # -- ALiBi --------------------------------------------------------------
    def alibi_bias(self, slope: float, rows, cols) -> np.ndarray:
        """-slope * |i + offset - j| for the given rows and keys, float64."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        distance = np.abs(rows[:, None] + self.offset - cols[None, :])
        return -float(slope) * distance.astype(np.float64)

    def alibi_anchor(self, rows) -> np.ndarray:
        """Each row's ``rules.alibi_anchor``: its diagonal moved into the keys [0, seqlen_k), int64."""
        rows = np.asarray(rows, dtype=np.int64)
        return np.clip(rows + self.offset, 0, max(self.seqlen_k - 1, 0))

    def alibi_rebased_distance(self, rows, cols) -> np.ndarray:
        """``rules.alibi_rebased_distance`` for the given rows and keys, int64 (len(rows), len(cols))."""
        cols = np.asarray(cols, dtype=np.int64)
        return np.abs(self.alibi_anchor(rows)[:, None] - cols[None, :])

    def alibi_row_distance(self, rows) -> np.ndarray:
        """What rebasing takes off each row's distances, int64 (len(rows),): |i + offset - anchor|.  The
        rebased scores of row i are its scores plus slope times this, and so is their lse."""
        rows = np.asarray(rows, dtype=np.int64)
        return np.abs(rows + self.offset - self.alibi_anchor(rows))


def apply_softcap(scores: np.ndarray, softcap: float) -> np.ndarray:
    """softcap * tanh(s / softcap); softcap == 0 leaves the scores alone."""
    if softcap > 0:
        return softcap * np.tanh(scores / softcap)
    return scores
