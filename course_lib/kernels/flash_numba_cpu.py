"""impl ``flash_numba_cpu``: the tiled FlashAttention forward, compiled with Numba.

Chapter 08's kernel.  The algorithm is chapter 05's FA2 loop order, unchanged:
for each query tile Qi, for each key / value tile (Kj, Vj), compute
Sij = scale * Qi Kj^T, fold it into the running (m, l, Oi) with the online
softmax, and at the end write Oi / l and lse once.  What changes is who runs
it: ``numba.njit`` compiles the loops to machine code, so a loop costs what its
arithmetic costs, not what the interpreter charges per numpy call.

The kernel is built in steps (``STEPS``), each one change on the step before,
each registered as an impl so that chapter 08 and ``benchmarks/cpu_attention.py``
time them side by side; the last step is ``flash_numba_cpu`` itself:

- ``microkernel``: both tile matmuls are the course's 4 x 2 micro-kernel
  ``matmul_nt`` (C = A B^T), Kj and Vj^T copied into padded tile buffers;
  the scores of a tile pass through the scalar rules (``core.rules``) one
  element at a time; a vectorised exp (``exp_row``); work items in zigzag
  order over ``prange``'s static split; 64 x 64 tiles.
- ``blas``: the two matmuls are ``np.dot`` on contiguous tiles inside njit,
  which calls SciPy's BLAS (sgemm / dgemm); Kj and Vj are read where they lie,
  no copy, and Qi is scaled once as it is read (not every Sij).
- ``rowvec``: the scores of a row are scaled, capped, biased and masked by
  whole-row loops with no branch per element; the mask of a PARTIAL tile is
  two index bounds per row, not a test per score.
- ``balanced``: the work items go heaviest first (most tiles computed) and
  are handed out one at a time (``numba.set_parallel_chunksize(1)``), so a core
  that finishes early, or loses its time to another program, takes the next.
- ``tuned`` (= ``flash_numba_cpu``): the tile sizes from this CPU's L2
  (``tile_sizes_for``), as a sweep on this machine chose; and where there are
  fewer work items than cores want (decoding: one query row), the keys are
  split across work items and the partial (out, lse) merged with the lse rule
  (``core.online_softmax.merge_all``).

The structure every step shares, ``query_tile``: one place where each tile's
P is formed (``softmax_tile_*``, then ``round_p``), one where it meets Vj.

Precision follows ``rules``: inputs converted to float32 (float64 for float64
input), S, m, l and Oi in that dtype, P rounded to float16 / bfloat16 before
P V for those inputs, output rounded to the input dtype at the end.
Float8 inputs are dequantised on the host (``launch.prepare``) and P is
rounded to e4m3 by the same ``round_to_bits``; their output is float32.
``fastmath`` is switched on in part: reassociation, contraction (fused
multiply-add), reciprocals; not ``nnan`` / ``ninf``, which would let the
compiler assume no value is ever -inf or NaN (masked scores are -inf, and a
NaN input must come out NaN).

Processes: numba's threading layer here (OpenMP) does not survive ``fork``:
a child forked after the parent ran this kernel must not call it (it can
hang or abort).  Start worker processes with ``spawn`` (``multiprocessing.
get_context("spawn")``, or a fresh interpreter via ``subprocess``), as the
course's benchmarks and grader do.

Compiled code is cached on disk (``cache=True``): the first call in a fresh
checkout compiles for a while (chapter 08 measures how long), later processes
load the machine code.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

try:
    import numba
except ModuleNotFoundError:  # an optional package missing: the impl is unavailable, nothing else
    numba = None

from ..core import rules
from ..core.machine import cache_sizes
from ..core.online_softmax import merge_all
from ..core.reference import nan_lse_where_out_is_nan
from . import launch as host

# What fastmath may do here (see the module docstring): no 'nnan', no 'ninf'.
FASTMATH = {"reassoc", "contract", "arcp", "nsz"}
# exp_row's constants: ln 2 split in two (Cody and Waite), and exp(r) on
# [-ln 2, 0] as a degree-6 polynomial (Chebyshev fit, coefficients in float32).
LOG2E = 1.4426950408889634
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
EXP_POLY = (1.0, 0.9999997615814209, 0.4999949038028717, 0.1666249781847,
            0.041497647762298584, 0.007970437407493591, 0.0009860550053417683)


@dataclass(frozen=True)
class Step:
    """One version of the kernel: what it changes, and the switches that make it."""

    what: str
    blas: bool          # tile matmuls by np.dot (BLAS) instead of matmul_nt
    row_vector: bool    # whole-row score loops, masks as index bounds
    balanced: bool      # heaviest items first, handed out one at a time
    tuned: bool         # tile sizes from the caches; keys split when items are few


STEPS = {
    "microkernel": Step("4 x 2 register micro-kernel, scalar rules per score, zigzag items, 64 x 64",
                        False, False, False, False),
    "blas": Step("tile matmuls by np.dot on contiguous tiles (SciPy's BLAS), Qi scaled once",
                 True, False, False, False),
    "rowvec": Step("scores scaled, capped and masked by whole-row loops: no branch per score",
                   True, True, False, False),
    "balanced": Step("heaviest work items first, handed out one at a time", True, True, True, False),
    "tuned": Step("tile sizes from the L2 size, keys split across cores when items are few",
                  True, True, True, True),
}
FINAL_STEP = "tuned"
MIN_ITEMS_PER_THREAD = 4    # fewer (batch, head, query tile) items than this per thread: split the keys


def available() -> bool:
    return numba is not None


def scipy_openblas():
    """SciPy's OpenBLAS, which ``np.dot`` inside njit calls, as a ctypes library; None for another BLAS.

    The kernel's threads are prange's: a BLAS that starts threads of its own
    inside each of them fights them for the cores (OpenBLAS warns "Detect
    OpenMP Loop and this application may hang").  ``run_kernel`` sets it to
    one thread for the call and back after.
    """
    import ctypes
    import glob
    import os

    import scipy
    import scipy.linalg.cython_blas  # noqa: F401  (loads the library)
    folder = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
    for path in glob.glob(os.path.join(folder, "libscipy_openblas*.so*")):
        library = ctypes.CDLL(path)
        if hasattr(library, "scipy_openblas_set_num_threads"):
            return library
    return None


def tile_sizes_for(head_dim, head_dim_v, itemsize, l2_bytes=None):
    """(Br, Bc) for this CPU: the largest tile whose working set fills at most half of one core's L2.

    A work item touches Qi (Br x D), Kj (Bc x D), Vj (Bc x Dv), Sij (Br x Bc)
    and Oi plus Pij Vj (2 Br x Dv) on every step; BLAS runs faster on larger
    tiles (fewer calls, longer inner loops), and falls back once they spill
    out of L2.  Br and Bc are powers of two from 64, Bc up to 4 Br (the key
    loop is the inner one).  Chapter 08's sweep measures the choice.
    """
    l2 = l2_bytes or cache_sizes().get(2, 512 * 1024)
    best = (64, 64)
    for Br in (64, 128, 256):
        for Bc in (64, 128, 256, 512):
            if Bc > 4 * Br:
                continue
            working_set = itemsize * (Br * head_dim + Bc * (head_dim + head_dim_v) + Br * Bc + 2 * Br * head_dim_v)
            if working_set <= l2 // 2 and Br * Bc > best[0] * best[1]:
                best = (Br, Bc)
    return best


if numba is not None:
    _rule = numba.njit(cache=True)
    visible = _rule(rules.visible)
    alibi_distance = _rule(rules.alibi_distance)
    softcap = _rule(rules.softcap)
    max_nan = _rule(rules.max_nan)
    shift_of = _rule(rules.shift_of)
    rescale = _rule(rules.rescale)
    finalize = _rule(rules.finalize)
    round_to_bits = _rule(rules.round_to_bits)

    @numba.njit(cache=True, fastmath={"contract"})
    def exp_row(P, n, shift, exponent_bits):
        """P[:n] = exp(P[:n] - shift) in float32, for scores at or below ``shift``.

        libm's ``exp`` is a function call per element, which the compiler cannot
        turn into SIMD code.  This one can: x = k ln 2 + r with k an integer and
        r in (-ln 2, 0], exp(r) from a degree-6 polynomial (1.2 ulp at most),
        and 2**k built from its exponent bits.  Below -87 (2**k would leave
        float32's normal range) the result is exactly 0, so a masked score
        (-inf) gives p = 0; a NaN stays NaN.  Only 'contract' (fused
        multiply-add) is allowed here: reassociating would undo the two-step
        subtraction of k ln 2 that keeps r exact.
        """
        for c in range(n):
            x = P[c] - shift
            underflow = x < np.float32(-87.0)
            if underflow:
                x = np.float32(-87.0)
            k = np.int32(x * np.float32(LOG2E))             # toward 0: k >= x / ln 2
            r = x - np.float32(k) * np.float32(LN2_HI)       # exact: k and LN2_HI have few bits
            r = r - np.float32(k) * np.float32(LN2_LO)
            p = np.float32(EXP_POLY[6])
            for i in range(5, -1, -1):                       # Horner
                p = p * r + np.float32(EXP_POLY[i])
            P[c] = p
            exponent_bits[c] = 0 if underflow else (k + np.int32(127)) << 23
        two_to_k = exponent_bits.view(np.float32)            # the float32 with exponent k, mantissa 1
        for c in range(n):
            P[c] *= two_to_k[c]

    @numba.njit(cache=True, fastmath=FASTMATH)
    def matmul_nt(A, B, C, n_rows, n_cols, depth):
        """C[:n_rows, :n_cols] = A[:n_rows, :depth] @ B[:n_cols, :depth]^T.

        A block of 4 rows x 2 columns of C is summed in 8 scalars, which the
        compiler keeps in SIMD registers while the loop over ``depth`` streams
        A and B along their contiguous axis: 6 loads feed 8 multiply-adds.
        n_rows must be a multiple of 4 and n_cols of 2 (the buffers are padded).
        """
        zero = C.dtype.type(0)
        for r in range(0, n_rows, 4):
            for c in range(0, n_cols, 2):
                s00 = zero; s01 = zero; s10 = zero; s11 = zero
                s20 = zero; s21 = zero; s30 = zero; s31 = zero
                for d in range(depth):
                    b0 = B[c, d]
                    b1 = B[c + 1, d]
                    a = A[r, d]
                    s00 += a * b0
                    s01 += a * b1
                    a = A[r + 1, d]
                    s10 += a * b0
                    s11 += a * b1
                    a = A[r + 2, d]
                    s20 += a * b0
                    s21 += a * b1
                    a = A[r + 3, d]
                    s30 += a * b0
                    s31 += a * b1
                C[r, c] = s00
                C[r, c + 1] = s01
                C[r + 1, c] = s10
                C[r + 1, c + 1] = s11
                C[r + 2, c] = s20
                C[r + 2, c + 1] = s21
                C[r + 3, c] = s30
                C[r + 3, c + 1] = s31

    @numba.njit(cache=True, fastmath=FASTMATH)
    def exp_and_sum(P, n, shift, fast_exp, exponent_bits):
        """P[:n] = exp(P[:n] - shift); returns their sum (l sums the unrounded P)."""
        if fast_exp:
            exp_row(P, n, P.dtype.type(shift), exponent_bits)
        else:
            for c in range(n):
                P[c] = math.exp(P[c] - shift)
        row_sum = P.dtype.type(0)
        for c in range(n):
            row_sum += P[c]
        return row_sum

    @numba.njit(cache=True, fastmath=FASTMATH)
    def softmax_tile_scalar(S, n_r, n_c, i0, j0, kind, scale, cap, alibi, slope, offset, left, right,
                            fast_exp, m, l, Oi, exponent_bits):
        """Sij -> Pij in place, (m, l) updated, Oi rescaled: each score through the scalar rules."""
        dtype = S.dtype.type
        for r in range(n_r):
            i = i0 + r
            m_new = m[r]
            for c in range(n_c):              # the scores of row i, and their max
                j = j0 + c
                s = softcap(S[r, c] * scale, cap)
                if alibi:
                    s -= dtype(slope * alibi_distance(i, j, offset))
                if kind == rules.PARTIAL and not visible(i, j, offset, left, right):
                    s = -np.inf
                S[r, c] = s
                m_new = max_nan(m_new, s)
            alpha = dtype(rescale(m[r], m_new))   # how far the old max was too small
            row_sum = exp_and_sum(S[r], n_c, shift_of(m_new), fast_exp, exponent_bits)
            l[r] = alpha * l[r] + row_sum
            m[r] = m_new
            for e in range(Oi.shape[1]):
                Oi[r, e] *= alpha

    @numba.njit(cache=True, fastmath=FASTMATH)
    def softmax_tile_vector(S, n_r, n_c, i0, j0, kind, scale, cap, alibi, slope, offset, left, right,
                            fast_exp, m, l, Oi, exponent_bits):
        """``softmax_tile_scalar`` with every per-score loop branch-free, so each one vectorises.

        Scale (and cap, and ALiBi's bias) are whole-row passes; a PARTIAL tile's
        mask is the row's window [centre - left, centre + right] cut to the
        tile, two bounds, and the scores outside are set to -inf; the max is a
        plain reduction (a NaN score still reaches P, l and so the output).
        """
        dtype = S.dtype.type
        neg_inf = dtype(-np.inf)
        for r in range(n_r):
            i = i0 + r
            row = S[r]
            if cap > 0:
                inv_cap = dtype(1) / cap
                for c in range(n_c):
                    row[c] = cap * math.tanh(row[c] * scale * inv_cap)
            elif scale != 1:
                for c in range(n_c):
                    row[c] *= scale
            if alibi:
                centre = i + offset - j0          # the row's diagonal, in tile columns
                for c in range(n_c):
                    row[c] -= dtype(slope * abs(centre - c))
            if kind == rules.PARTIAL:             # keys j0 + c with lo <= c < hi are visible
                lo, hi = 0, n_c
                if left >= 0:
                    lo = min(max(i + offset - left - j0, 0), n_c)
                if right >= 0:
                    hi = max(min(i + offset + right + 1 - j0, n_c), lo)
                for c in range(lo):
                    row[c] = neg_inf
                for c in range(hi, n_c):
                    row[c] = neg_inf
            m_tile = neg_inf
            for c in range(n_c):
                m_tile = max(m_tile, row[c])
            m_new = max(m[r], m_tile)
            alpha = dtype(rescale(m[r], m_new))
            row_sum = exp_and_sum(row, n_c, shift_of(m_new), fast_exp, exponent_bits)
            l[r] = alpha * l[r] + row_sum
            m[r] = m_new
            for e in range(Oi.shape[1]):
                Oi[r, e] *= alpha

    @numba.njit(cache=True)
    def round_p(S, n_r, n_c, round_bits, round_min_exponent):
        """P as the matrix unit would take it: float16 / bfloat16 inputs round P before P V."""
        if round_bits > 0:
            dtype = S.dtype.type
            for r in range(n_r):
                for c in range(n_c):
                    S[r, c] = dtype(round_to_bits(S[r, c], round_bits, round_min_exponent))

    @numba.njit(cache=True, fastmath=FASTMATH)
    def form_p(S, n_r, n_c, i0, j0, kind, scale, cap, alibi, slope, offset, left, right, fast_exp,
               row_vector, round_bits, round_min_exponent, m, l, Oi, exponent_bits):
        """The one place a tile's P is formed, in place of its S: the online softmax
        (m, l and Oi's rescaling updated), then P as the matrix unit takes it."""
        if row_vector:
            softmax_tile_vector(S, n_r, n_c, i0, j0, kind, scale, cap, alibi, slope, offset, left, right,
                                fast_exp, m, l, Oi, exponent_bits)
        else:
            softmax_tile_scalar(S, n_r, n_c, i0, j0, kind, scale, cap, alibi, slope, offset, left, right,
                                fast_exp, m, l, Oi, exponent_bits)
        round_p(S, n_r, n_c, round_bits, round_min_exponent)

    @numba.njit(cache=True, fastmath=FASTMATH)
    def query_tile(q, k, v, b, h, kh, r0, r1, tc_lo, tc_hi, tiles_row, Bc, scale, cap, alibi, slope,
                   offset, left, right, round_bits, round_min_exponent, fast_exp, blas, row_vector,
                   out, lse):
        """One work item: query rows [r0, r1) of (batch b, head h) against key tiles [tc_lo, tc_hi) of head kh.

        ``out`` and ``lse`` are this split's (B, H, Nq, Dv) and (B, H, Nq).
        """
        Nk, D = k.shape[2], k.shape[3]
        Dv = v.shape[3]
        n_r = r1 - r0
        rows4, Dv2, Bc2 = (n_r + 3) // 4 * 4, (Dv + 1) // 2 * 2, (Bc + 1) // 2 * 2  # matmul_nt's padding
        if blas:     # contiguous tiles for np.dot; Qi, Kj and Vj are views of q, k, v
            S_flat = np.empty(n_r * Bc, q.dtype)
            PV = np.empty((n_r, Dv), q.dtype)
            Qi = q[b, h, r0:r1] * scale           # the scale folded into Qi once, not into every Sij
            scale = q.dtype.type(1)
        else:        # the tile buffers ("SRAM"): this work item's own, zero so pads stay finite
            S_pad = np.zeros((rows4, Bc2), q.dtype)
            PV_pad = np.zeros((rows4, Dv2), q.dtype)
            Q_pad = np.zeros((rows4, D), q.dtype)
            K_pad = np.zeros((Bc2, D), q.dtype)
            VT_pad = np.zeros((Dv2, Bc2), q.dtype)        # Vj transposed: P V is also A B^T
            Q_pad[:n_r] = q[b, h, r0:r1]
        Oi = np.zeros((n_r, Dv), q.dtype)          # the unnormalised output, on chip throughout
        m = np.full(n_r, -np.inf, q.dtype)
        l = np.zeros(n_r, q.dtype)
        exponent_bits = np.zeros(Bc2, np.int32)    # exp_row's scratch
        for tc in range(tc_lo, tc_hi):
            kind = tiles_row[tc]
            if kind == rules.EMPTY:
                continue                          # skipped: Kj and Vj are never loaded
            c0 = tc * Bc
            n_c = min(c0 + Bc, Nk) - c0
            if blas:
                S = S_flat[:n_r * n_c].reshape((n_r, n_c))
                np.dot(Qi, k[b, kh, c0:c0 + n_c].T, S)                 # Sij = Qi Kj^T
                form_p(S, n_r, n_c, r0, c0, kind, scale, cap, alibi, slope, offset, left, right,
                       fast_exp, row_vector, round_bits, round_min_exponent, m, l, Oi, exponent_bits)
                np.dot(S, v[b, kh, c0:c0 + n_c], PV)                    # Oi += Pij Vj
                Oi += PV
            else:
                for c in range(n_c):              # load Kj, and Vj transposed
                    K_pad[c] = k[b, kh, c0 + c]
                    for e in range(Dv):
                        VT_pad[e, c] = v[b, kh, c0 + c, e]
                matmul_nt(Q_pad, K_pad, S_pad, rows4, (n_c + 1) // 2 * 2, D)
                form_p(S_pad[:n_r, :n_c], n_r, n_c, r0, c0, kind, scale, cap, alibi, slope, offset, left, right,
                       fast_exp, row_vector, round_bits, round_min_exponent, m, l, Oi, exponent_bits)
                matmul_nt(S_pad, VT_pad, PV_pad, rows4, Dv2, n_c)
                Oi += PV_pad[:n_r, :Dv]
        for r in range(n_r):                      # divide by l once; write Oi and lse once
            row_lse, inv_l = finalize(m[r], l[r])
            lse[b, h, r0 + r] = row_lse
            for e in range(Dv):
                out[b, h, r0 + r, e] = Oi[r, e] * q.dtype.type(inv_l)

    @numba.njit(cache=True, parallel=True)
    def forward_kernel(q, k, v, items, tiles, kv_head, Br, Bc, splits, scale, cap, alibi, slopes,
                       offset, left, right, round_bits, round_min_exponent, fast_exp, blas, row_vector,
                       out, lse):
        """Every work item, spread over the cores by prange.

        ``items`` lists them in the order they are handed out, each as
        (batch, head, query tile, key split); split s owns key tiles
        [s Tc / splits, (s + 1) Tc / splits) and writes out[s], lse[s].
        """
        Nq = q.shape[2]
        Tc = tiles.shape[1]
        for n in numba.prange(items.shape[0]):
            b, h, t, s = items[n, 0], items[n, 1], items[n, 2], items[n, 3]
            r0 = t * Br
            query_tile(q, k, v, b, h, kv_head[h], r0, min(r0 + Br, Nq), s * Tc // splits,
                       (s + 1) * Tc // splits, tiles[t], Bc, q.dtype.type(scale), q.dtype.type(cap), alibi,
                       slopes[b, h], offset, left, right, round_bits, round_min_exponent, fast_exp, blas,
                       row_vector, out[s], lse[s])


def work_items(batch, heads, tiles, splits, balanced):
    """The (batch, head, query tile, split) work items, as an (n, 4) int64 array in hand-out order.

    Not balanced: query tiles in zigzag order (0, Tr-1, 1, Tr-2, ...), so that
    each of prange's contiguous runs mixes light and heavy causal tiles.
    Balanced: heaviest first, by the number of key tiles each item computes
    (longest-processing-time order); handed out one at a time, no core is
    left with a heavy item when the others have finished.
    """
    Tr, Tc = tiles.shape
    zigzag = [z // 2 if z % 2 == 0 else Tr - 1 - z // 2 for z in range(Tr)]
    items = np.array([(b, h, t, s) for b in range(batch) for h in range(heads) for t in zigzag
                      for s in range(splits)], dtype=np.int64).reshape(-1, 4)
    if balanced and len(items):
        computed = np.cumsum(np.concatenate([np.zeros((Tr, 1), np.int64),
                                             (tiles != rules.EMPTY).astype(np.int64)], axis=1), axis=1)
        lo, hi = items[:, 3] * Tc // splits, (items[:, 3] + 1) * Tc // splits
        cost = computed[items[:, 2], hi] - computed[items[:, 2], lo]
        items = items[np.argsort(-cost, kind="stable")]
    return items


def key_splits(batch, heads, query_tiles, key_tiles, threads):
    """How many pieces each row's keys are cut into: 1 unless there are fewer than
    MIN_ITEMS_PER_THREAD items per thread (decoding), then enough to make that many."""
    items = batch * heads * query_tiles
    if items >= MIN_ITEMS_PER_THREAD * threads or items == 0:
        return 1
    return max(1, min(key_tiles, -(-MIN_ITEMS_PER_THREAD * threads // items)))


_BLAS = [scipy_openblas() if numba is not None else None]


def run_kernel(launch, q, k, v, step=FINAL_STEP, splits=None):
    """Launch ``forward_kernel`` on prepared (contiguous, acc-dtype) q, k, v: (out, lse) in acc dtype."""
    config = STEPS[step]
    B, H, Nq, _ = q.shape
    threads = numba.get_num_threads()
    if splits is None:
        splits = key_splits(B, H, *launch.tiles.shape, threads) if config.tuned else 1
    out = np.empty((splits, B, H, Nq, v.shape[3]), dtype=launch.acc_dtype)
    lse = np.empty((splits, B, H, Nq), dtype=launch.acc_dtype)
    items = work_items(B, H, launch.tiles, splits, config.balanced)
    chunk = numba.set_parallel_chunksize(1 if config.balanced else 0)
    blas = _BLAS[0] if config.blas else None
    blas_threads = blas.scipy_openblas_get_num_threads() if blas is not None else None
    if blas is not None:
        blas.scipy_openblas_set_num_threads(1)
    try:
        forward_kernel(q, k, v, items, launch.tiles, launch.kv_head, launch.Br, launch.Bc, splits,
                       launch.softmax_scale, launch.softcap, launch.alibi, launch.slopes,
                       launch.offset, launch.left, launch.right, launch.round_bits,
                       launch.round_min_exponent, launch.acc_dtype == np.float32, config.blas,
                       config.row_vector, out, lse)
    except numba.core.errors.NumbaError as error:
        raise RuntimeError(f"flash_numba_cpu failed to compile for {q.dtype} inputs: {error}") from error
    finally:
        numba.set_parallel_chunksize(chunk)
        if blas is not None:
            blas.scipy_openblas_set_num_threads(blas_threads)
    if splits == 1:
        return out[0], lse[0]
    merged, merged_lse = merge_all(list(out), list(lse))    # chapter 04's lse rule, over the splits
    return merged.astype(launch.acc_dtype, copy=False), merged_lse.astype(launch.acc_dtype, copy=False)


def default_tiles(step, q, v):
    """(block_q, block_k) a step runs when the call gives none (clamped to the problem by ``flash_forward``)."""
    if STEPS[step].tuned:
        return tile_sizes_for(q.shape[3], v.shape[3], rules.acc_dtype(q.dtype).itemsize)
    return host.DEFAULT_TILES["flash_numba_cpu"]


def flash_forward(q, k, v, opts, mask, step=FINAL_STEP, splits=None):
    """The compiled forward for validated dense inputs: (out in q's dtype, lse).

    A tile is never larger than the problem: block_k = 10**8 on 100 keys runs
    one tile of 100 keys, and the buffers are sized by that.
    """
    Br, Bc = host.tile_sizes(opts, *default_tiles(step, q, v))
    opts = dataclasses.replace(opts, block_q=min(Br, q.shape[2]), block_k=min(Bc, k.shape[2]))
    launch, *arrays = host.prepare(q, k, v, opts, mask, opts.block_q, opts.block_k)
    out, lse = run_kernel(launch, *arrays, step=step, splits=splits)
    # The NaN rule, on the host like every impl: a NaN in V reaches rows that
    # cannot see its key through 0 * NaN, and such a row must not report an lse
    # that looks healthy.
    lse = nan_lse_where_out_is_nan(out, lse)
    return out.astype(rules.out_dtype(q.dtype), copy=False), lse.astype(rules.lse_dtype(q.dtype), copy=False)


attention_forward = flash_forward
