"""Backward impl ``flash_numpy``: FlashAttention's tiled backward, in numpy, with P recomputed.

Chapter 12's kernel.  The forward kept only O and lse (O(N) per head); the
backward recomputes each tile of S from Q and K and turns it into P with the
stored lse, ``Pij = exp(Sij - lse_i)``, so the N x N matrix P is never stored
(``core.reference_backward`` has the math and the tile functions).  Names are
the paper's (Tr, Tc, Br, Bc, Qi, Kj, Vj, dOi, dQi, dKj, dVj, Di).

Two loop orders, both here so that their traffic can be compared:

- ``fa2`` (FlashAttention-2, Algorithm 2 of the paper): a first pass over the
  query tiles computes D = rowsum(dO * O) once and stores it (4 bytes a row);
  then the outer loop runs over key / value tiles j and holds Kj, Vj, dKj and
  dVj on chip, the inner loop over query tiles i loads Qi, dOi, lse_i, Di,
  recomputes Pij, adds Pij^T dOi to dVj and scale dSij^T Qi to dKj, and adds
  scale dSij Kj into dQi in HBM (read, add, write: the only read-modify-write,
  in float32, as FA2's ``dq_accum``; a last pass rounds it to q's dtype).
- ``fa1`` (FlashAttention-1, Algorithm 4): the same outer / inner loops, but no
  first pass: every inner step also loads Oi and computes Di again, so O is
  read Tc times instead of once.

The work of every (batch, head) pair runs at once (the tiles' leading axes).
With GQA / MQA each query head's dKj, dVj is written to a per-query-head
buffer and the heads of a group are summed at the end (a GPU kernel would
accumulate them; the sum is the same).  Tile skipping is the forward's
(``MaskSpec.tile_kind``): an empty tile is never loaded, only partial tiles
are masked element by element.

Every load and store goes through a ``flash_numpy.Memory``, so ``TileStats``
counts the bytes per tensor (the counted backward of ``course_lib.backward``
reads them).  Precision is ``core.rules``': tiles in the input dtype, every
matmul accumulating in float32 (float64 for float64 input), P and dS rounded to
the input dtype before their matmuls at float16 / bfloat16.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from ..core import rules
from ..core.backward_options import call_backward
from ..core.masks import EMPTY, FULL, tile_ranges
from ..core.reference import kv_head_index
from ..core.reference_backward import delta, sum_groups, tile_dscores, tile_probabilities
from .flash_numpy import Memory, TileStats
from .launch import DEFAULT_TILES, tile_sizes

LOOP_ORDERS = ("fa2", "fa1")


def _rounded(x, round_dtype):
    return x if round_dtype is None else x.astype(round_dtype).astype(x.dtype)


def _count(stats, Qi, Kj, Vj):
    """Recompute S (2 d) + dV (2 dv) + dP (2 dv) + dQ (2 d) + dK (2 d) FLOPs per pair, one exp."""
    bh, rows, d = int(np.prod(Qi.shape[:-2])), Qi.shape[-2], Qi.shape[-1]
    cols, dv = Kj.shape[-2], Vj.shape[-1]
    stats.computed += 1
    stats.flops += 2 * bh * rows * cols * (3 * d + 2 * dv)
    stats.exps += bh * rows * cols


def flash_backward(q, k, v, out, lse, dout, opts, mask, loop_order="fa2", stats=None, *, mem=None):
    """The tiled backward for validated dense inputs: (dq, dk, dv) in q's dtype."""
    if loop_order not in LOOP_ORDERS:
        raise ValueError(f"loop_order must be one of {LOOP_ORDERS}, got {loop_order!r}")
    Br, Bc = tile_sizes(opts, *DEFAULT_TILES["flash_numpy"])
    stats = TileStats() if stats is None else stats
    mem = Memory(stats) if mem is None else mem
    B, H, Nq, D = q.shape
    Hk, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    acc, p_dtype = rules.acc_dtype(q.dtype), rules.p_round_dtype(q.dtype)
    scale = acc.type(opts.softmax_scale)
    kv = kv_head_index(H, Hk)
    row_tiles, col_tiles = tile_ranges(Nq, Br), tile_ranges(Nk, Bc)

    Dsum = None
    if loop_order == "fa2":                                          # pass 1: D_i = rowsum(dO_i * O_i), once
        Dsum = np.empty((B, H, Nq), dtype=acc)
        for r0, r1 in row_tiles:
            rows = np.s_[:, :, r0:r1]
            mem.store("D", Dsum, rows, delta(mem.load("dO", dout, rows), mem.load("O", out, rows), acc))
    dQacc = np.empty((B, H, Nq, D), dtype=acc)                       # dQ accumulates in HBM, float32
    mem.store("dQ", dQacc, np.s_[:, :, :], 0)
    grad_dtype = q.dtype if Hk == H else acc                         # GQA: per query head, summed below
    dK = np.empty((B, H, Nk, D), dtype=grad_dtype)
    dV = np.empty((B, H, Nk, Dv), dtype=grad_dtype)

    for c0, c1 in col_tiles:                                         # outer: the Tc key / value tiles
        kinds = [mask.tile_kind(r0, r1, c0, c1) for r0, r1 in row_tiles]
        if all(kind == EMPTY for kind in kinds):                     # no query sees these keys: dKj = dVj = 0
            stats.skipped += len(kinds)
            mem.store("dK", dK, np.s_[:, :, c0:c1], 0)
            mem.store("dV", dV, np.s_[:, :, c0:c1], 0)
            continue
        cols = np.arange(c0, c1)
        Kj = mem.hold("K tile", mem.load("K", k, np.s_[:, kv, c0:c1]))     # (B, H, Bc, D)
        Vj = mem.hold("V tile", mem.load("V", v, np.s_[:, kv, c0:c1]))     # (B, H, Bc, Dv)
        dKj = mem.hold("dK accumulator", np.zeros((B, H, c1 - c0, D), dtype=acc))   # on chip throughout
        dVj = mem.hold("dV accumulator", np.zeros((B, H, c1 - c0, Dv), dtype=acc))
        for (r0, r1), kind in zip(row_tiles, kinds):                 # inner: the Tr query tiles
            if kind == EMPTY:
                stats.skipped += 1
                continue
            rows, ids = np.s_[:, :, r0:r1], np.arange(r0, r1)
            Qi = mem.hold("Q tile", mem.load("Q", q, rows))
            dOi = mem.hold("dO tile", mem.load("dO", dout, rows))
            lse_i = mem.hold("lse tile", mem.load("lse", lse, rows))
            if Dsum is None:                                         # FA1: D_i again, from O_i, every step
                Di = mem.hold("D tile", delta(dOi, mem.load("O", out, rows), acc))
            else:
                Di = mem.hold("D tile", mem.load("D", Dsum, rows))
            Pij, slope = tile_probabilities(Qi, Kj, lse_i, opts, mask, ids, cols, acc, masked=kind != FULL)
            mem.hold("S / P tile", Pij)
            dVj += np.matmul(np.swapaxes(_rounded(Pij, p_dtype), -1, -2), dOi.astype(acc))
            dPij = mem.hold("dP / dS tile", np.matmul(dOi.astype(acc), np.swapaxes(Vj.astype(acc), -1, -2)))
            dSij = _rounded(tile_dscores(Pij, dPij, Di, slope), p_dtype)
            dQi = mem.load("dQ", dQacc, rows)                       # read, add, write back
            mem.store("dQ", dQacc, rows, dQi + scale * np.matmul(dSij, Kj.astype(acc)))
            dKj += scale * np.matmul(np.swapaxes(dSij, -1, -2), Qi.astype(acc))
            _count(stats, Qi, Kj, Vj)
            mem.free("Q tile", "dO tile", "lse tile", "D tile", "S / P tile", "dP / dS tile")
        mem.store("dK", dK, np.s_[:, :, c0:c1], dKj)                 # dKj, dVj written once
        mem.store("dV", dV, np.s_[:, :, c0:c1], dVj)
        mem.free("K tile", "V tile", "dK accumulator", "dV accumulator")

    dq = np.empty(q.shape, dtype=q.dtype)                            # a last pass: dQ in q's dtype
    for r0, r1 in row_tiles:
        rows = np.s_[:, :, r0:r1]
        mem.store("dQ out", dq, rows, mem.load("dQ", dQacc, rows))
    if Hk == H:
        return dq, dK, dV
    return dq, sum_groups(dK, Hk).astype(q.dtype), sum_groups(dV, Hk).astype(q.dtype)


def attention_backward(q, k, v, out, lse, dout, opts, mask):
    """Backward impl ``flash_numpy``: FA2's order (``flash_numpy_fa1``: ``loop_order="fa1"``)."""
    return flash_backward(q, k, v, out, lse, dout, opts, mask, "fa2")


def backward_stats(q, k, v, out, lse, dout, loop_order="fa2", **options) -> TileStats:
    """Run one loop order with ``attention_backward``'s options; return its TileStats (bytes per tensor)."""
    stats = TileStats()
    call_backward(partial(flash_backward, loop_order=loop_order, stats=stats), q, k, v, out, lse, dout, **options)
    return stats
