"""The counted kernel: attention run on a counted HBM and a counted SRAM (chapter 03).

``run_counted(q, k, v, schedule=...)`` runs one of four schedules for real and
counts what it moves:

``fa2``, ``fa1``  the course's tiled forward itself (``kernels.flash_numpy``'s
                  loops, not a copy), run with a memory that also tracks the
                  on-chip buffers;
``two_pass``      tiled, no online softmax: pass 1 reads every K tile for the
                  row max m, pass 2 reads K and V again for l and P V;
``naive``         S written to HBM, the softmax in ``softmax_passes`` passes,
                  P written, O = P V.

Every load and store goes through ``HBM`` (bytes per tensor) and every on-chip
buffer through ``SRAM`` (live bytes and their peak).  One (batch, head) runs at
a time, as one thread block holds one head's tile, so the SRAM peak is one
tile program's.  The tests hold ``iomodel.attention_io(...) ==
run_counted(...).traffic`` on a grid of shapes, tails and masks, the output
equal to the reference, and the SRAM peak equal to ``sram.tile_budget``.
What it counts is traffic between the chip and the memory below it: L2 and
HBM together (``iomodel``'s module docstring says which level is which).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..core import rules
from ..core.masks import EMPTY, FULL, tile_ranges
from ..core.online_softmax import finalize, finalize_lse, init_state, online_update
from ..core.options import call_forward
from ..core.reference import lse_of_rebased, nan_lse_where_out_is_nan, safe_max, tile_scores
from .flash_numpy import LOOPS, Memory, TileStats, buffer_names
from .launch import DEFAULT_TILES, tile_sizes

SCHEDULES = ("naive", "two_pass", "fa1", "fa2")


# -- what a schedule moves ------------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    """FLOPs, exponentials and bytes of one attention call, per tensor, between the chip and L2 + HBM."""

    schedule: str
    flops: int
    exps: int
    reads: dict  # tensor name -> bytes read into the chip (from L2 or HBM)
    writes: dict  # tensor name -> bytes written out of the chip

    @property
    def read_bytes(self) -> int:
        return sum(self.reads.values())

    @property
    def write_bytes(self) -> int:
        return sum(self.writes.values())

    @property
    def bytes(self) -> int:
        """All traffic below the chip (the two-level count), reads plus writes."""
        return self.read_bytes + self.write_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte of the two-level count."""
        return self.flops / self.bytes if self.bytes else math.inf

    def table(self) -> str:
        """Per-tensor reads and writes as fixed-width text."""
        names = sorted(set(self.reads) | set(self.writes), key=_TENSOR_ORDER.index)
        lines = [f"{self.schedule}: {self.flops:,} FLOP, {self.bytes:,} B between chip and L2 + HBM, "
                 f"intensity {self.intensity:.4g} FLOP/B",
                 f"  {'tensor':<7}{'read B':>16}{'written B':>16}"]
        for n in names:
            lines.append(f"  {n:<7}{self.reads.get(n, 0):>16,}{self.writes.get(n, 0):>16,}")
        return "\n".join(lines)


_TENSOR_ORDER = ["Q", "K", "V", "S", "P", "m", "l", "O", "lse"]


def traffic(schedule, flops, exps, reads, writes) -> Traffic:
    """A Traffic with zero entries dropped, so a model and a count compare equal."""
    clean = lambda d: {k: int(v) for k, v in d.items() if v}
    return Traffic(schedule, int(flops), int(exps), clean(reads), clean(writes))


def traffic_of(schedule: str, stats) -> Traffic:
    """The Traffic a kernel counted while it ran (a ``flash_numpy.TileStats``)."""
    return traffic(schedule, stats.flops, stats.exps, stats.reads, stats.writes)


class HBM(Memory):
    """Off-chip memory: every load and store of a named tensor is counted in bytes (``reads``, ``writes``)."""

    def __init__(self, stats: TileStats | None = None):
        super().__init__(TileStats() if stats is None else stats)

    @property
    def reads(self):
        return self.stats.reads

    @property
    def writes(self):
        return self.stats.writes

    def load(self, name, array, index):
        """Copy ``array[index]`` onto the chip, counting its bytes as a read of ``name``."""
        return np.array(super().load(name, array, index))


