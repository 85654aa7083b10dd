"""impl ``flash_numpy``: the tiled FlashAttention forward, in numpy.

Chapter 05's kernel, and the one tiled forward of the course: the counted
kernel of chapter 03 (``course_lib.kernels.counted``) runs these same loops with a
memory that counts every byte, so the counts, the outputs and the errors shown
anywhere in the course come from this code.

S = Q K^T is never materialised: it is computed a tile of Br query rows by Bc
keys at a time, and chapter 04's online softmax folds each tile into a running
(m, l, O).  Names are the paper's:

    Tr, Tc   number of query tiles and of key/value tiles
    Br, Bc   rows per query tile (block_q), keys per key/value tile (block_k)
    Qi, Kj, Vj, Sij    the tiles
    m, l, Oi the running row max, row sum and (unnormalised) output of tile i

Two loop orders, both here so that a reader can compare them:

- ``fa2`` (FlashAttention-2, the default): outer loop over query tiles, inner
  over key/value tiles.  (m, l, Oi) stay on chip for the whole inner loop; Oi
  is divided by l once, at the end, and Oi and lse are written once.
- ``fa1`` (FlashAttention-1, Algorithm 1 of the paper): outer loop over
  key/value tiles, inner over query tiles.  O, l and m live in HBM and every
  step reads Oi, li, mi back, rescales, divides by the new l and writes them.
  The O scratch is kept in the accumulation dtype (FA1's CUDA code keeps a
  float32 ``o_tmp`` for the same reason: Tc roundings would pile up); at
  float16 / bfloat16 a last pass converts it to the output dtype.

Every (batch, head) pair is computed at once (the leading axes of each tile):
those are the loops a GPU spreads over thread blocks.  Masks come tile by tile
from ``course_lib.core.masks``: a tile no query sees is skipped, a tile every query
sees fully needs no elementwise mask, only the ``partial`` ones do.

Every load from and store to a full-size array ("HBM"), and every buffer the
tile holds on chip ("SRAM"), goes through a ``Memory``.  The default one
(``Memory``) counts bytes per tensor into the ``TileStats`` of the call; the
counted kernel passes one that also tracks the on-chip peak.  The FA2 loop
speaks to it through ``OnChip``, which does the counting, the holding and
float8's dequantising, so that the loop reads as the paper's algorithm.

Precision is ``core.rules``': tiles are loaded in the input dtype; Q K^T and
P V accumulate in ``rules.acc_dtype`` (float32, float64 for float64 input); at
float16 / bfloat16 P is rounded to the input dtype before P V
(``rules.p_round_dtype``), as a GPU kernel feeds its matrix unit; the output is
rounded to the input dtype when it is stored, lse is ``rules.lse_dtype``.
Float8 inputs (FA3's interface): tiles are loaded in float8 (one byte each)
and dequantised with their descales on chip; P = exp(S - m) is rounded to
e4m3; the output stays float32 (``rules.out_dtype``).
Tiles are Br x Bc = ``block_q`` x ``block_k``, or ``launch.DEFAULT_TILES``'s.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..core import rules
from ..core.masks import EMPTY, FULL, PARTIAL, MaskSpec, tile_ranges
from ..core.online_softmax import finalize, finalize_lse, finalize_out, init_state, online_update
from ..core.options import call_forward
from ..core.reference import dequantize, kv_head_index, lse_of_rebased, nan_lse_where_out_is_nan, tile_scores
from .launch import DEFAULT_TILES, tile_sizes

LOOP_ORDERS = ("fa2", "fa1")


def buffer_names(dtype) -> tuple:
    """Names of the two low-precision conversion buffers, as ``sram.tile_budget`` lists them."""
    name = np.dtype(dtype).name
    return f"P in {name}", f"O out in {name}"


@dataclass
class TileStats:
    """What one forward call did, tile by tile.

    ``computed``: tiles of S computed; ``skipped``: tiles no query sees (not
    loaded at all); ``masked``: computed tiles that needed the elementwise mask.
    ``reads`` / ``writes``: bytes per tensor (Q, K, V, O, m, l, lse) moved
    between the full-size arrays ("HBM") and the tiles, summed over every
    (batch, query head); ``flops`` and ``exps``: the matmul FLOPs and the score
    exponentials of the computed tiles.  These follow ``course_lib.models.iomodel``'s
    conventions (with ``return_lse``) and equal its model exactly.
    """

    computed: int = 0
    skipped: int = 0
    masked: int = 0
    flops: int = 0
    exps: int = 0
    reads: Counter = field(default_factory=Counter)
    writes: Counter = field(default_factory=Counter)

    @property
    def hbm_read(self) -> int:
        return sum(self.reads.values())

    @property
    def hbm_write(self) -> int:
        return sum(self.writes.values())

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read + self.hbm_write


class Memory:
    """HBM as the tiled forward sees it: loads and stores counted per tensor; on-chip buffers not tracked."""

    def __init__(self, stats: TileStats):
        self.stats = stats

    def load(self, name, array, index):
        """Bring ``array[index]`` onto the chip, counting its bytes as a read of ``name``."""
        tile = array[index]
        self.stats.reads[name] += tile.nbytes
        return tile

    def store(self, name, array, index, value):
        """Write ``value`` into ``array[index]`` in that array's dtype, counting its bytes."""
        array[index] = value
        self.stats.writes[name] += array[index].nbytes

    def hold(self, name, value):
        """Register an on-chip buffer (the counted kernel tracks its bytes; this memory does not)."""
        return value

    def reserve(self, name, shape, dtype):
        """Register an on-chip buffer by its shape and dtype, without making it (P rounded for P V)."""

    def free(self, *names):
        """The buffers ``names`` are dead."""


