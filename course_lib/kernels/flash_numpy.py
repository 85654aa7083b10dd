"""impl ``flash_numpy``: the tiled FlashAttention forward, in numpy.

Chapter 05's kernel.  S = Q K^T is never materialised: it is computed a tile
of Br query rows by Bc keys at a time, and chapter 04's online softmax folds
each tile into a running (m, l, O).  Names are the paper's:

    Tr, Tc   number of query tiles and of key/value tiles
    Br, Bc   rows per query tile (block_q), keys per key/value tile (block_k)
    Qi, Kj, Vj, Sij, Pij    the tiles
    m, l, Oi the running row max, row sum and (unnormalised) output of tile i

Two loop orders, both here so that a reader can compare them:

- ``fa2`` (FlashAttention-2, the default): outer loop over query tiles, inner
  over key/value tiles.  (m, l, Oi) stay in "SRAM" (local variables) for the
  whole inner loop; Oi is divided by l once, at the end, and Oi and lse are
  written once.
- ``fa1`` (FlashAttention-1, Algorithm 1 of the paper): outer loop over
  key/value tiles, inner over query tiles.  O, l and m live in "HBM" (full-size
  arrays) and every step reads Oi, li, mi back, rescales, divides by the new l
  and writes them out again.

Every (batch, head) pair is computed at once (the leading axes of each tile):
those are the loops a GPU spreads over thread blocks.  Masks come tile by tile
from ``course_lib.masks``: a tile no query sees is skipped, a tile every query
sees fully needs no elementwise mask, only the ``partial`` ones do.

Precision: tiles are loaded in the input dtype; Q K^T and P V accumulate in
float32 (float64 for float64 input); at float16 / bfloat16 P is rounded to the
input dtype before P V, as a GPU kernel feeds its matrix unit; the output is
rounded to the input dtype at the end.  FA1's O scratch in HBM is kept in the
accumulation dtype so that Tc roundings do not pile up.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from .. import api
from ..masks import EMPTY, PARTIAL, MaskSpec, tile_ranges
from ..online_softmax import finalize, init_state, online_update
from ..reference import LOW_PRECISION, kv_head_index, lse_dtype, safe_max, tile_scores

DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_K = 64
LOOP_ORDERS = ("fa2", "fa1")


@dataclass
class TileStats:
    """What one forward pass did, tile by tile.

    ``computed``: tiles of S computed; ``skipped``: tiles no query sees (not
    loaded at all); ``masked``: computed tiles that needed the elementwise mask.
    ``hbm_read`` / ``hbm_write``: bytes of Q, K, V, O, l, m and lse moved
    between the full-size arrays ("HBM") and the tiles ("SRAM"), summed over
    every (batch, query head), counted where the loops load and store them.
    They follow ``course_lib.iomodel``'s conventions (with ``return_lse``) and
    equal its model exactly for float32 and float64; at float16 / bfloat16
    FA1's O traffic counts 4 bytes an element, because this kernel keeps that
    scratch in float32 where the model counts the input dtype.
    """

    computed: int = 0
    skipped: int = 0
    masked: int = 0
    hbm_read: int = 0
    hbm_write: int = 0

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read + self.hbm_write


last_stats = TileStats()  # the stats of the latest attention_forward (one dense call)


def precision(dtype):
    """(accumulation dtype, dtype P is rounded to before P V, or None)."""
    dtype = np.dtype(dtype)
    if dtype.name in LOW_PRECISION:
        return np.dtype(np.float32), dtype
    return dtype, None


def flash_forward(q, k, v, opts, mask: MaskSpec, loop_order="fa2", stats: TileStats | None = None):
    """The tiled forward for validated dense inputs: (out in q's dtype, lse).

    q: (B, H, Nq, D); k: (B, Hk, Nk, D); v: (B, Hk, Nk, Dv).  ``stats``, when
    given, is filled with the tile counts and HBM traffic.
    """
    if loop_order not in LOOP_ORDERS:
        raise ValueError(f"loop_order must be one of {LOOP_ORDERS}, got {loop_order!r}")
    Br = opts.block_q or DEFAULT_BLOCK_Q
    Bc = opts.block_k or DEFAULT_BLOCK_K
    stats = TileStats() if stats is None else stats
    loop = _forward_fa2 if loop_order == "fa2" else _forward_fa1
    return loop(q, k, v, opts, mask, Br, Bc, stats)


def _forward_fa2(q, k, v, opts, mask, Br, Bc, stats):
    B, H, Nq, _ = q.shape
    Dv = v.shape[3]
    acc, p_dtype = precision(q.dtype)
    kv = kv_head_index(H, k.shape[1])  # the K/V head each query head reads (GQA / MQA)
    O = np.zeros((B, H, Nq, Dv), dtype=q.dtype)
    L = np.full((B, H, Nq), -np.inf, dtype=lse_dtype(q.dtype))
    row_tiles, col_tiles = tile_ranges(Nq, Br), tile_ranges(mask.seqlen_k, Bc)  # Tr, Tc tiles
    for r0, r1 in row_tiles:                              # outer: query tiles
        rows = np.arange(r0, r1)
        Qi = q[:, :, r0:r1]                               # load Qi  (B, H, Br, D)
        stats.hbm_read += Qi.nbytes
        m, l, Oi = init_state((B, H, r1 - r0), Dv, acc)  # on chip for the whole inner loop
        for c0, c1 in col_tiles:                          # inner: key/value tiles
            kind = mask.tile_kind(r0, r1, c0, c1)
            if kind == EMPTY:
                stats.skipped += 1
                continue
            Kj, Vj = k[:, kv, c0:c1], v[:, kv, c0:c1]     # load Kj, Vj  (B, H, Bc, D / Dv)
            stats.hbm_read += Kj.nbytes + Vj.nbytes
            Sij = tile_scores(Qi, Kj, opts, mask, rows, np.arange(c0, c1), acc, masked=kind == PARTIAL)
            m, l, Oi, _ = online_update(m, l, Oi, Sij, Vj, p_dtype)  # rescale, then add Pij Vj
            stats.computed += 1
            stats.masked += kind == PARTIAL
        out, lse = finalize(m, l, Oi)                     # divide by l once, at the end
        O[:, :, r0:r1] = out.astype(q.dtype)              # write Oi and lse_i once
        L[:, :, r0:r1] = lse
        stats.hbm_write += O[:, :, r0:r1].nbytes + L[:, :, r0:r1].nbytes
    return O, L


def _forward_fa1(q, k, v, opts, mask, Br, Bc, stats):
    B, H, Nq, _ = q.shape
    Dv = v.shape[3]
    acc, p_dtype = precision(q.dtype)
    kv = kv_head_index(H, k.shape[1])
    # O, l and m live in HBM for the whole pass: written once to 0, 0, -inf, then
    # read and written back at every step.
    O = np.zeros((B, H, Nq, Dv), dtype=acc)
    l = np.zeros((B, H, Nq), dtype=acc)
    m = np.full((B, H, Nq), -np.inf, dtype=acc)
    stats.hbm_write += O.nbytes + l.nbytes + m.nbytes
    row_tiles, col_tiles = tile_ranges(Nq, Br), tile_ranges(mask.seqlen_k, Bc)
    for c0, c1 in col_tiles:                              # outer: key/value tiles
        kinds = [mask.tile_kind(r0, r1, c0, c1) for r0, r1 in row_tiles]
        if all(kind == EMPTY for kind in kinds):
            stats.skipped += len(kinds)
            continue
        Kj, Vj = k[:, kv, c0:c1], v[:, kv, c0:c1]         # load Kj, Vj once per outer step
        stats.hbm_read += Kj.nbytes + Vj.nbytes
        for (r0, r1), kind in zip(row_tiles, kinds):      # inner: query tiles
            if kind == EMPTY:
                stats.skipped += 1
                continue
            rows = np.arange(r0, r1)
            Qi = q[:, :, r0:r1]                           # load Qi, Oi, li, mi
            Oi, li, mi = O[:, :, r0:r1], l[:, :, r0:r1], m[:, :, r0:r1]
            stats.hbm_read += Qi.nbytes + Oi.nbytes + li.nbytes + mi.nbytes
            Sij = tile_scores(Qi, Kj, opts, mask, rows, np.arange(c0, c1), acc, masked=kind == PARTIAL)
            # the tile's own softmax statistics: m~ij, P~ij, l~ij
            mij = np.max(Sij, axis=-1)
            Pij = np.exp(Sij - safe_max(mij)[..., None])
            lij = np.sum(Pij, axis=-1)
            # merge them into the running ones: both sides rescaled to m_new
            m_new = np.maximum(mi, mij)
            shift = safe_max(m_new)
            alpha, beta = np.exp(mi - shift), np.exp(mij - shift)  # 0 for a side that saw nothing
            l_new = alpha * li + beta * lij
            PVij = (Pij if p_dtype is None else Pij.astype(p_dtype).astype(acc)) @ Vj.astype(acc)
            numer = (li * alpha)[..., None] * Oi + beta[..., None] * PVij
            Oi_new = numer / np.where(l_new > 0, l_new, 1)[..., None]  # O is kept normalised
            O[:, :, r0:r1], l[:, :, r0:r1], m[:, :, r0:r1] = Oi_new, l_new, m_new  # write back
            stats.hbm_write += Oi.nbytes + li.nbytes + mi.nbytes
            stats.computed += 1
            stats.masked += kind == PARTIAL
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, safe_max(m) + np.log(np.where(l > 0, l, 1)), -np.inf)
    stats.hbm_write += lse.astype(lse_dtype(q.dtype)).nbytes  # lse from l and m, one more pass
    stats.hbm_read += l.nbytes + m.nbytes
    return O.astype(q.dtype), lse.astype(lse_dtype(q.dtype))


def attention_forward(q, k, v, opts, mask):
    """impl ``flash_numpy`` (FA2 loop order); its tile stats land in ``last_stats``."""
    global last_stats
    last_stats = TileStats()
    return flash_forward(q, k, v, opts, mask, "fa2", last_stats)


def attention_fa1(q, k, v, **options):
    """``course_lib.attention`` with the FA1 loop order: same options, same checks."""
    return api.call_forward(partial(flash_forward, loop_order="fa1"), q, k, v, **options)


def attention_fa2(q, k, v, **options):
    """``course_lib.attention`` with the FA2 loop order (what impl ``flash_numpy`` runs)."""
    return api.call_forward(partial(flash_forward, loop_order="fa2"), q, k, v, **options)


def tile_stats(q, k, v, loop_order="fa2", **options) -> TileStats:
    """Run one loop order on (q, k, v) with ``course_lib.attention``'s options; return its TileStats."""
    stats = TileStats()
    api.call_forward(partial(flash_forward, loop_order=loop_order, stats=stats), q, k, v, **options)
    return stats
