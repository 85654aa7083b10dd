"""How many bytes attention moves between HBM and the chip: the model, and a count.

Two levels of memory: HBM (large, slow, off chip) and SRAM (small, fast, on
chip).  A kernel's time is bounded below by the bytes it moves between them
(``roofline``), so the course counts them exactly, for four schedules:

``naive``   S = scale Q K^T is written to HBM; the softmax reads S in
            ``softmax_passes`` passes and writes P; O = P V reads P.
              passes=1  read S, write P          (a fused softmax: the FlashAttention paper's Algorithm 0)
              passes=2  read S, write m and l;   read S, m, l, write P
              passes=3  read S, write m;  read S, m, write l;  read S, m, l, write P
``two_pass`` tiled, no online softmax: for each query tile, pass 1 reads every K
            tile to find the row max m, pass 2 reads K and V again to sum and
            accumulate.  K is read twice per query tile; nothing N^2 is stored.
``fa2``     FlashAttention-2's loop order, query tiles outside: Q_i read once,
            K_j and V_j read once per query tile, m and l stay on chip, O_i
            written once.
``fa1``     FlashAttention-1's loop order (the paper's Algorithm 1), key tiles
            outside: O, m and l start in HBM (written once to 0, -inf, 0);
            K_j and V_j are read once; for every (j, i) step Q_i, O_i, m_i,
            l_i are read and O_i, m_i, l_i written back.

What is counted, in bytes, per tensor: element reads and writes of Q, K, V,
O, S, P at the input dtype's size, and of m, l, lse at the accumulator's
(float32; float64 for float64 inputs).  ``return_lse`` adds the lse write
(fa1: a last pass reads m and l and writes lse).  FLOPs are those of the
matrix products executed (2 per multiply-add: QK^T and PV, QK^T twice for
``two_pass``); ``exps`` counts exponentials of score elements (the O(Br)
rescaling exponentials are left out).  With a mask and
``skip_empty_tiles`` the tiled schedules skip tiles no query in them can see
(``masks.MaskSpec.tile_kind``); naive always computes all of S.  Batch and
heads multiply everything; with GQA every query head reads its K/V head.

``run_counted`` runs the same four schedules for real, in numpy, with every
HBM access going through ``HBM.load`` / ``HBM.store`` (which count bytes) and
every on-chip buffer registered with ``SRAM`` (which tracks the peak).  The
tests hold ``attention_io(...) == run_counted(...).traffic`` on a grid of
shapes, tails included, and the output equal to the reference.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from . import api, roofline, sram
from .masks import EMPTY, FULL, MaskSpec, tile_ranges
from .reference import safe_max

SCHEDULES = ("naive", "two_pass", "fa1", "fa2")


# -- what a schedule costs -----------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    """FLOPs, exponentials and HBM bytes of one attention call, per tensor."""

    schedule: str
    flops: int
    exps: int
    reads: dict  # tensor name -> bytes read from HBM
    writes: dict  # tensor name -> bytes written to HBM

    @property
    def read_bytes(self) -> int:
        return sum(self.reads.values())

    @property
    def write_bytes(self) -> int:
        return sum(self.writes.values())

    @property
    def bytes(self) -> int:
        """All HBM traffic, reads plus writes."""
        return self.read_bytes + self.write_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte of HBM traffic."""
        return self.flops / self.bytes if self.bytes else math.inf

    def table(self) -> str:
        """Per-tensor reads and writes as fixed-width text."""
        names = sorted(set(self.reads) | set(self.writes), key=_TENSOR_ORDER.index)
        lines = [f"{self.schedule}: {self.flops:,} FLOP, {self.bytes:,} B of HBM traffic, "
                 f"intensity {self.intensity:.4g} FLOP/B",
                 f"  {'tensor':<7}{'read B':>16}{'written B':>16}"]
        for n in names:
            lines.append(f"  {n:<7}{self.reads.get(n, 0):>16,}{self.writes.get(n, 0):>16,}")
        return "\n".join(lines)


_TENSOR_ORDER = ["Q", "K", "V", "S", "P", "m", "l", "O", "lse"]


def _traffic(schedule, flops, exps, reads, writes) -> Traffic:
    """A Traffic with zero entries dropped, so a model and a count compare equal."""
    clean = lambda d: {k: int(v) for k, v in d.items() if v}  # noqa: E731
    return Traffic(schedule, int(flops), int(exps), clean(reads), clean(writes))