# -- the loop bodies: one query tile against one key tile ---------------------------

def _count_tile(stats, Qi, Kj, dv, kind):
    batch_heads, rows, d = int(np.prod(Qi.shape[:-2])), Qi.shape[-2], Qi.shape[-1]
    cols = Kj.shape[-2]
    stats.computed += 1
    stats.masked += kind == PARTIAL
    stats.flops += 2 * batch_heads * rows * cols * (d + dv)
    stats.exps += batch_heads * rows * cols


def _scores(mem, Qi, Kj, opts, mask, r0, r1, c0, c1, kind, acc_dtype):
    """Sij for query rows [r0, r1) and keys [c0, c1), held on chip; the mask only on tiles that need it."""
    Sij = tile_scores(Qi, Kj, opts, mask, np.arange(r0, r1), np.arange(c0, c1), acc_dtype,
                      masked=kind != FULL)
    return mem.hold("S / P tile", Sij)


def _visit(mask, r0, r1, c0, c1, skip_empty_tiles):
    """The tile's kind, or None when it is skipped: empty tiles are never loaded."""
    kind = mask.tile_kind(r0, r1, c0, c1)
    return None if kind == EMPTY and skip_empty_tiles else kind


class OnChip:
    """The tiled forward's view of its memory, in the algorithm's words; the bookkeeping behind them.

    ``load`` brings a tile on chip (its bytes counted as a read, its buffer
    held; float8 tiles dequantised with their descales on arrival),
    ``keep`` holds the running (m, l, Oi), ``visit`` says whether a tile is
    computed or skipped, ``scores`` forms Sij (masked only where the tile
    needs it) and counts the tile's FLOPs, ``write`` stores Oi and lse_i once
    and frees the query tile's buffers.  Underneath, ``mem`` counts the HBM
    traffic (and, for the counted kernel, the on-chip bytes and their peak)
    and ``stats`` the tiles.
    """

    def __init__(self, q, v, opts, mask, mem, stats, skip_empty_tiles=True, return_lse=True):
        self.opts, self.mask, self.mem, self.stats = opts, mask, mem, stats
        self.skip_empty_tiles, self.return_lse = skip_empty_tiles, return_lse
        self.acc_dtype, self.p_dtype = rules.acc_dtype(q.dtype), rules.p_round_dtype(q.dtype)
        self.P_LOW, self.O_LOW = buffer_names(q.dtype)
        self.Dv = v.shape[3]
        self.descale = dict(zip("QKV", opts.descale)) if opts.descale is not None else {}

    def load(self, name, array, index):
        """Tile ``array[index]`` of tensor ``name`` ("Q", "K" or "V") on chip, in the accumulation dtype."""
        tile = self.mem.hold(f"{name} tile", self.mem.load(name, array, index))
        if name in self.descale:                   # float8: one byte a value crossed, dequantised here
            tile = dequantize(tile, self.descale[name], self.acc_dtype)
        return tile

    def keep(self, m, l, Oi):
        """(m, l, Oi) held on chip for the whole inner loop."""
        return self.mem.hold("m (row max)", m), self.mem.hold("l (row sum)", l), self.mem.hold("O accumulator", Oi)

    def visit(self, r0, r1, c0, c1):
        """The kind of tile (rows [r0, r1), keys [c0, c1)), or None when it is skipped (never loaded)."""
        self.mem.free("S / P tile", self.P_LOW)    # the tile before is done
        kind = _visit(self.mask, r0, r1, c0, c1, self.skip_empty_tiles)
        self.stats.skipped += kind is None
        return kind

    def scores(self, Qi, Kj, r0, r1, c0, c1, kind):
        """Sij = scale Qi Kj^T (capped, biased), masked only if the tile is partial; P's low-precision copy
        for P V reserved beside it."""
        Sij = _scores(self.mem, Qi, Kj, self.opts, self.mask, r0, r1, c0, c1, kind, self.acc_dtype)
        if self.p_dtype is not None:
            self.mem.reserve(self.P_LOW, Sij.shape, self.p_dtype)       # P rounded for the P V matmul
        _count_tile(self.stats, Qi, Kj, self.Dv, kind)
        return Sij

    def write(self, O, L, rows, out, lse):
        """O[rows] = out in O's dtype and L[rows] = lse (if asked for); the query tile's buffers freed."""
        self.mem.free("S / P tile", self.P_LOW)
        if O.dtype != self.acc_dtype:
            out = self.mem.hold(self.O_LOW, out.astype(O.dtype))
        self.mem.store("O", O, rows, out)
        if self.return_lse:
            self.mem.store("lse", L, rows, lse)
        self.mem.free("Q tile", "K tile", "V tile", "m (row max)", "l (row sum)", "O accumulator", self.O_LOW)