class SRAM:
    """On-chip memory: which named buffers are live, how many bytes, and the peak."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.live = {}
        self.peak = 0
        self.peak_buffers = {}

    def reserve(self, name, shape, dtype):
        """Register the buffer ``name`` of this shape and dtype (replacing one of that name)."""
        self.live[name] = math.prod(shape) * np.dtype(dtype).itemsize
        used = sum(self.live.values())
        if self.capacity is not None and used > self.capacity:
            raise MemoryError(f"SRAM overflow: {used:,} B live > {self.capacity:,} B ({self.live})")
        if used > self.peak:
            self.peak, self.peak_buffers = used, dict(self.live)

    def hold(self, name, array):
        """Register ``array`` as the on-chip buffer ``name``; returns it."""
        self.reserve(name, array.shape, array.dtype)
        return array

    def free(self, *names):
        for name in names:
            self.live.pop(name, None)


class Chip(HBM):
    """The memory the tiled loops run on here: HBM traffic counted, on-chip buffers held in an ``SRAM``."""

    def __init__(self, stats: TileStats, sram: SRAM):
        super().__init__(stats)
        self.sram = sram

    def hold(self, name, value):
        return self.sram.hold(name, value)

    def reserve(self, name, shape, dtype):
        self.sram.reserve(name, shape, dtype)

    def free(self, *names):
        self.sram.free(*names)


@dataclass
class Counted:
    """What ``run_counted`` computed and what it moved."""

    out: np.ndarray
    lse: np.ndarray | None
    traffic: Traffic
    sram_peak: int  # bytes
    sram_peak_buffers: dict  # buffer name -> bytes, at the peak


# -- the two schedules that are not FlashAttention ----------------------------------

def _two_pass(q, k, v, opts, mask, Br, Bc, mem, stats, skip_empty_tiles=True, return_lse=True):
    """For each query tile: pass 1 finds the row max m, pass 2 sums l and P V with m final (no rescaling)."""
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    acc_dtype, p_dtype = rules.acc_dtype(q.dtype), rules.p_round_dtype(q.dtype)
    P_LOW, O_LOW = buffer_names(q.dtype)
    O = np.zeros((B, H, Nq, Dv), dtype=q.dtype)
    L = np.full((B, H, Nq), -np.inf, dtype=rules.lse_dtype(q.dtype))
    for r0, r1 in tile_ranges(Nq, Br):
        Qi = mem.hold("Q tile", mem.load("Q", q, np.s_[:, :, r0:r1]))
        m, l, Oi = init_state((B, H, r1 - r0), Dv, acc_dtype)
        mem.hold("m (row max)", m)
        kinds = {(c0, c1): mask.tile_kind(r0, r1, c0, c1) for c0, c1 in tile_ranges(mask.seqlen_k, Bc)}
        seen = {tile: kind for tile, kind in kinds.items() if not (skip_empty_tiles and kind == EMPTY)}
        stats.skipped += len(kinds) - len(seen)
        for (c0, c1), kind in seen.items():  # pass 1: the row max, nothing else
            Kj = mem.hold("K tile", mem.load("K", k, np.s_[:, :, c0:c1]))
            Sij = mem.hold("S / P tile", tile_scores(Qi, Kj, opts, mask, np.arange(r0, r1), np.arange(c0, c1),
                                                     acc_dtype, masked=kind != FULL))
            m = np.maximum(m, Sij.max(axis=-1))
            stats.flops += 2 * B * H * (r1 - r0) * (c1 - c0) * D
            mem.free("S / P tile")
        mem.hold("l (row sum)", l), mem.hold("O accumulator", Oi)
        for (c0, c1), kind in seen.items():  # pass 2: m is final, so exp(S - m) never needs rescaling
            Kj = mem.hold("K tile", mem.load("K", k, np.s_[:, :, c0:c1]))
            Vj = mem.hold("V tile", mem.load("V", v, np.s_[:, :, c0:c1]))
            Sij = mem.hold("S / P tile", tile_scores(Qi, Kj, opts, mask, np.arange(r0, r1), np.arange(c0, c1),
                                                     acc_dtype, masked=kind != FULL))
            if p_dtype is not None:
                mem.reserve(P_LOW, Sij.shape, p_dtype)
            m, l, Oi, _ = online_update(m, l, Oi, Sij, Vj, p_dtype)  # alpha = 1: m does not move
            stats.computed += 1
            stats.masked += kind != FULL
            stats.flops += 2 * B * H * (r1 - r0) * (c1 - c0) * (D + Dv)
            stats.exps += B * H * (r1 - r0) * (c1 - c0)
            mem.free("S / P tile", P_LOW)
        out, lse = finalize(m, l, Oi)
        lse = lse_of_rebased(lse, opts, mask, np.arange(r0, r1))
        if p_dtype is not None:
            out = mem.hold(O_LOW, out.astype(q.dtype))
        mem.store("O", O, np.s_[:, :, r0:r1], out)
        if return_lse:
            mem.store("lse", L, np.s_[:, :, r0:r1], lse)
        mem.free("Q tile", "K tile", "V tile", "m (row max)", "l (row sum)", "O accumulator", O_LOW)
    return O, L


def _naive(q, k, v, opts, mask, mem, stats, softmax_passes=1, return_lse=True):
    """S to HBM, the softmax in ``softmax_passes`` passes over it, P to HBM, O = P V."""
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    acc_dtype = rules.acc_dtype(q.dtype)
    every = np.s_[:, :, :]
    S = np.empty((B, H, Nq, Nk), q.dtype)  # in HBM, in the input dtype, as a framework stores it
    P = np.empty((B, H, Nq, Nk), q.dtype)
    m_hbm, l_hbm = np.empty((B, H, Nq), acc_dtype), np.empty((B, H, Nq), acc_dtype)
    O = np.empty((B, H, Nq, Dv), q.dtype)
    L = np.full((B, H, Nq), -np.inf, rules.lse_dtype(q.dtype))
    Q, K = mem.load("Q", q, every), mem.load("K", k, every)
    mem.store("S", S, every, tile_scores(Q, K, opts, mask, np.arange(Nq), np.arange(Nk), acc_dtype,
                                         masked=not mask.is_trivial))
    stats.flops += 2 * B * H * Nq * Nk * (D + Dv)
    stats.exps += (1 if softmax_passes == 1 else 2) * B * H * Nq * Nk
    s = mem.load("S", S, every).astype(acc_dtype)  # softmax pass 1
    m = s.max(axis=-1)
    if softmax_passes == 1:  # one fused pass: a row stays on chip from max to P
        p = np.exp(s - safe_max(m)[..., None])
        l = p.sum(axis=-1)
    else:
        if softmax_passes == 3:  # m goes to HBM; pass 2 reads S and m again for l
            mem.store("m", m_hbm, every, m)
            s, m = mem.load("S", S, every).astype(acc_dtype), mem.load("m", m_hbm, every)
        l = np.exp(s - safe_max(m)[..., None]).sum(axis=-1)
        if softmax_passes == 2:  # pass 1 found m and l together
            mem.store("m", m_hbm, every, m)
        mem.store("l", l_hbm, every, l)
        s, m, l = (mem.load("S", S, every).astype(acc_dtype), mem.load("m", m_hbm, every),
                   mem.load("l", l_hbm, every))
        p = np.exp(s - safe_max(m)[..., None])  # the last pass writes P
    mem.store("P", P, every, p / np.where(l == 0, 1, l)[..., None])
    out = mem.load("P", P, every).astype(acc_dtype) @ mem.load("V", v, every).astype(acc_dtype)
    mem.store("O", O, every, out)
    if return_lse:
        mem.store("lse", L, every, nan_lse_where_out_is_nan(out, lse_of_rebased(finalize_lse(m, l), opts, mask)))
    return O, L


def run_counted(q, k, v, *, schedule: str = "fa2", block_q: int | None = None, block_k: int | None = None,
                skip_empty_tiles: bool = True, softmax_passes: int = 1, return_lse: bool = False,
                sram_capacity: int | None = None, **options) -> Counted:
    """Run ``schedule`` on real inputs, counting every HBM byte and the SRAM peak.

    q: (B, H, Nq, D), k / v: (B, Hk, Nk, D / Dv), and ``options`` as for
    ``course_lib.attention`` (validated the same way); the tiles are
    ``block_q`` x ``block_k``, by default flash_numpy's (``launch.DEFAULT_TILES``).
    Returns a ``Counted`` whose ``traffic`` equals ``iomodel.attention_io`` with the same arguments,
    whose ``out`` (and ``lse``) match the reference, and whose ``sram_peak``
    equals ``sram.tile_budget(block_q, block_k, D, dtype).total_bytes`` for the
    tiled schedules once a full tile fits the shape.  ``sram_capacity`` makes
    the chip raise ``MemoryError`` when a schedule would overflow it.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if softmax_passes not in (1, 2, 3):
        raise ValueError(f"softmax_passes must be 1, 2 or 3, got {softmax_passes!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if isinstance(x, np.ndarray) and 0 in x.shape:
            raise ValueError(f"run_counted needs non-empty inputs, got {name} of shape {x.shape}")
    stats, sram = TileStats(), SRAM(sram_capacity)
    chip = Chip(stats, sram)

    def forward(q, k, v, opts, mask):
        batch, heads, nq, _ = q.shape
        group = heads // k.shape[1]
        Br, Bc = tile_sizes(opts, *DEFAULT_TILES["flash_numpy"])
        out = np.zeros((batch, heads, nq, v.shape[3]), q.dtype)
        lse = np.full((batch, heads, nq), -np.inf, rules.lse_dtype(q.dtype))
        for b in range(batch):  # one (batch, head) at a time: one thread block's view of the chip
            for h in range(heads):
                one = np.s_[b:b + 1, h:h + 1]
                kv = np.s_[b:b + 1, h // group:h // group + 1]
                head_opts = opts if opts.alibi_slopes is None else replace(opts, alibi_slopes=opts.alibi_slopes[one])
                if schedule == "naive":
                    o, l = _naive(q[one], k[kv], v[kv], head_opts, mask, chip, stats, softmax_passes, return_lse)
                else:
                    loop = _two_pass if schedule == "two_pass" else LOOPS[schedule]
                    o, l = loop(q[one], k[kv], v[kv], head_opts, mask, Br, Bc, chip, stats, skip_empty_tiles,
                                return_lse)
                out[one], lse[one] = o, l
        return out, lse

    out, lse = call_forward(forward, q, k, v, return_lse=True, block_q=block_q, block_k=block_k, **options)
    return Counted(out, lse if return_lse else None, traffic_of(schedule, stats), sram.peak, sram.peak_buffers)
