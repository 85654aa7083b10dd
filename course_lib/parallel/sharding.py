"""Which positions of the sequence each rank holds, and how much causal work that gives it.

A rank's shard is a list of *pieces*; a piece is an arithmetic run of
positions ``start, start + stride, ...`` (``length`` of them).  Three ways to
deal N positions to W ranks:

    contiguous  rank r holds one block, [r N/W, (r+1) N/W)
    zigzag      N is cut into 2W chunks; rank r holds chunk r and chunk 2W-1-r
                (one early, one late), so every rank owns as much of the
                causal triangle as every other
    striped     rank r holds positions r, r + W, r + 2W, ... (one piece, stride W)

Under a causal mask, contiguous sharding is unfair: the last rank's queries
see every key, the first rank's see only their own block, and a ring waits for
its slowest rank at every step.  Zigzag and striped even the work out.

For two pieces of one stride S, query i of the Q piece stands at qs + S i and
key j of the K piece at ks + S j, so ``ks + S j <= qs + S i`` is
``j <= i + floor((qs - ks) / S)``: a causal mask on the local indices, moved
off the diagonal by ``diagonal(q_piece, k_piece)``.  ``course_lib.attention``
only knows offsets Nk - Nq (bottom-right) and 0 (top-left), so
``shard_attention.local_partial`` turns any diagonal into a call it can make.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEMES = ("contiguous", "zigzag", "striped")


@dataclass(frozen=True)
class Piece:
    """Positions start, start + stride, ..., start + (length - 1) stride."""
    start: int
    stride: int
    length: int

    def positions(self) -> np.ndarray:
        return self.start + self.stride * np.arange(self.length)


def layout(scheme: str, seqlen: int, world_size: int) -> list:
    """The pieces of every rank: a list (one entry per rank) of lists of ``Piece``."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    parts = 2 * world_size if scheme == "zigzag" else world_size
    if seqlen % parts:
        raise ValueError(f"{scheme} sharding over {world_size} ranks needs seqlen divisible by {parts}, "
                         f"got {seqlen}")
    n = seqlen // world_size
    if scheme == "contiguous":
        return [[Piece(r * n, 1, n)] for r in range(world_size)]
    if scheme == "striped":
        return [[Piece(r, world_size, n)] for r in range(world_size)]
    c = n // 2
    return [[Piece(r * c, 1, c), Piece((2 * world_size - 1 - r) * c, 1, c)] for r in range(world_size)]


def positions(pieces) -> np.ndarray:
    """The global positions a rank holds, in its local order (its pieces one after another)."""
    return np.concatenate([p.positions() for p in pieces])


def diagonal(q_piece: Piece, k_piece: Piece) -> int:
    """d such that local query i sees local key j iff j <= i + d (pieces of one stride)."""
    if q_piece.stride != k_piece.stride:
        raise ValueError(f"pieces of different strides ({q_piece.stride}, {k_piece.stride}) have no one diagonal")
    return (q_piece.start - k_piece.start) // q_piece.stride


def visible_pairs(q_piece: Piece, k_piece: Piece, causal: bool) -> int:
    """How many (query, key) pairs of the two pieces the mask lets through."""
    nq, nk = q_piece.length, k_piece.length
    if not causal:
        return nq * nk
    d = diagonal(q_piece, k_piece)
    seen = np.clip(np.arange(nq) + d + 1, 0, nk)  # keys 0..i+d of each query row
    return int(seen.sum())


def ring_source(rank: int, step: int, world_size: int) -> int:
    """Whose K/V shard rank ``rank`` holds at ring step ``step`` (shards move to rank + 1)."""
    return (rank - step) % world_size


def step_work(scheme: str, seqlen: int, world_size: int, causal: bool) -> np.ndarray:
    """Visible pairs each rank computes at each ring step: (steps, ranks), per (batch, head)."""
    pieces = layout(scheme, seqlen, world_size)
    work = np.zeros((world_size, world_size), dtype=np.int64)
    for step in range(world_size):
        for rank in range(world_size):
            src = ring_source(rank, step, world_size)
            work[step, rank] = sum(visible_pairs(qp, kp, causal) for qp in pieces[rank] for kp in pieces[src])
    return work


def imbalance(work) -> float:
    """Time of a ring that waits for its slowest rank each step, over a perfectly even one.

    sum over steps of max over ranks, divided by sum over steps of the mean:
    1.0 means no rank ever idles.
    """
    work = np.asarray(work, dtype=float)
    return float(work.max(axis=1).sum() / work.mean(axis=1).sum())