def _forward_fa2(q, k, v, opts, mask, Br, Bc, mem, stats, skip_empty_tiles=True, return_lse=True):
    """FA2's loop order (FlashAttention-2, Algorithm 1): query tiles outer, key / value tiles inner."""
    chip = OnChip(q, v, opts, mask, mem, stats, skip_empty_tiles, return_lse)
    B, H, Nq, _ = q.shape
    Dv = v.shape[3]
    kv = kv_head_index(H, k.shape[1])  # the K/V head each query head reads (GQA / MQA)
    O = np.zeros((B, H, Nq, Dv), dtype=rules.out_dtype(q.dtype))   # in HBM
    L = np.full((B, H, Nq), -np.inf, dtype=rules.lse_dtype(q.dtype))
    for r0, r1 in tile_ranges(Nq, Br):                               # outer: the Tr query tiles
        Qi = chip.load("Q", q, np.s_[:, :, r0:r1])                   # (B, H, Br, D)
        m, l, Oi = chip.keep(*init_state((B, H, r1 - r0), Dv, chip.acc_dtype))  # on chip for the inner loop
        for c0, c1 in tile_ranges(mask.seqlen_k, Bc):                # inner: the Tc key/value tiles
            kind = chip.visit(r0, r1, c0, c1)
            if kind is None:
                continue                                             # no query sees it: Kj, Vj never loaded
            Kj = chip.load("K", k, np.s_[:, kv, c0:c1])              # (B, H, Bc, D)
            Vj = chip.load("V", v, np.s_[:, kv, c0:c1])              # (B, H, Bc, Dv)
            Sij = chip.scores(Qi, Kj, r0, r1, c0, c1, kind)          # (B, H, Br, Bc)
            m, l, Oi, _ = online_update(m, l, Oi, Sij, Vj, chip.p_dtype)  # rescale, then add Pij Vj
        out, lse = finalize(m, l, Oi)                                # divide by l once, at the end
        lse = lse_of_rebased(lse, opts, mask, np.arange(r0, r1))     # ALiBi's rebasing taken back
        chip.write(O, L, np.s_[:, :, r0:r1], out, lse)               # write Oi and lse_i once
    return O, L


