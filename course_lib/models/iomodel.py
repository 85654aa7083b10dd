"""How many bytes attention moves, level by level: the model.

A GPU has three levels of memory that matter here:

    registers / shared memory   on chip, per SM: the tiles live here
    L2                          on chip, shared by every SM (50 MB on an H100 or H200)
    HBM                         off chip, large and slow

``attention_io`` is the FlashAttention paper's two-level count: the bytes a
schedule moves between the chip's registers / shared memory and the memory
below them, which is L2 and HBM *together*.  It is exact for four schedules:

``naive``   S = scale Q K^T is written out; the softmax reads S in
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
            outside: O, m and l start in memory (written once to 0, -inf, 0,
            O in the accumulator's dtype); K_j and V_j are read once; for every
            (j, i) step Q_i, O_i, m_i, l_i are read and O_i, m_i, l_i written
            back; at float16 / bfloat16 a last pass reads O and writes it in
            the input dtype.

What is counted, in bytes, per tensor: element reads and writes of Q, K, V,
O, S, P at the input dtype's size, and of m, l, lse (and FA1's O scratch) at
the accumulator's (float32; float64 for float64 inputs).  ``return_lse`` adds
the lse write (fa1: its last pass reads m and l).  FLOPs are those of the
matrix products executed (2 per multiply-add: QK^T and PV, QK^T twice for
``two_pass``); ``exps`` counts exponentials of score elements (the O(Br)
rescaling exponentials are left out).  With a mask and ``skip_empty_tiles``
the tiled schedules skip tiles no query in them can see; naive always computes
all of S.  Batch and heads multiply everything; with GQA every query head
reads its K/V head.  ``course_lib.kernels.counted`` runs the same schedules on a
counted memory, and the tests hold the two equal byte for byte.

What reaches HBM is less: the thread blocks of one head run at the same time
and read the same K / V tiles, so after the first block has brought a tile
into L2 the others find it there.  ``levels`` adds that third level: while the
K and V of the heads in flight fit in L2, HBM carries only the compulsory
traffic (Q, K, V read once, O and lse written once); when they do not (long
sequences, many heads in flight, a small L2) the re-reads go to HBM again.
The ncu counters of an H200 (``MEASURED_NCU``) put PyTorch's FA2 kernel
close to both predictions.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..core import hardware as presets
from ..core import rules
from ..core.masks import MaskSpec
from ..kernels.counted import SCHEDULES, Traffic, traffic
from ..kernels.launch import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q
from . import sram


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
    return rules.itemsize(dtype), rules.itemsize(rules.acc_dtype(dtype))


def _positive(**sizes):
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")


def attention_io(schedule: str, seqlen_q: int, seqlen_k: int | None = None, head_dim: int = 64,
                 dtype="float16", *, head_dim_v: int | None = None, block_q: int = DEFAULT_BLOCK_Q,
                 block_k: int = DEFAULT_BLOCK_K,
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
            # the O scratch is kept in the accumulator's dtype (s bytes an element)
            reads.update(K=kv_keys * d * b, V=kv_keys * dv * b, Q=step_rows * d * b, O=step_rows * dv * s,
                         m=step_rows * s, l=step_rows * s)
            writes.update(O=(nq + step_rows) * dv * s, m=(nq + step_rows) * s, l=(nq + step_rows) * s)
            if b != s:  # low precision: a last pass reads the scratch and writes O in the input dtype
                reads.update(O=nq * dv * s)
                writes.update(O=nq * dv * b)
            if return_lse:
                reads.update(m=nq * s, l=nq * s)
                writes.update(lse=nq * s)
            flops = 2 * area * (d + dv)
        exps = area
    scale = lambda c: {k: v * bh for k, v in c.items()}
    return traffic(schedule, flops * bh, exps * bh, scale(reads), scale(writes))


def naive_io(seqlen_q, seqlen_k=None, head_dim=64, dtype="float16", **options) -> Traffic:
    """``attention_io("naive", ...)``."""
    return attention_io("naive", seqlen_q, seqlen_k, head_dim, dtype, **options)


def flash_io(seqlen_q, seqlen_k=None, head_dim=64, dtype="float16", *, order="fa2", **options) -> Traffic:
    """``attention_io(order, ...)`` for a tiled schedule: "fa2" (default), "fa1" or "two_pass"."""
    if order == "naive":
        raise ValueError("flash_io is for tiled schedules; use naive_io for naive attention")
    return attention_io(order, seqlen_q, seqlen_k, head_dim, dtype, **options)


def matmul_io(m: int, n: int, k: int, dtype="float32") -> Traffic:
    """C (m x n) = A (m x k) B (k x n), each matrix moved once: 2mnk FLOPs, (mk + kn + mn) elements."""
    b = rules.itemsize(dtype)
    return traffic("matmul", 2 * m * n * k, 0, {"A": m * k * b, "B": k * n * b}, {"C": m * n * b})


# -- the IO law: IO ~ c N^2 D^2 / M ----------------------------------------------------

def tile_for_sram(sram_bytes: int, head_dim: int, dtype="float16") -> int:
    """The paper's idealisation: rows B of square tiles if only the Q, K, V and O tiles (4 B D elements)
    had to fit in ``sram_bytes``.  No tile this large fits a real budget: the B x B score tile and the
    float32 accumulators need room too (``fitting_tile`` counts them); B = M / (4 D b) gives the law
    its shape, not a tile a kernel can use."""
    return max(1, int(sram_bytes) // (4 * head_dim * rules.itemsize(dtype)))


def fitting_tile(sram_bytes: int, head_dim: int, dtype="float16") -> tuple:
    """(block_q, block_k): the tile FA2 can run with ``sram_bytes`` on chip for everything of one tile program.

    Everything: the Q, K and V tiles, the score tile S / P, the row max and sum and the float32 output
    accumulator, as ``sram.tile_budget`` counts them.  The key tile is short, as in the FlashAttention
    paper (which takes B_r = min(M / 4d, d) for its inner tile): B_c = D, halved until a query tile at
    least as tall fits; the query tile, whose height K and V's re-reads divide by, takes the rest.
    """
    d = int(head_dim)
    block_k = d
    while block_k >= 1:
        lo, hi = 0, max(1, int(sram_bytes) // d)
        while lo < hi:  # the tallest query tile whose whole budget fits
            mid = (lo + hi + 1) // 2
            if sram.tile_budget(mid, block_k, d, dtype).total_bytes <= sram_bytes:
                lo = mid
            else:
                hi = mid - 1
        if lo >= block_k:
            return lo, block_k
        block_k //= 2
    raise ValueError(f"no tile of head dim {d} fits {sram_bytes} bytes")


@dataclass(frozen=True)
class LawFit:
    """A fit of IO = c N^a D^b M^g to modelled traffic, and of c with (a, b, g) = (2, 2, -1)."""

    c: float  # bytes, with M in bytes: IO ~ c N^2 D^2 / M
    exponents: tuple  # free fit (a, b, g) of N, D, M
    max_rel_error: float  # worst |c N^2 D^2 / M - IO| / IO over the points
    points: list = field(repr=False, default_factory=list)


def io_law_points(seqlens, head_dims, sram_sizes, dtype="float16", schedule="fa2", tiles="idealised") -> list:
    """Modelled HBM bytes of ``schedule`` on a grid of N, D, M, with the paper's idealised square tiles
    (``tile_for_sram``) or, with ``tiles="fitting"``, tiles whose whole budget fits (``fitting_tile``)."""
    if tiles not in ("idealised", "fitting"):
        raise ValueError(f'tiles must be "idealised" or "fitting", got {tiles!r}')
    points = []
    for n in seqlens:
        for d in head_dims:
            for m in sram_sizes:
                if tiles == "idealised":
                    block_q = block_k = tile_for_sram(m, d, dtype)
                else:
                    block_q, block_k = fitting_tile(m, d, dtype)
                io = attention_io(schedule, n, n, d, dtype, block_q=block_q, block_k=block_k).bytes
                points.append(dict(N=n, D=d, M=m, tile=block_q, block_k=block_k, bytes=io))
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




def flash_intensity_for_budget(sram_bytes: int, head_dim: int, dtype="float16") -> float:
    """FA2's intensity at large N with the paper's idealised square tiles: about M / (2 D b^2) FLOP per byte.

    With B = M / (4 D b) rows per tile (``tile_for_sram``, an idealisation: no such tile fits once
    S and the accumulators are counted, and a tile that fits reaches several times less), K and V are read
    N / B times: 4 N^2 D FLOPs over 2 N D b N / B bytes, that is 2 B / b, or
    M / (2 D b) FLOP per element moved.  For a fixed on-chip budget the
    intensity falls as D grows: a larger head dim leaves room for fewer rows.
    """
    b = rules.itemsize(dtype)
    return 2 * tile_for_sram(sram_bytes, head_dim, dtype) / b


# -- the third level: L2 ------------------------------------------------------------------

@dataclass(frozen=True)
class Levels:
    """Attention's traffic at the levels of a GPU's memory, for one schedule on one machine.

    ``on_chip`` is the two-level count (``attention_io``): bytes between the
    SMs' registers / shared memory and L2-plus-HBM.  ``compulsory_bytes``: Q,
    K, V read once, O (and lse) written once, what HBM must carry whatever the
    kernel does.  ``kv_working_set``: the K and V bytes of the heads whose
    thread blocks run at once; while it fits in ``l2_capacity`` the K / V
    re-reads hit in L2 and ``hbm_bytes`` is the compulsory traffic; when it
    does not, ``hbm_bytes`` is the two-level count (every re-read charged to
    HBM: the pessimistic end, since L2 still catches some).
    """

    schedule: str
    on_chip: Traffic
    compulsory_bytes: int
    concurrent_blocks: int
    blocks_per_head: int  # Tr: the query tiles of one head, launched next to each other
    heads_in_flight: int  # K/V heads whose blocks run at once
    kv_working_set: int
    l2_capacity: int
    kv_fits_l2: bool
    hbm_bytes: int

    @property
    def flops(self) -> int:
        return self.on_chip.flops

    @property
    def l2_bytes(self) -> int:
        """Traffic between the SMs and L2: the two-level count."""
        return self.on_chip.bytes

    def reason(self) -> str:
        mib = 2 ** 20
        verdict = "fit" if self.kv_fits_l2 else "do NOT fit"
        return (f"{self.concurrent_blocks} blocks in flight, {self.blocks_per_head} per head: K/V of "
                f"{self.heads_in_flight} head(s) = {self.kv_working_set / mib:,.1f} MiB {verdict} in "
                f"{self.l2_capacity / mib:,.0f} MiB of L2")


def compulsory_bytes(batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, head_dim_v=None, dtype="float16",
                     *, return_lse=False) -> int:
    """Q, K, V read once and O written once (and lse, in the accumulator's dtype): what HBM must carry."""
    dv = head_dim if head_dim_v is None else head_dim_v
    b, s = _sizes(dtype)
    elements = batch * heads * seqlen_q * (head_dim + dv) + batch * heads_k * seqlen_k * (head_dim + dv)
    return int(elements * b + (batch * heads * seqlen_q * s if return_lse else 0))


def levels(seqlen_q, seqlen_k=None, head_dim=64, dtype="float16", hw="h100_sxm", *, schedule="fa2",
           batch=1, heads=1, heads_k=None, head_dim_v=None, block_q=DEFAULT_BLOCK_Q, block_k=DEFAULT_BLOCK_K,
           num_warps=4, concurrent_blocks=None, return_lse=False, **options) -> Levels:
    """The two-level count, the compulsory HBM traffic and whether a head's K / V stay in L2 on ``hw``.

    FA2's grid puts the Tr query tiles of one head next to each other, so the
    blocks in flight (``concurrent_blocks``, by default SMs x blocks per SM
    from ``sram.tile_fit`` of the tile) cover about concurrent / Tr + 1
    heads, and those heads' K and V are what L2 must hold.  ``options`` are
    ``attention_io``'s mask options.
    """
    nk = seqlen_q if seqlen_k is None else seqlen_k
    dv = head_dim if head_dim_v is None else head_dim_v
    heads_k = heads if heads_k is None else heads_k
    machine = presets.hardware(hw)
    if machine.l2 is None:
        raise ValueError(f"{machine.name} has no L2 between its SRAM and DRAM; levels needs one")
    on_chip = attention_io(schedule, seqlen_q, nk, head_dim, dtype, head_dim_v=dv, block_q=block_q,
                           block_k=block_k, batch=batch, heads=heads, return_lse=return_lse, **options)
    if concurrent_blocks is None:
        occ = sram.tile_fit(sram.tile_budget(block_q, block_k, head_dim, dtype, head_dim_v=dv), machine,
                             num_warps)
        concurrent_blocks = int(float(machine.units)) * max(occ.blocks_per_unit, 1)
    _positive(concurrent_blocks=concurrent_blocks)
    tr = -(-seqlen_q // block_q)
    in_flight = min(batch * heads, -(-(concurrent_blocks - 1) // tr) + 1)  # a window of blocks spans this many
    kv_heads = min(batch * heads_k, in_flight)  # GQA: query heads of a group share one K / V
    working_set = kv_heads * nk * (head_dim + dv) * rules.itemsize(dtype)
    capacity = int(float(machine.l2))
    fits = working_set <= capacity
    floor = compulsory_bytes(batch, heads, heads_k, seqlen_q, nk, head_dim, dv, dtype, return_lse=return_lse)
    return Levels(schedule, on_chip, floor, int(concurrent_blocks), tr, kv_heads, working_set, capacity, fits,
                  floor if fits else on_chip.bytes)


# -- measured: what the hardware counters saw --------------------------------------------

MEASURED_NCU = [
    # PyTorch's FlashAttention-2 kernel (SDPA flash), fp16, B=2, H=16, D=128, non-causal, on the course's H200,
    # one call after warm-up under ncu --clock-control none: bytes to and from DRAM, and L2 traffic (run
    # 20261207T183811+0000 of benchmarks/gpu_peaks.py --ncu, notebooks/records/gpu_peaks.jsonl)
    dict(kernel="PyTorch SDPA flash (FA2), fp16", machine="h200", batch=2, heads=16, head_dim=128, seqlen=4096,
         dram_bytes=136.3e6, l2_bytes=2.758e9, kind="measured", date="2026-12-07",
         source="ncu --clock-control none on the course's H200, run 20261207T183811+0000"),
    dict(kernel="PyTorch SDPA flash (FA2), fp16", machine="h200", batch=2, heads=16, head_dim=128, seqlen=16384,
         dram_bytes=659.5e6, l2_bytes=45.18e9, kind="measured", date="2026-12-07",
         source="ncu --clock-control none on the course's H200, run 20261207T183811+0000"),
]