def _key_tile_ranges(mask: MaskSpec, block_q: int, block_k: int, skip: bool):
    """For each query tile, the first and last key tile a tiled schedule computes (last < first: none).

    A tile is skipped when ``mask.tile_kind`` calls it empty: its last row sees no
    key at or after the tile's first key, or its first row none at or before the
    tile's last.  Both key bounds grow with the row, so the tiles a query tile
    computes are one contiguous run; this is O(Tr), not O(Tr Tc).
    """
    tr, tc = -(-mask.seqlen_q // block_q), -(-mask.seqlen_k // block_k)
    if not skip or mask.is_trivial:
        return np.zeros(tr, np.int64), np.full(tr, tc - 1, np.int64)
    q0 = np.arange(tr, dtype=np.int64) * block_q
    q1 = np.minimum(q0 + block_q, mask.seqlen_q)
    lo, _ = mask.key_bounds(q0)
    _, hi = mask.key_bounds(q1 - 1)
    first = np.clip(lo, 0, None) // block_k
    last = np.clip(hi, None, mask.seqlen_k - 1) // block_k
    none = (hi < 0) | (lo > mask.seqlen_k - 1)
    return first, np.where(none, first - 1, last)


def _sizes(dtype):
    return sram.itemsize(dtype), sram.itemsize(sram.accumulator(dtype))


def _positive(**sizes):
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")


def attention_io(schedule: str, seqlen_q: int, seqlen_k: int | None = None, head_dim: int = 64,
                 dtype="float16", *, head_dim_v: int | None = None, block_q: int = 64, block_k: int = 64,
                 batch: int = 1, heads: int = 1, causal: bool = False, causal_align: str = "bottom_right",
                 window_size=(-1, -1), skip_empty_tiles: bool = True, softmax_passes: int = 1,
                 return_lse: bool = False) -> Traffic:
    """The model: FLOPs and HBM bytes of ``schedule`` (see the module docstring for what is counted)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    nq = seqlen_q
    nk = seqlen_q if seqlen_k is None else seqlen_k
    d = head_dim
    dv = head_dim if head_dim_v is None else head_dim_v
    _positive(seqlen_q=nq, seqlen_k=nk, head_dim=d, head_dim_v=dv, block_q=block_q, block_k=block_k,
              batch=batch, heads=heads)
    b, s = _sizes(dtype)
    bh = batch * heads
    reads, writes = Counter(), Counter()
    if schedule == "naive":
        if softmax_passes not in (1, 2, 3):
            raise ValueError(f"softmax_passes must be 1, 2 or 3, got {softmax_passes!r}")
        reads.update(Q=nq * d * b, K=nk * d * b, V=nk * dv * b, S=softmax_passes * nq * nk * b, P=nq * nk * b)
        writes.update(S=nq * nk * b, P=nq * nk * b, O=nq * dv * b)
        if softmax_passes == 2:  # pass 1 writes m and l, pass 2 reads them
            writes.update(m=nq * s, l=nq * s)
            reads.update(m=nq * s, l=nq * s)
        elif softmax_passes == 3:  # m written once, read twice; l written once, read once
            writes.update(m=nq * s, l=nq * s)
            reads.update(m=2 * nq * s, l=nq * s)
        if return_lse:
            writes.update(lse=nq * s)
        flops = 2 * nq * nk * (d + dv)
        exps = (1 if softmax_passes == 1 else 2) * nq * nk
    else:
        mask = MaskSpec(nq, nk, bool(causal), causal_align, tuple(window_size))
        first, last = _key_tile_ranges(mask, block_q, block_k, skip_empty_tiles)
        rows = np.minimum(np.arange(1, len(first) + 1) * block_q, nq) - np.arange(len(first)) * block_q
        n_tiles = np.maximum(last - first + 1, 0)  # key tiles each query tile computes
        keys = np.where(n_tiles > 0, np.minimum((last + 1) * block_k, nk) - first * block_k, 0)
        area = int(rows @ keys)  # score elements computed
        keys_read = int(keys.sum())  # K rows read, summed over query tiles
        if schedule in ("fa2", "two_pass"):
            k_passes = 2 if schedule == "two_pass" else 1
            reads.update(Q=nq * d * b, K=k_passes * keys_read * d * b, V=keys_read * dv * b)
            writes.update(O=nq * dv * b, lse=nq * s if return_lse else 0)
            flops = 2 * area * (k_passes * d + dv)
        else:  # fa1
            tc = -(-nk // block_k)
            cover = np.zeros(tc + 1, np.int64)  # key tiles anyone computes: a union of runs
            np.add.at(cover, first[n_tiles > 0], 1)
            np.add.at(cover, last[n_tiles > 0] + 1, -1)
            used = np.cumsum(cover)[:tc] > 0
            tile_keys = np.minimum(np.arange(1, tc + 1) * block_k, nk) - np.arange(tc) * block_k
            kv_keys = int(tile_keys[used].sum())  # each key tile read once, if anyone sees it
            step_rows = int(rows @ n_tiles)  # query rows touched, summed over steps
            reads.update(K=kv_keys * d * b, V=kv_keys * dv * b, Q=step_rows * d * b, O=step_rows * dv * b,
                         m=step_rows * s, l=step_rows * s)
            writes.update(O=(nq + step_rows) * dv * b, m=(nq + step_rows) * s, l=(nq + step_rows) * s)
            if return_lse:
                reads.update(m=nq * s, l=nq * s)
                writes.update(lse=nq * s)
            flops = 2 * area * (d + dv)
        exps = area
    scale = lambda c: {k: v * bh for k, v in c.items()}  # noqa: E731
    return _traffic(schedule, flops * bh, exps * bh, scale(reads), scale(writes))


def naive_io(seqlen_q, seqlen_k=None, head_dim=64, dtype="float16", **options) -> Traffic:
    """``attention_io("naive", ...)``."""
    return attention_io("naive", seqlen_q, seqlen_k, head_dim, dtype, **options)


def flash_io(seqlen_q, seqlen_k=None, head_dim=64, dtype="float16", *, order="fa2", **options) -> Traffic:
    """``attention_io(order, ...)`` for a tiled schedule: "fa2" (default), "fa1" or "two_pass"."""
    if order == "naive":
        raise ValueError("flash_io is for tiled schedules; use naive_io for naive attention")
    return attention_io(order, seqlen_q, seqlen_k, head_dim, dtype, **options)


def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal=False) -> float:
    """The FLOP count speeds are quoted in: 4 B H Nq Nk D, halved for causal.

    Two matmuls, 2 FLOPs a multiply-add: the convention of the FlashAttention
    papers and Triton's tutorial.  Halving for causal credits a kernel that
    skips the masked half only with the work the mask leaves.
    """
    flops = 4 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else float(flops)


def matmul_io(m: int, n: int, k: int, dtype="float32") -> Traffic:
    """C (m x n) = A (m x k) B (k x n), each matrix moved once: 2mnk FLOPs, (mk + kn + mn) elements."""
    b = sram.itemsize(dtype)
    return _traffic("matmul", 2 * m * n * k, 0, {"A": m * k * b, "B": k * n * b}, {"C": m * n * b})


# -- the roofline bound -------------------------------------------------------------

@dataclass(frozen=True)
class Bound:
    """The least time a schedule can take on a machine, and what sets it."""

    compute_s: float
    memory_s: float
    exp_s: float  # 0 when the machine has no exp figure
    seconds: float
    limiter: str  # "compute", "memory" or "exp"
    flops_per_s: float  # the attainable speed: FLOPs / seconds


def time_bound(traffic: Traffic, hw, dtype="float16", *, source: str = "datasheet",
               include_exp: bool = True) -> Bound:
    """max(FLOPs / peak, bytes / bandwidth, exps / exp rate): no kernel can beat it."""
    hw = roofline.hardware(hw) if not isinstance(hw, roofline.Measurement) else hw.as_hardware()
    name = hw.rate_dtype(dtype)
    terms = {"compute": traffic.flops / hw.peak(name, source),
             "memory": traffic.bytes / hw.memory_bandwidth(source),
             "exp": traffic.exps / float(hw.exp_per_s) if include_exp and hw.exp_per_s is not None else 0.0}
    limiter = max(terms, key=terms.get)
    seconds = terms[limiter]
    return Bound(terms["compute"], terms["memory"], terms["exp"], seconds, limiter,
                 traffic.flops / seconds if seconds else math.inf)


# -- the IO law: IO ~ c N^2 D^2 / M ----------------------------------------------------

def tile_for_sram(sram_bytes: int, head_dim: int, dtype="float16") -> int:
    """Rows B of square tiles such that the Q, K, V and O tiles (4 B D elements) fill ``sram_bytes``."""
    return max(1, int(sram_bytes) // (4 * head_dim * sram.itemsize(dtype)))


@dataclass(frozen=True)
class LawFit:
    """A fit of IO = c N^a D^b M^g to modelled traffic, and of c with (a, b, g) = (2, 2, -1)."""

    c: float  # bytes, with M in bytes: IO ~ c N^2 D^2 / M
    exponents: tuple  # free fit (a, b, g) of N, D, M
    max_rel_error: float  # worst |c N^2 D^2 / M - IO| / IO over the points
    points: list = field(repr=False, default_factory=list)


def io_law_points(seqlens, head_dims, sram_sizes, dtype="float16", schedule="fa2") -> list:
    """Modelled HBM bytes of ``schedule`` with tiles from ``tile_for_sram`` on a grid of N, D, M."""
    points = []
    for n in seqlens:
        for d in head_dims:
            for m in sram_sizes:
                tile = tile_for_sram(m, d, dtype)
                io = attention_io(schedule, n, n, d, dtype, block_q=tile, block_k=tile).bytes
                points.append(dict(N=n, D=d, M=m, tile=tile, bytes=io))
    return points


def fit_io_law(points) -> LawFit:
    """Fit IO ~ c N^2 D^2 / M to points from ``io_law_points`` (least squares in log space)."""
    n, d, m, io = (np.array([p[k] for p in points], dtype=float) for k in ("N", "D", "M", "bytes"))
    design = np.column_stack([np.ones_like(n), np.log(n), np.log(d), np.log(m)])
    coef, *_ = np.linalg.lstsq(design, np.log(io), rcond=None)
    shape = n ** 2 * d ** 2 / m
    c = float(np.exp(np.mean(np.log(io / shape))))
    err = float(np.max(np.abs(c * shape - io) / io))
    return LawFit(c, tuple(float(x) for x in coef[1:]), err, list(points))


# -- the count: a tiled kernel that moves its data through counted memories -------------

class HBM:
    """Off-chip memory: named arrays whose every load and store is counted in bytes."""

    def __init__(self):
        self.arrays = {}
        self.reads, self.writes = Counter(), Counter()

    def place(self, name, array):
        """Put an input (or an output buffer) in HBM; placing is free, it is already there."""
        self.arrays[name] = array
        return array

    def load(self, name, index):
        """Copy ``arrays[name][index]`` to the chip, counting its bytes."""
        tile = np.array(self.arrays[name][index])
        self.reads[name] += tile.nbytes
        return tile

    def store(self, name, index, value):
        """Write ``value`` to ``arrays[name][index]`` in that array's dtype, counting its bytes."""
        target = self.arrays[name]
        stored = np.asarray(value).astype(target.dtype)
        target[index] = stored
        self.writes[name] += np.broadcast_to(stored, target[index].shape).nbytes


class SRAM:
    """On-chip memory: which named buffers are live, how many bytes, and the peak."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.live = {}
        self.peak = 0
        self.peak_buffers = {}

    def hold(self, name, array):
        """Register ``array`` as the on-chip buffer ``name`` (replacing one of that name)."""
        self.live[name] = array.nbytes
        used = sum(self.live.values())
        if self.capacity is not None and used > self.capacity:
            raise MemoryError(f"SRAM overflow: {used:,} B live > {self.capacity:,} B ({self.live})")
        if used > self.peak:
            self.peak, self.peak_buffers = used, dict(self.live)
        return array

    def free(self, *names):
        for name in names:
            self.live.pop(name, None)


@dataclass
class Counted:
    """What ``run_counted`` computed and what it moved."""

    out: np.ndarray
    lse: np.ndarray | None
    traffic: Traffic
    sram_peak: int  # bytes
    sram_peak_buffers: dict  # buffer name -> bytes, at the peak


class _Kernel:
    """The four schedules, run on counted memories.  Names follow the paper (Qi, Kj, Vj, m, l)."""

    def __init__(self, hbm, chip, opts, mask, dtype, head_dim_v, skip, return_lse, softmax_passes):
        self.hbm, self.chip, self.opts, self.mask, self.dv = hbm, chip, opts, mask, head_dim_v
        self.dtype = np.dtype(dtype)
        self.acc = np.float64 if self.dtype == np.float64 else np.float32
        self.low = self.dtype.itemsize < 4
        self.skip, self.return_lse, self.passes = skip, return_lse, softmax_passes
        self.flops = self.exps = 0
        name = sram.dtype_name(self.dtype)
        self.P_LOW, self.O_LOW = f"P in {name}", f"O out in {name}"  # conversion buffers, as in sram.tile_budget

    # the arithmetic, counted: numpy stands in for the tensor cores (operands cast to the accumulator)
    def mm(self, a, b):
        self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return a.astype(self.acc) @ b.astype(self.acc)

    def exp(self, x):
        self.exps += x.size
        return np.exp(x)

    def scores(self, qi, kj, q0, q1, k0, k1):
        """S = scale Qi Kj^T (Br x Bc, accumulator dtype), -inf where the mask hides a key."""
        s = self.mm(qi, kj.T) * self.acc(self.opts.softmax_scale)
        if self.mask.tile_kind(q0, q1, k0, k1) != FULL and not self.mask.is_trivial:
            s = np.where(self.mask.visible(np.arange(q0, q1), np.arange(k0, k1)), s, -np.inf)
        return s

    def visits(self, q0, q1, k0, k1) -> bool:
        return not (self.skip and self.mask.tile_kind(q0, q1, k0, k1) == EMPTY)

    def pv(self, p, vj):
        """P Vj, with P rounded to the input dtype first at low precision (as the tensor cores read it)."""
        if self.low:
            p = self.chip.hold(self.P_LOW, p.astype(self.dtype))
        return self.mm(p, vj)

    def finish(self, where, o, m, l, q0, q1):
        """Epilogue of a query tile: O = O acc / l stored in the input dtype, and lse."""
        out = o / np.where(l == 0, 1, l)[:, None]
        if self.low:
            out = self.chip.hold(self.O_LOW, out.astype(self.dtype))
        self.hbm.store("O", where + (slice(q0, q1),), out)
        if self.return_lse:
            with np.errstate(divide="ignore"):
                self.hbm.store("lse", where + (slice(q0, q1),), np.where(l == 0, -np.inf, m + np.log(l)))

    # -- the schedules, for one (batch, head) ------------------------------------
    def fa2(self, bq, bk, block_q, block_k):
        chip, hbm, nq, nk = self.chip, self.hbm, self.mask.seqlen_q, self.mask.seqlen_k
        for q0, q1 in tile_ranges(nq, block_q):
            Qi = chip.hold("Q tile", hbm.load("Q", bq + (slice(q0, q1),)))
            m = chip.hold("m (row max)", np.full(q1 - q0, -np.inf, self.acc))
            l = chip.hold("l (row sum)", np.zeros(q1 - q0, self.acc))
            o = chip.hold("O accumulator", np.zeros((q1 - q0, self.dv), self.acc))
            for k0, k1 in tile_ranges(nk, block_k):
                if not self.visits(q0, q1, k0, k1):
                    continue
                Kj = chip.hold("K tile", hbm.load("K", bk + (slice(k0, k1),)))
                Vj = chip.hold("V tile", hbm.load("V", bk + (slice(k0, k1),)))
                S = chip.hold("S / P tile", self.scores(Qi, Kj, q0, q1, k0, k1))
                m_new = np.maximum(m, S.max(axis=1))
                P = self.exp(S - safe_max(m_new)[:, None])  # overwrites S in place on a GPU
                alpha = np.exp(m - safe_max(m_new))  # rescales what was summed under the old max
                l[:] = alpha * l + P.sum(axis=1)
                o[:] = alpha[:, None] * o + self.pv(P, Vj)
                m[:] = m_new
                chip.free("S / P tile", self.P_LOW)
            self.finish(bq, o, m, l, q0, q1)
            chip.free(*list(chip.live))

    def two_pass(self, bq, bk, block_q, block_k):
        chip, hbm, nq, nk = self.chip, self.hbm, self.mask.seqlen_q, self.mask.seqlen_k
        for q0, q1 in tile_ranges(nq, block_q):
            Qi = chip.hold("Q tile", hbm.load("Q", bq + (slice(q0, q1),)))
            m = chip.hold("m (row max)", np.full(q1 - q0, -np.inf, self.acc))
            seen = [(k0, k1) for k0, k1 in tile_ranges(nk, block_k) if self.visits(q0, q1, k0, k1)]
            for k0, k1 in seen:  # pass 1: the row max, nothing else
                Kj = chip.hold("K tile", hbm.load("K", bk + (slice(k0, k1),)))
                S = chip.hold("S / P tile", self.scores(Qi, Kj, q0, q1, k0, k1))
                m[:] = np.maximum(m, S.max(axis=1))
                chip.free("S / P tile")
            l = chip.hold("l (row sum)", np.zeros(q1 - q0, self.acc))
            o = chip.hold("O accumulator", np.zeros((q1 - q0, self.dv), self.acc))
            for k0, k1 in seen:  # pass 2: m is final, so exp(S - m) never needs rescaling
                Kj = chip.hold("K tile", hbm.load("K", bk + (slice(k0, k1),)))
                Vj = chip.hold("V tile", hbm.load("V", bk + (slice(k0, k1),)))
                S = chip.hold("S / P tile", self.scores(Qi, Kj, q0, q1, k0, k1))
                P = self.exp(S - safe_max(m)[:, None])
                l += P.sum(axis=1)
                o += self.pv(P, Vj)
                chip.free("S / P tile", self.P_LOW)
            self.finish(bq, o, m, l, q0, q1)
            chip.free(*list(chip.live))

    def fa1(self, bq, bk, block_q, block_k):
        chip, hbm, nq, nk = self.chip, self.hbm, self.mask.seqlen_q, self.mask.seqlen_k
        rows_all = bq + (slice(0, nq),)
        hbm.store("O", rows_all, 0)  # Algorithm 1, line 2: O, l, m initialised in HBM
        hbm.store("l", rows_all, 0)
        hbm.store("m", rows_all, -np.inf)
        for k0, k1 in tile_ranges(nk, block_k):
            steps = [(q0, q1) for q0, q1 in tile_ranges(nq, block_q) if self.visits(q0, q1, k0, k1)]
            if not steps:
                continue
            Kj = chip.hold("K tile", hbm.load("K", bk + (slice(k0, k1),)))
            Vj = chip.hold("V tile", hbm.load("V", bk + (slice(k0, k1),)))
            for q0, q1 in steps:
                rows = bq + (slice(q0, q1),)
                Qi = chip.hold("Q tile", hbm.load("Q", rows))
                o = chip.hold("O accumulator", hbm.load("O", rows).astype(self.acc))
                m = chip.hold("m (row max)", hbm.load("m", rows))
                l = chip.hold("l (row sum)", hbm.load("l", rows))
                S = chip.hold("S / P tile", self.scores(Qi, Kj, q0, q1, k0, k1))
                m_new = np.maximum(m, S.max(axis=1))
                P = self.exp(S - safe_max(m_new)[:, None])
                alpha = np.exp(m - safe_max(m_new))
                l_new = alpha * l + P.sum(axis=1)
                # O is kept normalised in HBM (the paper's form): undo the old 1/l, add P V, divide by the new l
                o = (alpha * l)[:, None] * o + self.pv(P, Vj)
                o = o / np.where(l_new == 0, 1, l_new)[:, None]
                chip.free("S / P tile", self.P_LOW)
                if self.low:
                    o = chip.hold(self.O_LOW, o.astype(self.dtype))
                hbm.store("O", rows, o)
                hbm.store("m", rows, m_new)
                hbm.store("l", rows, l_new)
                chip.free("Q tile", "O accumulator", "m (row max)", "l (row sum)", self.O_LOW)
            chip.free("K tile", "V tile")
        if self.return_lse:  # a last pass: lse = m + log l
            m, l = hbm.load("m", rows_all), hbm.load("l", rows_all)
            with np.errstate(divide="ignore"):
                hbm.store("lse", rows_all, np.where(l == 0, -np.inf, m + np.log(l)))

    def naive(self, bq, bk):
        hbm, nq, nk = self.hbm, self.mask.seqlen_q, self.mask.seqlen_k
        full = lambda w: w + (slice(None),)  # noqa: E731
        Q, K = hbm.load("Q", full(bq)), hbm.load("K", full(bk))
        hbm.store("S", full(bq), self.scores(Q, K, 0, nq, 0, nk))
        S = hbm.load("S", full(bq)).astype(self.acc)  # softmax pass 1
        m = S.max(axis=1)
        if self.passes == 1:  # one fused pass: a row stays on chip from max to P
            P = self.exp(S - safe_max(m)[:, None])
            l = P.sum(axis=1)
        else:
            if self.passes == 3:  # m goes to HBM; pass 2 reads S and m again for l
                hbm.store("m", full(bq), m)
                S, m = hbm.load("S", full(bq)).astype(self.acc), hbm.load("m", full(bq))
            l = self.exp(S - safe_max(m)[:, None]).sum(axis=1)
            if self.passes == 2:  # pass 1 found m and l together
                hbm.store("m", full(bq), m)
            hbm.store("l", full(bq), l)
            S, m, l = hbm.load("S", full(bq)).astype(self.acc), hbm.load("m", full(bq)), hbm.load("l", full(bq))
            P = self.exp(S - safe_max(m)[:, None])  # the last pass writes P
        hbm.store("P", full(bq), P / np.where(l == 0, 1, l)[:, None])
        if self.return_lse:
            with np.errstate(divide="ignore"):
                hbm.store("lse", full(bq), np.where(l == 0, -np.inf, safe_max(m) + np.log(l)))
        P, V = hbm.load("P", full(bq)), hbm.load("V", full(bk))
        hbm.store("O", full(bq), self.mm(P, V))


def run_counted(q, k, v, *, schedule: str = "fa2", block_q: int = 64, block_k: int = 64, causal: bool = False,
                causal_align: str = "bottom_right", window_size=(-1, -1), skip_empty_tiles: bool = True,
                softmax_passes: int = 1, return_lse: bool = False, sram_capacity: int | None = None) -> Counted:
    """Run ``schedule`` on real inputs, counting every HBM byte and the SRAM peak.

    q: (B, H, Nq, D), k / v: (B, Hk, Nk, D / Dv), as for ``course_lib.attention``
    (inputs are validated the same way).  Returns a ``Counted`` whose
    ``traffic`` must equal ``attention_io`` with the same arguments, whose
    ``out`` (and ``lse``) must match the reference, and whose ``sram_peak``
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
    hbm, chip = HBM(), SRAM(sram_capacity)
    state = {}

    def forward(q, k, v, opts, mask):
        batch, heads, nq, _ = q.shape
        heads_k, dv = k.shape[1], v.shape[3]
        stat = np.float64 if q.dtype == np.float64 else np.float32
        for name, x in (("Q", q), ("K", k), ("V", v)):
            hbm.place(name, x)
        hbm.place("O", np.zeros((batch, heads, nq, dv), q.dtype))
        hbm.place("lse", np.full((batch, heads, nq), -np.inf, stat))
        if schedule == "naive":
            hbm.place("S", np.zeros((batch, heads, nq, mask.seqlen_k), q.dtype))
            hbm.place("P", np.zeros((batch, heads, nq, mask.seqlen_k), q.dtype))
        hbm.place("m", np.zeros((batch, heads, nq), stat))
        hbm.place("l", np.zeros((batch, heads, nq), stat))
        kernel = _Kernel(hbm, chip, opts, mask, q.dtype, dv, skip_empty_tiles, return_lse, softmax_passes)
        for b in range(batch):
            for h in range(heads):
                bq, bk = (b, h), (b, h // (heads // heads_k))
                if schedule == "naive":
                    kernel.naive(bq, bk)
                else:
                    getattr(kernel, schedule)(bq, bk, opts.block_q, opts.block_k)
        state["kernel"] = kernel
        return hbm.arrays["O"], hbm.arrays["lse"]

    out, lse = api.call_forward(forward, q, k, v, return_lse=True, causal=causal, causal_align=causal_align,
                                window_size=window_size, block_q=block_q, block_k=block_k)
    kernel = state["kernel"]
    traffic = _traffic(schedule, kernel.flops, kernel.exps, hbm.reads, hbm.writes)
    return Counted(out, lse if return_lse else None, traffic, chip.peak, chip.peak_buffers)