def _forward_fa1(q, k, v, opts, mask, Br, Bc, mem, stats, skip_empty_tiles=True, return_lse=True):
    B, H, Nq, _ = q.shape
    Dv = v.shape[3]
    acc_dtype, p_dtype = rules.acc_dtype(q.dtype), rules.p_round_dtype(q.dtype)
    P_LOW, O_LOW = buffer_names(q.dtype)
    kv = kv_head_index(H, k.shape[1])
    row_tiles, col_tiles = tile_ranges(Nq, Br), tile_ranges(mask.seqlen_k, Bc)
    # Algorithm 1, line 2: O, l and m live in HBM for the whole pass, written once to 0, 0, -inf
    O = np.empty((B, H, Nq, Dv), dtype=acc_dtype)
    l = np.empty((B, H, Nq), dtype=acc_dtype)
    m = np.empty((B, H, Nq), dtype=acc_dtype)
    everything = np.s_[:, :, :]
    mem.store("O", O, everything, 0)
    mem.store("l", l, everything, 0)
    mem.store("m", m, everything, -np.inf)
    for c0, c1 in col_tiles:                                         # outer: the Tc key/value tiles
        kinds = [_visit(mask, r0, r1, c0, c1, skip_empty_tiles) for r0, r1 in row_tiles]
        if all(kind is None for kind in kinds):
            stats.skipped += len(kinds)
            continue
        Kj = mem.hold("K tile", mem.load("K", k, np.s_[:, kv, c0:c1]))  # once per outer step
        Vj = mem.hold("V tile", mem.load("V", v, np.s_[:, kv, c0:c1]))
        for (r0, r1), kind in zip(row_tiles, kinds):                 # inner: the Tr query tiles
            if kind is None:
                stats.skipped += 1
                continue
            rows = np.s_[:, :, r0:r1]
            Qi = mem.hold("Q tile", mem.load("Q", q, rows))          # load Qi, Oi, li, mi
            Oi = mem.hold("O accumulator", mem.load("O", O, rows))
            li = mem.hold("l (row sum)", mem.load("l", l, rows))
            mi = mem.hold("m (row max)", mem.load("m", m, rows))
            Sij = _scores(mem, Qi, Kj, opts, mask, r0, r1, c0, c1, kind, acc_dtype)
            if p_dtype is not None:
                mem.reserve(P_LOW, Sij.shape, p_dtype)
            # O is kept normalised in HBM (the paper's form): undo the old 1/l, fold the tile in
            # with chapter 04's update, divide by the new l
            m_new, l_new, numer, _ = online_update(mi, li, li[..., None] * Oi, Sij, Vj, p_dtype)
            mem.store("O", O, rows, finalize_out(l_new, numer))
            mem.store("l", l, rows, l_new)
            mem.store("m", m, rows, m_new)
            _count_tile(stats, Qi, Kj, Vj.shape[-1], kind)
            mem.free("Q tile", "O accumulator", "l (row sum)", "m (row max)", "S / P tile", P_LOW)
        mem.free("K tile", "V tile")
    # a last pass per query tile: lse = m + log l, and (low precision) O converted to the output dtype
    out = O if p_dtype is None else np.zeros((B, H, Nq, Dv), dtype=q.dtype)
    L = np.full((B, H, Nq), -np.inf, dtype=rules.lse_dtype(q.dtype))
    for r0, r1 in row_tiles:
        rows = np.s_[:, :, r0:r1]
        if p_dtype is not None:
            Oi = mem.hold("O accumulator", mem.load("O", O, rows))
            mem.store("O", out, rows, mem.hold(O_LOW, Oi.astype(q.dtype)))
        if return_lse:
            mi, li = mem.hold("m (row max)", mem.load("m", m, rows)), mem.hold("l (row sum)", mem.load("l", l, rows))
            lse = lse_of_rebased(finalize_lse(mi, li), opts, mask, np.arange(r0, r1))
            lse = nan_lse_where_out_is_nan(O[rows], lse)             # O[rows]: the flag, not a load
            mem.store("lse", L, rows, lse)
        mem.free("O accumulator", O_LOW, "m (row max)", "l (row sum)")
    return out.astype(q.dtype, copy=False), L


LOOPS = {"fa2": _forward_fa2, "fa1": _forward_fa1}


def flash_forward(q, k, v, opts, mask: MaskSpec, loop_order="fa2", stats: TileStats | None = None, *,
                  mem=None, skip_empty_tiles=True, return_lse=True):
    """The tiled forward for validated dense inputs: (out in q's dtype, lse).

    q: (B, H, Nq, D); k: (B, Hk, Nk, D); v: (B, Hk, Nk, Dv).  ``stats``, when
    given, is filled with the tile counts and HBM traffic of this call;
    ``mem`` replaces the default counting ``Memory`` (the counted kernel's).
    """
    if loop_order not in LOOP_ORDERS:
        raise ValueError(f"loop_order must be one of {LOOP_ORDERS}, got {loop_order!r}")
    if loop_order != "fa2" and opts.descale is not None:
        raise TypeError("impl flash_numpy_fa1 (FA1's loop order) takes no float8_e4m3fn inputs: use its FA2-order "
                        "twin flash_numpy, or reference, naive or flash_numba_cpu, with the same descales")
    Br, Bc = tile_sizes(opts, *DEFAULT_TILES["flash_numpy"])
    stats = TileStats() if stats is None else stats
    mem = Memory(stats) if mem is None else mem
    return LOOPS[loop_order](q, k, v, opts, mask, Br, Bc, mem, stats, skip_empty_tiles, return_lse)


def attention_forward(q, k, v, opts, mask):
    """impl ``flash_numpy``: the FA2 loop order (impl ``flash_numpy_fa1`` is ``flash_forward`` with
    ``loop_order="fa1"``; ``tile_stats`` runs either and returns its counts)."""
    return flash_forward(q, k, v, opts, mask, "fa2")


def tile_stats(q, k, v, loop_order="fa2", **options) -> TileStats:
    """Run one loop order on (q, k, v) with ``course_lib.attention``'s options; return its TileStats."""
    stats = TileStats()
    call_forward(partial(flash_forward, loop_order=loop_order, stats=stats), q, k, v, **options)
    return stats


def run_with_stats(q, k, v, loop_order="fa2", **options):
    """(out, lse, TileStats) of one call: the output and the counts of the same run."""
    stats = TileStats()
    out, lse = call_forward(partial(flash_forward, loop_order=loop_order, stats=stats), q, k, v,
                                return_lse=True, **options)
    return out, lse, stats
