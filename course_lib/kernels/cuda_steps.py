"""Chapter 10: the CUDA forward kernel, optimised one measured step at a time.

Every step is a real kernel, checked against the float64 reference before it
is timed (``tests/test_cuda_steps.py`` in the simulator, at small awkward
shapes; ``benchmarks/gpu_steps.py`` on the H200, at large ones).  Like
llm.c's ``attention_forward.cu``, the versions live side by side:

=================  ======================================================================
step               what changed, and why it should pay
=================  ======================================================================
``row``            chapter 09's kernel, unchanged: one thread per query row, K / V tiles
                   in shared memory, every thread reading every element of the tile.
``row_exp2``       the same kernel in base 2: log2(e) folded into the scale (and the
                   softcap and ALiBi slopes), ``exp2`` = one ``ex2.approx``, ``fastmath``.
``tiled``          register micro-tiles: a block of ``threads`` computes a ``Br x Bc``
                   tile of S, each thread an ``RM x RN`` piece of it and an ``RM x RE``
                   piece of O, so one value read from shared memory feeds RN (or RM)
                   FMAs instead of one.  Q is kept scaled in shared memory; P goes
                   through shared memory to the threads that own its rows of O.
``tiled_unsigned`` the same, with every shared-memory index cast to an unsigned integer.  A
                   Python index may be negative (``a[-1]``), so for a signed index numba
                   emits a test and an add for every access, in the innermost loop, more
                   integer instructions than FMAs; an unsigned index cannot be negative.
``tiled_padded``   the same, with every shared row padded by one float: the threads of
                   a warp read rows ``tx + TX c`` of K at one column, which without the
                   pad all sit in one bank (a ``TX``-way conflict).
``tiled_prefetch`` the next K / V tile is loaded from global memory into registers
                   while the current one is computed, and stored to shared memory
                   after it: the load latency hides behind arithmetic.
``tiled_vec4``     the micro-tiles rebuilt so that one shared load feeds many FMAs: every
                   operand read 4 floats at a time (``ld.shared.v4.f32``: rows padded to
                   multiples of 4 floats, a 16-byte-aligned buffer, constant-unrolled
                   unsigned indices), output dims owned in chunks of 4, row max and sum
                   by warp shuffles, P in its own buffer, the mask only on the tiles that
                   need one, and the grid run from the last query tile to the first (under
                   a causal mask the longest rows start first).  K / V still loaded and
                   stored element by element.
``tiled_staged``   ``tiled_vec4`` with every K / V load of a tile issued into registers
                   before the first is stored, a tile ahead (the loads of tile n + 1 in
                   flight while tile n is computed), at flat offsets (constants folded into
                   the load instructions).  ``tiled_vec4`` left the batching to the compiler,
                   which at D=128 unrolled its load loops only 8 deep (8 trips to memory per
                   tile, PTX), with the SM's one block waiting at each.
``tuned``          ``tiled_staged`` with the tile sizes and threads per block picked per
                   head dim by ``autotune`` (the choice is recorded).
=================  ======================================================================

Measured on an NVIDIA H200, one run (notebooks/records/gpu_steps.jsonl, run
20261201T142142+0000), B*H = 64, N = 4096, float32, TFLOP/s (naive torch fp32 22.6 / 31.8,
SDPA efficient 35.1 / 45.1 in the same run):

    step              D=64   D=128        step              D=64   D=128
    row               16.2    8.9         tiled_prefetch    13.6   10.5
    row_exp2          16.6    9.0         tiled_vec4        25.6   13.9
    tiled              6.4    5.3         tiled_staged      30.4   33.6
    tiled_unsigned     7.5    7.0         tuned             30.6   33.6
    tiled_padded      11.2   10.8

``tuned`` is 1.36x (D=64) and 1.06x (D=128) naive torch, 0.87x and 0.74x SDPA efficient;
causal at N = 8192 runs 1.98x / 1.99x faster than non-causal; decode split-KV (splits
from ``decode_splits``) 5.4x / 4.7x faster than one block per row, still far slower than
naive torch's matrix-vector products there (chapter 10, section 9).

Causal (and window) tile skipping is the host's, as in chapters 08 and 09:
``launch.prepare`` classifies the tiles, and here each query tile gets the
list of the key tiles it visits, so a skipped tile costs nothing, not even a
branch.  Split-KV (decode): ``splits > 1`` cuts each query tile's list of key
tiles into that many pieces, one block each, writing a partial (out, lse);
``merge_kernel`` combines them with the logsumexp rule of chapter 04;
``decode_splits`` picks the number: the fewest that give two full waves of
resident blocks.

Shared memory is one dynamic buffer (``cuda.shared.array(0, float32)``) cut
into Qs, Ks (which P reuses once S is done; tiled_vec4 gives P its own rows), Vs
and a small reduction area, so that a block may use more than the 48 KB a static
array is allowed; above 48 KB the driver must be told (``allow_shared``).  The scalar rules (mask, softcap,
ALiBi distance, the online-softmax step in base 2, finalize) are
``course_lib.core.rules``, compiled as device functions.

These kernels run on a GPU or in numba's simulator (``NUMBA_ENABLE_CUDASIM=1``);
``course_lib.cudacheck`` does not model dynamic shared memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

try:
    import numba
    from numba import cuda, float32
    from numba import int64, uint64
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    numba = None

from ..core import rules
from ..core.reference import nan_lse_where_out_is_nan
from . import flash_numba_cuda as ch09
from . import launch as host

STEPS = ("row", "row_exp2", "tiled", "tiled_unsigned", "tiled_padded", "tiled_prefetch", "tiled_vec4",
         "tiled_staged", "tuned")
STATIC_SHARED = 48 * 1024       # what a block gets without asking the driver
MAX_SHARED = 227 * 1024         # what an H100 / H200 block may get after asking


@dataclass(frozen=True)
class Tiling:
    """The compile-time shape of a micro-tiled kernel.

    ``threads`` threads form a TY x TX grid (TX = ``tx`` threads along keys /
    output dims, TY = threads // TX along query rows).  Thread (ty, tx) owns
    query rows ty + TY r (r < RM), keys tx + TX c (c < RN) of S and output
    dims tx + TX e (e < RE) of O: strided, so that the threads of a warp touch
    consecutive rows, keys and dims.
    """

    Br: int = 64             # query rows per block
    Bc: int = 32             # keys per tile
    threads: int = 128
    tx: int = 8
    pad: int = 1             # floats added to every shared row (0: bank conflicts)
    prefetch: bool = True    # next K / V tile into registers during the current one
    max_regs: int = 0        # a cap on registers per thread for the compiler (0: its own choice)
    unsigned: bool = True    # shared / global indices cast to uint64 (False: numba's wraparound code)
    vec: bool = False        # tiled_vec4's kernel: 16-byte shared loads, shuffles, heaviest tiles first
    # (for it, ``prefetch`` means tiled_staged's loads: a whole tile through registers, one ahead)

    @property
    def ty(self):
        return self.threads // self.tx

    @property
    def rm(self):
        return self.Br // self.ty

    @property
    def rn(self):
        return self.Bc // self.tx

    def check(self, D, Dv):
        if self.threads % self.tx or self.Br % self.ty or self.Bc % self.tx or self.threads > 1024:
            raise ValueError(f"{self}: threads must be a multiple of tx, Br of threads / tx and Bc of tx")
        if self.vec and (32 % self.tx or self.Bc % 4):
            raise ValueError(f"{self}: the vectorised kernel needs tx to divide a warp (32) and Bc a multiple of 4")
        if self.shared_bytes(D, Dv) > MAX_SHARED:
            raise ValueError(f"{self} needs {self.shared_bytes(D, Dv)} bytes of shared memory at D={D}, "
                             f"Dv={Dv}; a block gets at most {MAX_SHARED}")

    def layout(self, D, Dv):
        """Offsets (in floats) of Qs, Ks (= Ps), Vs, red in the dynamic buffer, and its size."""
        if self.vec:
            return self.vec_layout(D, Dv)
        re = -(-Dv // self.tx)
        dp, ep, bp = D + self.pad, re * self.tx, self.Bc + self.pad
        qs = 0
        ks = qs + self.Br * dp
        vs = ks + max(self.Bc * dp, self.Br * bp)   # P reuses Ks once S is computed
        red = vs + self.Bc * ep
        return dict(QS=qs, KS=ks, PS=ks, VS=vs, RED=red, DP=dp, EP=ep, BP=bp, RE=re,
                    size=red + self.Br * self.tx)

    def vec_layout(self, D, Dv):
        """tiled_vec4's buffer: every row a multiple of 4 floats (16 bytes, one ``ld.shared.v4``).
        Q and K rows are D4 = D rounded up to 4 (zeros past D), strided DP = D4 rounded up to 32,
        plus 4: the 8 threads that one 16-byte load serves at a time read 8 different rows, which
        then start in 8 different groups of 4 banks.  A thread owns output dims in chunks of 4
        (4 tx + 4 TX g + j), so V rows are EP = 4 TX RG wide.  P has its own rows (BP = Bc + 4)."""
        d4 = -(-D // 4) * 4
        dp = -(-d4 // 32) * 32 + 4
        rg = -(-Dv // (4 * self.tx))
        ep = 4 * self.tx * rg
        bp = self.Bc + 4
        qs = 0
        ks = qs + self.Br * dp
        vs = ks + self.Bc * dp
        ps = vs + self.Bc * ep
        red = ps + self.Br * bp
        return dict(QS=qs, KS=ks, PS=ps, VS=vs, RED=red, DP=dp, EP=ep, BP=bp, RE=4 * rg, RG=rg, D4=d4,
                    size=red + self.Br * self.tx)

    def shared_bytes(self, D, Dv):
        return 4 * self.layout(D, Dv)["size"]


# Decode (Nq = 1): a block of one warp per query row, its 32 threads along the keys and dims.
DECODE_TILING = Tiling(Br=1, Bc=32, threads=32, tx=32, pad=4, prefetch=True, vec=True)
SMS = 132                  # multiprocessors of an H100 / H200 (``decode_splits`` asks the GPU when it can)
DECODE_WAVES = 2           # split-KV aims at this many full waves of resident blocks
SIM_TILING = Tiling(Br=8, Bc=8, threads=16, tx=4)   # the simulators run a Python thread per CUDA thread

# What each step changes, as a Tiling (``tuned``'s comes from ``autotune``).
STEP_TILING = {
    "tiled": Tiling(pad=0, prefetch=False, unsigned=False),
    "tiled_unsigned": Tiling(pad=0, prefetch=False),
    "tiled_padded": Tiling(pad=1, prefetch=False),
    "tiled_prefetch": Tiling(pad=1, prefetch=True),
    "tiled_vec4": Tiling(Br=128, Bc=64, threads=256, tx=16, pad=4, prefetch=False, vec=True),
    "tiled_staged": Tiling(Br=128, Bc=64, threads=256, tx=16, pad=4, prefetch=True, vec=True),
}
# The autotuner's candidates: (Br, Bc, threads, tx), each with the pad and the prefetch.
CANDIDATES = [
    (64, 32, 128, 8), (64, 64, 128, 8), (64, 32, 256, 16), (64, 64, 256, 16), (128, 32, 256, 8),
    (128, 64, 256, 8), (128, 32, 128, 8), (32, 32, 64, 8), (64, 16, 128, 8), (128, 64, 256, 16),
]
TUNED = {}   # D -> Tiling, filled by autotune (or from a record with ``use_tuned``)


def available() -> bool:
    return numba is not None


if numba is not None:   # the shared rules, as chapter 09's module compiled them for the GPU
    visible, alibi_distance, softcap, max_nan = ch09.visible, ch09.alibi_distance, ch09.softcap, ch09.max_nan
    shift_of, rescale_exp2, finalize = ch09.shift_of, ch09.rescale_exp2, ch09.finalize

_KERNELS = {}


def make_tiled_kernel(tiling: Tiling, D: int, Dv: int):
    """The micro-tiled forward kernel for one Tiling and head dims D, Dv (built once, kept)."""
    key = (tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    tiling.check(D, Dv)
    L = tiling.layout(D, Dv)
    Br, Bc, NT, TX, TY, RM, RN = tiling.Br, tiling.Bc, tiling.threads, tiling.tx, tiling.ty, tiling.rm, tiling.rn
    QS, KS, PS, VS, RED, DP, EP, BP, RE = (L[n] for n in ("QS", "KS", "PS", "VS", "RED", "DP", "EP", "BP", "RE"))
    PREFETCH = tiling.prefetch
    U = uint64 if tiling.unsigned else int64   # int64(x) changes nothing: numba's wraparound code stays
    NK = -(-Bc * D // NT)            # K elements each thread carries to the next tile
    NV = -(-Bc * EP // NT)
    NEG_INF = float32(-math.inf)
    LN2 = float32(rules.LN2)

    caps = {} if numba.config.ENABLE_CUDASIM or not tiling.max_regs else {"max_registers": tiling.max_regs}

    @cuda.jit(fastmath=True, **caps)
    def tiled_forward_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes,
                             offset, left, right, out, lse):
        """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq): S = gridDim.z splits."""
        H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
        tr = cuda.blockIdx.x
        b = cuda.blockIdx.y // H
        h = cuda.blockIdx.y % H
        kh = kv_head[h]
        split = cuda.blockIdx.z
        t = cuda.threadIdx.x
        tx = t % TX
        ty = t // TX
        row0 = tr * Br
        sm = cuda.shared.array(0, float32)
        slope = float32(slopes[b, h])

        # This split's share of the query tile's list of key tiles.
        n_all = nvisit[tr]
        per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
        first = split * per
        last = min(n_all, first + per)

        for x in range(t, Br * D, NT):        # Q tile, scaled (log2 units), zero past Nq
            r = x // D
            d = x % D
            val = float32(0.0)
            if row0 + r < Nq:
                val = q[U(b), U(h), U(row0 + r), U(d)] * scale
            sm[U(QS + r * DP + d)] = val

        kreg = cuda.local.array(NK, float32)
        vreg = cuda.local.array(NV, float32)
        o = cuda.local.array((RM, RE), float32)
        m = cuda.local.array(RM, float32)
        l = cuda.local.array(RM, float32)
        s = cuda.local.array((RM, RN), float32)
        a = cuda.local.array(RM, float32)
        bk = cuda.local.array(RN, float32)
        pv = cuda.local.array(RE, float32)
        for r in range(RM):
            m[r] = NEG_INF
            l[r] = float32(0.0)
            for e in range(RE):
                o[r, e] = float32(0.0)

        if first < last:                      # the first tile straight to shared memory
            c0 = visit[tr, first] * Bc
            for u in range(NK):
                x = t + u * NT
                if x < Bc * D:
                    c = x // D
                    val = float32(0.0)
                    if c0 + c < Nk:
                        val = k[U(b), U(kh), U(c0 + c), U(x % D)]
                    sm[U(KS + c * DP + x % D)] = val
            for u in range(NV):
                x = t + u * NT
                if x < Bc * EP:
                    c = x // EP
                    e = x % EP
                    val = float32(0.0)
                    if c0 + c < Nk and e < Dv:
                        val = v[U(b), U(kh), U(c0 + c), U(e)]
                    sm[U(VS + c * EP + e)] = val

        for n in range(first, last):
            tc = visit[tr, n]
            kind = tiles[tr, tc]
            c0 = tc * Bc
            cuda.syncthreads()                # Ks, Vs (and Qs) complete
            has_next = n + 1 < last
            if PREFETCH and has_next:         # issue the next tile's loads now, use them later
                c1 = visit[tr, n + 1] * Bc
                for u in range(NK):
                    x = t + u * NT
                    c = x // D
                    kreg[u] = float32(0.0)
                    if x < Bc * D and c1 + c < Nk:
                        kreg[u] = k[U(b), U(kh), U(c1 + c), U(x % D)]
                for u in range(NV):
                    x = t + u * NT
                    c = x // EP
                    e = x % EP
                    vreg[u] = float32(0.0)
                    if x < Bc * EP and c1 + c < Nk and e < Dv:
                        vreg[u] = v[U(b), U(kh), U(c1 + c), U(e)]

            # S = Qs Ks^T on this thread's RM x RN micro-tile
            for r in range(RM):
                for c in range(RN):
                    s[r, c] = float32(0.0)
            for d in range(D):
                for r in range(RM):
                    a[r] = sm[U(QS + (ty + TY * r) * DP + d)]
                for c in range(RN):
                    bk[c] = sm[U(KS + (tx + TX * c) * DP + d)]
                for r in range(RM):
                    for c in range(RN):
                        s[r, c] += a[r] * bk[c]

            # the rules, the tail, the mask; each thread's share of its rows' max
            for r in range(RM):
                i = row0 + ty + TY * r
                mx = NEG_INF
                for c in range(RN):
                    j = c0 + tx + TX * c
                    sc = float32(softcap(s[r, c], cap))
                    if alibi:
                        sc -= slope * float32(alibi_distance(i, j, offset))
                    if j >= Nk or (kind == rules.PARTIAL and not visible(i, j, offset, left, right)):
                        sc = NEG_INF
                    s[r, c] = sc
                    mx = max_nan(mx, sc)
                sm[U(RED + (ty + TY * r) * TX + tx)] = mx
            cuda.syncthreads()                # every share written; nobody reads Ks any more

            # the row's new max (the TX threads of a row agree on it), P into shared memory
            for r in range(RM):
                row = ty + TY * r
                m_new = m[r]
                for x in range(TX):
                    m_new = max_nan(m_new, sm[U(RED + row * TX + x)])
                alpha = float32(rescale_exp2(m[r], m_new))
                shift = float32(shift_of(m_new))
                l[r] *= alpha
                for e in range(RE):
                    o[r, e] *= alpha
                m[r] = m_new
                for c in range(RN):
                    p = rules.exp2(s[r, c] - shift)
                    l[r] += p
                    sm[U(PS + row * BP + tx + TX * c)] = p
            cuda.syncthreads()                # P complete

            # O += P Vs on this thread's RM x RE micro-tile
            for c in range(Bc):
                for r in range(RM):
                    a[r] = sm[U(PS + (ty + TY * r) * BP + c)]
                for e in range(RE):
                    pv[e] = sm[U(VS + c * EP + tx + TX * e)]
                for r in range(RM):
                    for e in range(RE):
                        o[r, e] += a[r] * pv[e]
            cuda.syncthreads()                # everyone done with Ps (= Ks) and Vs

            if has_next:                      # the next tile into shared memory
                c1 = visit[tr, n + 1] * Bc
                for u in range(NK):
                    x = t + u * NT
                    if x < Bc * D:
                        if PREFETCH:
                            val = kreg[u]
                        else:
                            val = float32(0.0)
                            if c1 + x // D < Nk:
                                val = k[U(b), U(kh), U(c1 + x // D), U(x % D)]
                        sm[U(KS + (x // D) * DP + x % D)] = val
                for u in range(NV):
                    x = t + u * NT
                    if x < Bc * EP:
                        c = x // EP
                        e = x % EP
                        if PREFETCH:
                            val = vreg[u]
                        else:
                            val = float32(0.0)
                            if c1 + c < Nk and e < Dv:
                                val = v[U(b), U(kh), U(c1 + c), U(e)]
                        sm[U(VS + c * EP + e)] = val

        # each thread summed only its own keys: add the TX shares of every row's l
        cuda.syncthreads()
        for r in range(RM):
            sm[U(RED + (ty + TY * r) * TX + tx)] = l[r]
        cuda.syncthreads()
        for r in range(RM):
            row = ty + TY * r
            i = row0 + row
            total = float32(0.0)
            for x in range(TX):
                total += sm[U(RED + row * TX + x)]
            row_lse, inv_l = finalize(m[r] * LN2, total)
            if i < Nq:
                if tx == 0:
                    lse[split, b, h, i] = row_lse
                for e in range(RE):
                    if tx + TX * e < Dv:
                        out[split, b, h, i, tx + TX * e] = o[r, e] * float32(inv_l)

    _KERNELS[key] = tiled_forward_kernel
    return tiled_forward_kernel


def _tile_slot(NT, Bc, W):
    """Where the u-th of thread t's loads falls when NT threads load a Bc x W tile: (row c, column,
    whether it is inside the tile).  When the threads cover whole rows (NT % W == 0), thread t
    always loads column ``col`` = t % W of rows ``row0`` + (NT // W) u, with ``row0`` = t // W (both
    computed once, before the loops); otherwise it walks the flat tile."""
    whole_rows, rows = NT % W == 0, max(1, NT // W)

    @cuda.jit(device=True)
    def slot(u, t, row0, col):
        if whole_rows:
            c = row0 + u * rows
            return c, col, Bc % rows == 0 or c < Bc
        x = t + u * NT
        return x // W, x % W, x < Bc * W
    return slot


def make_vec_kernel(tiling: Tiling, D: int, Dv: int):
    """tiled_vec4: the micro-tiled kernel rebuilt so that one shared-memory load feeds many FMAs.

    ``tiled`` reads one float per load: its S loop issues RM + RN loads for RM x RN FMAs, its
    O loop RM + RE for RM x RE, and a multiprocessor issues one shared load per clock against
    four FMA instructions.  Here every operand comes four floats at a time (one
    ``ld.shared.v4.f32``: rows padded to multiples of 4 floats, a 16-byte-aligned buffer,
    unsigned constant-unrolled indices, so that the compiler can prove the alignment):

    - S: for each group of 4 dims, RM loads of Q and RN of K feed 4 x RM x RN FMAs;
    - O: for each group of 4 keys, RM loads of P and 4 x RG of V (a thread owns its output dims
      in chunks of 4) feed 4 x RM x RE FMAs.

    The row max and the row sum are reduced over the TX threads of a row with warp shuffles
    (no barrier; the simulator, which has no shuffles, goes through shared memory), P has its
    own buffer, the tail key tile and the partial tiles alone pay for the mask, and the grid
    runs the query tiles from the last to the first: under a causal mask the last tiles visit
    the most key tiles, and starting them first leaves the short ones to fill the end.
    """
    key = ("vec", tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    tiling.check(D, Dv)
    L = tiling.layout(D, Dv)
    Br, Bc, NT, TX, TY, RM, RN = tiling.Br, tiling.Bc, tiling.threads, tiling.tx, tiling.ty, tiling.rm, tiling.rn
    QS, KS, PS, VS, RED, DP, EP, BP, RE, RG, D4 = (
        L[n] for n in ("QS", "KS", "PS", "VS", "RED", "DP", "EP", "BP", "RE", "RG", "D4"))
    SIM = bool(numba.config.ENABLE_CUDASIM)
    STAGED = tiling.prefetch         # the vectorised kernel's prefetch: K / V staged in registers
    U = uint64
    NK = -(-Bc * D4 // NT)           # K elements each thread loads per tile
    NV = -(-Bc * EP // NT)
    k_slot, v_slot = _tile_slot(NT, Bc, D4), _tile_slot(NT, Bc, EP)
    NEG_INF = float32(-math.inf)
    LN2 = float32(rules.LN2)
    ALL = 0xFFFFFFFF

    caps = {} if SIM or not tiling.max_regs else {"max_registers": tiling.max_regs}

    @cuda.jit(fastmath=True, **caps)
    def vec_forward_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes,
                           offset, left, right, out, lse):
        """q (B, H, Nq, D) ... -> out (S, B, H, Nq, Dv), lse (S, B, H, Nq); grid (B*H, Tr, S)."""
        H, Nq, Nk, Hk = q.shape[1], q.shape[2], k.shape[2], k.shape[1]
        b = cuda.blockIdx.x // H
        h = cuda.blockIdx.x % H
        tr = cuda.gridDim.y - 1 - cuda.blockIdx.y     # the last query tiles (the longest rows) first
        kh = kv_head[h]
        split = cuda.blockIdx.z
        t = cuda.threadIdx.x
        tx = t % TX
        ty = t // TX
        row0 = tr * Br
        if SIM:                               # the simulator takes no alignment (and needs none)
            sm = cuda.shared.array(0, float32)
        else:
            sm = cuda.shared.array(0, float32, alignment=16)
        slope = float32(slopes[b, h])

        n_all = nvisit[tr]
        per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
        first = split * per
        last = min(n_all, first + per)

        for x in range(t, Br * D4, NT):       # Q tile, scaled (log2 units), zero past Nq and D
            r = x // D4
            d = x % D4
            val = float32(0.0)
            if row0 + r < Nq and d < D:
                val = q[U(b), U(h), U(row0 + r), U(d)] * scale
            sm[U(QS + r * DP + d)] = val

        kreg = cuda.local.array(NK, float32)
        vreg = cuda.local.array(NV, float32)
        kc, kd, vc, ve = t // D4, t % D4, t // EP, t % EP
        o = cuda.local.array((RM, RE), float32)
        m = cuda.local.array(RM, float32)
        l = cuda.local.array(RM, float32)
        s = cuda.local.array((RM, RN), float32)
        qa = cuda.local.array((RM, 4), float32)
        kb = cuda.local.array((RN, 4), float32)
        vb = cuda.local.array((RG, 4), float32)
        rmax = cuda.local.array(RM, float32)
        for r in range(RM):
            m[r] = NEG_INF
            l[r] = float32(0.0)
            for e in range(RE):
                o[r, e] = float32(0.0)

        # tiled_staged: K and V go through registers, every load of a tile issued before the first
        # of them is needed (one trip to memory per tile, not one per element), tile n + 1's loads
        # in flight while tile n is computed; iteration first - 1 only issues the first tile's.
        # tiled_vec4 (STAGED False) loads and stores the tile element by element at the top of the
        # iteration, nothing ahead, and leaves it to the compiler to batch the loads.
        for n in range(first - 1, last):
            if n >= first:
                cuda.syncthreads()            # nobody reads the last tile's Ks, Vs, Ps any more
                for u in range(NK):
                    c, d, ok = k_slot(u, t, kc, kd)
                    if ok:
                        if STAGED:
                            val = kreg[u]
                        else:                     # tiled_vec4: load and store one element at a time
                            val = float32(0.0)
                            if visit[tr, n] * Bc + c < Nk and (D4 == D or d < D):
                                val = k[U(b), U(kh), U(visit[tr, n] * Bc + c), U(d)]
                        sm[U(KS + c * DP + d)] = val
                for u in range(NV):
                    c, e, ok = v_slot(u, t, vc, ve)
                    if ok:
                        if STAGED:
                            val = vreg[u]
                        else:
                            val = float32(0.0)
                            if visit[tr, n] * Bc + c < Nk and (EP == Dv or e < Dv):
                                val = v[U(b), U(kh), U(visit[tr, n] * Bc + c), U(e)]
                        sm[U(VS + c * EP + e)] = val
            if STAGED and n + 1 < last:
                c1 = visit[tr, n + 1] * Bc
                # On the GPU an element is read at its flat offset, k[0, 0, 0, x]: the arrays are
                # C-contiguous (the address is just data + 4 x) and numba checks no bounds there,
                # so the offsets of a thread's NK loads differ by constants the compiler folds into
                # the load instructions, instead of a 64-bit multiply by a run-time shape each.
                kflat = ((b * Hk + kh) * Nk + c1) * D
                vflat = ((b * Hk + kh) * Nk + c1) * Dv
                for u in range(NK):
                    c, d, ok = k_slot(u, t, kc, kd)
                    val = float32(0.0)
                    if ok and c1 + c < Nk and (D4 == D or d < D):
                        if SIM:                   # the simulator's arrays check their bounds
                            val = k[U(b), U(kh), U(c1 + c), U(d)]
                        else:
                            val = k[0, 0, 0, U(kflat + c * D + d)]
                    kreg[u] = val
                for u in range(NV):
                    c, e, ok = v_slot(u, t, vc, ve)
                    val = float32(0.0)
                    if ok and c1 + c < Nk and (EP == Dv or e < Dv):
                        if SIM:
                            val = v[U(b), U(kh), U(c1 + c), U(e)]
                        else:
                            val = v[0, 0, 0, U(vflat + c * Dv + e)]
                    vreg[u] = val
            if n < first:
                continue
            tc = visit[tr, n]
            kind = tiles[tr, tc]
            c0 = tc * Bc
            cuda.syncthreads()                # Ks, Vs (and Qs) complete

            # S = Qs Ks^T on this thread's RM x RN micro-tile, 4 dims per load
            for r in range(RM):
                for c in range(RN):
                    s[r, c] = float32(0.0)
            for d4 in range(D4 // 4):
                d = d4 * 4
                for r in range(RM):
                    for j in range(4):
                        qa[r, j] = sm[U(QS + (ty + TY * r) * DP + d + j)]
                for c in range(RN):
                    for j in range(4):
                        kb[c, j] = sm[U(KS + (tx + TX * c) * DP + d + j)]
                for r in range(RM):
                    for c in range(RN):
                        for j in range(4):
                            s[r, c] += qa[r, j] * kb[c, j]

            # the rules, only where a tile needs them (softcap, ALiBi, a partial or a tail tile):
            # they go through this thread's own places in Ps, so that the loop that applies them
            # (too long to unroll) never indexes s, which must stay in registers
            edge = kind == rules.PARTIAL or c0 + Bc > Nk
            if edge or alibi or cap > 0:
                for r in range(RM):
                    for c in range(RN):
                        sm[U(PS + (ty + TY * r) * BP + tx + TX * c)] = s[r, c]
                for r in range(RM):
                    i = row0 + ty + TY * r
                    for c in range(RN):
                        j = c0 + tx + TX * c
                        at = U(PS + (ty + TY * r) * BP + tx + TX * c)
                        sc = float32(softcap(sm[at], cap))
                        if alibi:
                            sc -= slope * float32(alibi_distance(i, j, offset))
                        if edge:
                            if j >= Nk or not visible(i, j, offset, left, right):
                                sc = NEG_INF
                        sm[at] = sc
                for r in range(RM):
                    for c in range(RN):
                        s[r, c] = sm[U(PS + (ty + TY * r) * BP + tx + TX * c)]
            for r in range(RM):
                mx = NEG_INF
                for c in range(RN):
                    mx = max_nan(mx, s[r, c])
                if SIM:
                    sm[U(RED + (ty + TY * r) * TX + tx)] = mx
                else:                         # the TX threads of a row are TX neighbouring lanes
                    for w in (16, 8, 4, 2, 1):    # unrolled; a constant test drops the steps past TX
                        if w < TX:
                            mx = max_nan(mx, cuda.shfl_xor_sync(ALL, mx, w))
                    rmax[r] = mx
            if SIM:
                cuda.syncthreads()
                for r in range(RM):
                    mx = NEG_INF
                    for x in range(TX):
                        mx = max_nan(mx, sm[U(RED + (ty + TY * r) * TX + x)])
                    rmax[r] = mx

            # the row's new max (all TX threads of a row agree on it), P into shared memory
            for r in range(RM):
                m_new = max_nan(m[r], rmax[r])
                alpha = float32(rescale_exp2(m[r], m_new))
                shift = float32(shift_of(m_new))
                l[r] *= alpha
                for e in range(RE):
                    o[r, e] *= alpha
                m[r] = m_new
                for c in range(RN):
                    p = rules.exp2(s[r, c] - shift)
                    l[r] += p
                    sm[U(PS + (ty + TY * r) * BP + tx + TX * c)] = p
            cuda.syncthreads()                # P complete

            # O += P Vs on this thread's RM x RE micro-tile, 4 keys per load of P
            for c4 in range(Bc // 4):
                c = c4 * 4
                for r in range(RM):
                    for j in range(4):
                        qa[r, j] = sm[U(PS + (ty + TY * r) * BP + c + j)]
                for j in range(4):
                    for g in range(RG):
                        for jj in range(4):
                            vb[g, jj] = sm[U(VS + (c + j) * EP + 4 * tx + 4 * TX * g + jj)]
                    for r in range(RM):
                        for g in range(RG):
                            for jj in range(4):
                                o[r, 4 * g + jj] += qa[r, j] * vb[g, jj]

        # each thread summed only its own keys: add the TX shares of every row's l
        if SIM:
            cuda.syncthreads()
            for r in range(RM):
                sm[U(RED + (ty + TY * r) * TX + tx)] = l[r]
            cuda.syncthreads()
        for r in range(RM):
            total = l[r]
            if SIM:
                total = float32(0.0)
                for x in range(TX):
                    total += sm[U(RED + (ty + TY * r) * TX + x)]
            else:
                for w in (16, 8, 4, 2, 1):
                    if w < TX:
                        total += cuda.shfl_xor_sync(ALL, total, w)
            i = row0 + ty + TY * r
            row_lse, inv_l = finalize(m[r] * LN2, total)
            if i < Nq:
                if tx == 0:
                    lse[split, b, h, i] = row_lse
                for g in range(RG):
                    for jj in range(4):
                        e = 4 * tx + 4 * TX * g + jj
                        if e < Dv:
                            out[split, b, h, i, e] = o[r, 4 * g + jj] * float32(inv_l)

    _KERNELS[key] = vec_forward_kernel
    return vec_forward_kernel


def make_merge_kernel():
    """Split-KV's last step: one thread per (b, h, i) merges the S partials with the lse rule."""
    if "merge" in _KERNELS:
        return _KERNELS["merge"]

    @cuda.jit
    def merge_kernel(part_out, part_lse, out, lse):
        """part_out (S, B, H, Nq, Dv), part_lse (S, B, H, Nq) -> out (B, H, Nq, Dv), lse (B, H, Nq)."""
        S, B, H, Nq, Dv = part_out.shape
        g = cuda.grid(1)
        if g >= B * H * Nq:
            return
        i = g % Nq
        h = (g // Nq) % H
        b = g // (Nq * H)
        top = float32(-math.inf)
        for z in range(S):
            top = max_nan(top, part_lse[z, b, h, i])
        shift = float32(shift_of(top))
        total = float32(0.0)
        for z in range(S):
            total += math.exp(part_lse[z, b, h, i] - shift)
        row_lse, inv = finalize(shift, total)   # lse = top + log(sum of e^(lse_z - top))
        for e in range(Dv):
            acc = float32(0.0)
            for z in range(S):
                w = math.exp(part_lse[z, b, h, i] - shift)
                if w > 0:                         # a split that saw nothing adds nothing (not 0 * NaN)
                    acc += w * part_out[z, b, h, i, e]
            out[b, h, i, e] = acc * float32(inv)
        lse[b, h, i] = row_lse

    _KERNELS["merge"] = merge_kernel
    return merge_kernel


@dataclass(frozen=True)
class Plan:
    """One launch of a step, decided on the host."""

    step: str
    kernel: object
    griddim: tuple
    blockdim: int
    shared: int              # dynamic shared memory, bytes
    args: tuple              # everything between (q, k, v) and (out, lse)
    splits: int
    out_shape: tuple         # (B, H, Nq, Dv)
    launch: host.Launch
    tiling: Tiling = None


def on_gpu() -> bool:
    return ch09.on_gpu()


def tiling_for(step, D):
    """The Tiling a step runs with: its own, ``TUNED[D]`` for ``tuned``, and in the simulator
    the step's switches (pad, prefetch, unsigned) on the small SIM_TILING."""
    if not on_gpu():
        own = STEP_TILING.get("tiled_staged" if step == "tuned" else step, Tiling())
        return replace(SIM_TILING, pad=own.pad, prefetch=own.prefetch, unsigned=own.unsigned, vec=own.vec)
    if step == "tuned":
        return TUNED.get(D, STEP_TILING["tiled_staged"])
    return STEP_TILING[step]


def visit_lists(tiles):
    """(Tr, Tc) tile kinds -> (visit (Tr, Tc) int32: the key tiles each query tile computes, in order;
    nvisit (Tr,) int32: how many).  EMPTY tiles are left out: skipping is decided here."""
    keep = tiles != rules.EMPTY
    visit = np.zeros(tiles.shape, dtype=np.int32)
    nvisit = keep.sum(axis=1).astype(np.int32)
    for tr in range(tiles.shape[0]):
        cols = np.flatnonzero(keep[tr])
        visit[tr, :cols.size] = cols
    return visit, nvisit


def plan(step, q, k, v, opts, mask, *, tiling=None, splits=1) -> Plan:
    """The kernel and launch of ``step`` for validated dense float32 inputs."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    if q.dtype != np.float32:
        raise TypeError(f"chapter 10's kernels compute in float32 only; q, k and v are {q.dtype}")
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    if step in ("row", "row_exp2"):
        p = ch09.plan(q, k, v, opts, mask, exp2=(step == "row_exp2"))
        return Plan(step, p.kernel, p.griddim, p.blockdim, 0, p.args, 1, p.out_shape, p.launch)
    tiling = tiling or tiling_for(step, D)
    if opts.block_q or opts.block_k:
        tiling = replace(tiling, Br=opts.block_q or tiling.Br, Bc=opts.block_k or tiling.Bc)
    kernel = (make_vec_kernel if tiling.vec else make_tiled_kernel)(tiling, D, Dv)
    launch = host.prepare(q[:, :, :0], k[:, :, :0], v[:, :, :0], opts, mask, tiling.Br, tiling.Bc)[0]
    visit, nvisit = visit_lists(launch.tiles)
    unit = rules.LOG2E       # base 2: scores, softcap and slopes in log2 units
    args = (visit, nvisit, launch.tiles, launch.kv_head.astype(np.int32), np.float32(launch.softmax_scale * unit),
            np.float32(launch.softcap * unit), launch.alibi, (launch.slopes * unit).astype(np.float32),
            launch.offset, launch.left, launch.right)
    splits = max(1, min(int(splits), int(nvisit.max()) if nvisit.size else 1))
    Tr = launch.tiles.shape[0]
    grid = (B * H, Tr, splits) if tiling.vec else (Tr, B * H, splits)
    return Plan(step, kernel, grid, tiling.threads,
                tiling.shared_bytes(D, Dv), args, splits, (B, H, Nq, Dv), launch, tiling)


def allow_shared(kernel, args, nbytes):
    """Compile ``kernel`` for ``args`` and tell the driver its blocks may use ``nbytes`` of dynamic
    shared memory: above 48 KB a launch fails unless the kernel has opted in."""
    if nbytes <= STATIC_SHARED or not on_gpu():
        return
    from numba.cuda.cudadrv.driver import binding, driver
    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    cufunc = compiled._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)


def launcher(p: Plan, q, k, v, out, lse, part_out=None, part_lse=None):
    """A zero-argument callable that runs the plan on device arrays (or, in the simulator, numpy ones).

    ``out`` (B, H, Nq, Dv) and ``lse`` (B, H, Nq); with splits > 1 also the partials
    ``part_out`` (S, B, H, Nq, Dv) and ``part_lse`` (S, B, H, Nq)."""
    if p.step in ("row", "row_exp2"):
        run = p.kernel[p.griddim, p.blockdim]
        return lambda: run(q, k, v, *p.args, out, lse)
    if p.splits == 1:
        shape = (1, *p.out_shape)
        dest = (out.reshape(shape), lse.reshape(shape[:4]))
    else:
        dest = (part_out, part_lse)
    args = (q, k, v, *p.args, *dest)
    allow_shared(p.kernel, args, p.shared)
    run = p.kernel[p.griddim, p.blockdim, 0, p.shared]
    if p.splits == 1:
        return lambda: run(*args)
    rows = int(np.prod(p.out_shape[:3]))
    fold = make_merge_kernel()[-(-rows // 128), 128]

    def go_split():
        run(*args)
        fold(part_out, part_lse, out, lse)
    return go_split


def forward(step, q, k, v, opts, mask, *, tiling=None, splits=1):
    """Run ``step`` on validated dense numpy inputs: (out, lse), float32."""
    p = plan(step, q, k, v, opts, mask, tiling=tiling, splits=splits)
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    if not on_gpu():
        if not numba.config.ENABLE_CUDASIM:
            raise RuntimeError("chapter 10's kernels run on a GPU or in numba's simulator "
                               "(set NUMBA_ENABLE_CUDASIM=1 before numba is imported)")
        if B * H * Nq * Nk * (D + Dv) > ch09.SIM_MAX_WORK:
            raise ValueError(f"the simulator takes only small problems: B*H*Nq*Nk*(D+Dv) = "
                             f"{B * H * Nq * Nk * (D + Dv)} is above {ch09.SIM_MAX_WORK}")
    qa, ka, va = (np.ascontiguousarray(x) for x in (q, k, v))
    # poisoned, so that an element nothing wrote shows up as a NaN in the check
    out = np.full(p.out_shape, np.nan, dtype=np.float32)
    lse = np.full(p.out_shape[:3], np.nan, dtype=np.float32)
    parts = (np.full((p.splits, *p.out_shape), np.nan, dtype=np.float32),
             np.full((p.splits, *p.out_shape[:3]), np.nan, dtype=np.float32))
    arrays = (qa, ka, va, out, lse, *parts)
    if on_gpu():
        arrays = tuple(cuda.to_device(a) for a in arrays)
        p = replace(p, args=tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in p.args))
    launcher(p, *arrays)()
    if on_gpu():
        out, lse = arrays[3].copy_to_host(), arrays[4].copy_to_host()
    return out, nan_lse_where_out_is_nan(out, lse)


def api_forward(step, *, tiling=None, splits=1):
    """An ``attention_forward(q, k, v, opts, mask)`` for ``call_forward``."""
    def attention_forward(q, k, v, opts, mask):
        return forward(step, q, k, v, opts, mask, tiling=tiling, splits=splits)
    attention_forward.__name__ = f"cuda_step_{step}"
    return attention_forward


def attention(q, k, v, *, step="tuned", tiling=None, splits=1, return_lse=False, **options):
    """``course_lib.attention`` for one of chapter 10's steps (same options, same validation)."""
    from ..core.options import call_forward
    return call_forward(api_forward(step, tiling=tiling, splits=splits), q, k, v,
                            return_lse=return_lse, **options)


# -- what a block costs a multiprocessor --------------------------------------------------------

SM_LIMITS = dict(regs=65536, shared=233472, warps=64, blocks=32, reserved_shared=1024)  # Hopper (sm_90)


def occupancy(regs, shared, threads, limits=SM_LIMITS):
    """Blocks and warps one multiprocessor holds for a kernel's registers / thread, shared bytes /
    block and threads / block, and which resource sets the limit (registers are allocated per warp
    in units of 256).  A model of the CUDA occupancy calculator, not a measurement."""
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by = {
        "warps": limits["warps"] // warps,
        "registers": limits["regs"] // (regs_per_warp * warps),
        "shared": limits["shared"] // (shared + limits["reserved_shared"]) if shared else limits["blocks"],
        "blocks": limits["blocks"],
    }
    blocks = min(by.values())
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps,
            "occupancy": blocks * warps / limits["warps"], "limited_by": min(by, key=by.get)}


def resources(kernel):
    """Registers / thread, static shared bytes / block and local (spill) bytes / thread of every
    compiled version of a kernel, from numba's dispatcher (on a GPU only)."""
    out = {}
    for name in ("get_regs_per_thread", "get_shared_mem_per_block", "get_local_mem_per_thread"):
        try:
            value = getattr(kernel, name)()
            values = sorted({int(x) for x in value.values()}) if isinstance(value, dict) else [int(value)]
            out[name[4:]] = values[0] if len(values) == 1 else values
        except Exception as error:  # noqa: BLE001 -- recorded as what it is
            out[name[4:]] = f"{type(error).__name__}: {error}"
    return out


def decode_splits(rows, tiles, tiling, D, Dv, regs=64, sms=None, waves=DECODE_WAVES):
    """Split-KV's rule: the fewest splits (a power of two) that give ``waves`` full waves of blocks.

    ``rows`` blocks run without a split (B * H * Tr); a multiprocessor holds ``blocks_per_sm`` of
    them at once (``occupancy`` of the tiling's shared memory, threads and ``regs``), so the chip
    holds ``sms * blocks_per_sm``.  Fewer blocks leave multiprocessors idle or shallow (too few
    loads in flight); more only add partials to merge.  Never more splits than key tiles.
    Returns (splits, the numbers the rule used)."""
    if sms is None:
        sms = SMS
        if on_gpu():
            sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    per_sm = occupancy(regs, tiling.shared_bytes(D, Dv), tiling.threads)["blocks_per_sm"]
    want = waves * sms * per_sm
    splits = 1
    while rows * splits < want and splits * 2 <= max(1, tiles):
        splits *= 2
    return splits, {"rows": rows, "key_tiles": tiles, "sms": sms, "blocks_per_sm": per_sm, "waves": waves,
                    "blocks": rows * splits, "regs": regs}


def autotune(D, time_plan, candidates=None, prefetch=(False, True), base=None):
    """Time every candidate Tiling at head dim D with ``time_plan(tiling) -> seconds`` (None: it
    failed), keep the fastest in ``TUNED[D]`` and return (best, [(tiling, seconds), ...]).
    ``base`` gives the switches the candidates share (default: ``tiled_prefetch``'s kernel,
    pad 1); each candidate is (Br, Bc, threads, tx[, register cap]), tried with each ``prefetch``."""
    candidates = candidates or CANDIDATES
    base = base or Tiling(pad=1)
    results = []
    for Br, Bc, threads, tx, *cap in candidates:
        for pf in prefetch:
            tiling = replace(base, Br=Br, Bc=Bc, threads=threads, tx=tx, prefetch=pf, max_regs=(cap or [0])[0])
            try:
                tiling.check(D, D)
            except ValueError:
                continue
            results.append((tiling, time_plan(tiling)))
    timed = [(t, s) for t, s in results if s is not None]
    if not timed:
        raise RuntimeError(f"no candidate tiling ran at D={D}")
    best = min(timed, key=lambda ts: ts[1])[0]
    TUNED[D] = best
    return best, results
