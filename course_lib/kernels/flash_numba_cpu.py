"""impl ``flash_numba_cpu``: the tiled FlashAttention forward, compiled with Numba.

Chapter 08's kernel.  The algorithm is chapter 05's FA2 loop order, unchanged:
for each query tile Qi, for each key / value tile (Kj, Vj), compute
Sij = scale * Qi Kj^T, fold it into the running (m, l, Oi) with the online
softmax, and at the end write Oi / l and lse once.  What changes is who runs
it: ``numba.njit`` compiles the loops to machine code, so a loop costs what its
arithmetic costs, not what the interpreter charges per numpy call.

- ``prange`` spreads the (batch, head, query tile) work items over the cores.
  Each item owns its rows of O and lse, so no two threads write one element.
- Tile skipping is decided on the host (``launch.prepare``): the kernel gets
  the (Tr, Tc) tile plan, never loads an EMPTY tile and masks only PARTIAL
  ones, element by element, with ``rules.visible``.
- The scalar rules (mask, ALiBi distance, softcap, the online-softmax step,
  finalize, rounding P) are ``course_lib.core.rules``, compiled here as they are.
- Both matmuls of a tile, Qi Kj^T and Pij Vj, are one micro-kernel,
  ``matmul_nt`` (C = A B^T, both operands read along their contiguous last
  axis): Vj is transposed into the tile buffer as it is loaded.
- ``fastmath`` is switched on in part: reassociation (so the compiler may
  split a dot product over SIMD lanes), contraction (fused multiply-add) and
  reciprocals.  Not ``nnan`` / ``ninf``: those let the compiler assume that no
  value is ever -inf or NaN, and this kernel relies on both (masked scores
  are -inf, a NaN input must come out NaN).

Precision follows ``rules``: inputs converted to float32 (float64 for float64
input), S, m, l and Oi in that dtype, P rounded to float16 / bfloat16 before
P V for those inputs, output rounded to the input dtype at the end.
Float8 inputs are dequantised on the host (``launch.prepare``) and P is
rounded to e4m3 by the same ``round_to_bits``; their output is float32.

Compiled code is cached on disk (``cache=True``): the first call in a fresh
checkout compiles for a while (chapter 08 measures how long), later processes
load the machine code.
"""
from __future__ import annotations

import math

import numpy as np

try:
    import numba
except ModuleNotFoundError:  # an optional package missing: the impl is unavailable, nothing else
    numba = None

from ..core import rules
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


def available() -> bool:
    return numba is not None


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
    def query_tile(q, k, v, b, h, kh, r0, r1, tiles_row, Br, Bc, scale, cap, alibi, slope,
                   offset, left, right, round_bits, round_min_exponent, fast_exp, out, lse):
        """One work item: query rows [r0, r1) of (batch b, head h), against K / V head kh."""
        Nk, D = k.shape[2], k.shape[3]
        Dv = v.shape[3]
        dtype = q.dtype.type
        n_r = r1 - r0
        rows4 = (n_r + 3) // 4 * 4                 # the micro-kernel's padding
        Dv2 = (Dv + 1) // 2 * 2
        Bc2 = (Bc + 1) // 2 * 2
        # The tile buffers ("SRAM"): this work item's own, zero so pads stay finite.
        Qi = np.zeros((rows4, D), q.dtype)
        Kj = np.zeros((Bc2, D), q.dtype)
        VjT = np.zeros((Dv2, Bc2), q.dtype)        # Vj transposed: P V is also A B^T
        Sij = np.zeros((rows4, Bc2), q.dtype)      # scores, then P
        PV = np.zeros((rows4, Dv2), q.dtype)
        Oi = np.zeros((n_r, Dv), q.dtype)          # the unnormalised output, on chip throughout
        m = np.full(n_r, -np.inf, q.dtype)
        l = np.zeros(n_r, q.dtype)
        exponent_bits = np.zeros(Bc2, np.int32)    # exp_row's scratch
        for r in range(n_r):
            for d in range(D):
                Qi[r, d] = q[b, h, r0 + r, d]
        for tc in range(tiles_row.shape[0]):
            kind = tiles_row[tc]
            if kind == rules.EMPTY:
                continue                          # skipped: Kj and Vj are never loaded
            c0 = tc * Bc
            n_c = min(c0 + Bc, Nk) - c0
            for c in range(n_c):                  # load Kj, and Vj transposed
                for d in range(D):
                    Kj[c, d] = k[b, kh, c0 + c, d]
                for e in range(Dv):
                    VjT[e, c] = v[b, kh, c0 + c, e]
            matmul_nt(Qi, Kj, Sij, rows4, (n_c + 1) // 2 * 2, D)   # Qi Kj^T
            for r in range(n_r):
                i = r0 + r
                m_new = m[r]
                for c in range(n_c):              # the scores of row i, and their max
                    j = c0 + c
                    s = softcap(Sij[r, c] * scale, cap)
                    if alibi:
                        s -= dtype(slope * alibi_distance(i, j, offset))
                    if kind == rules.PARTIAL and not visible(i, j, offset, left, right):
                        s = -np.inf
                    Sij[r, c] = s
                    m_new = max_nan(m_new, s)
                alpha = dtype(rescale(m[r], m_new))   # how far the old max was too small
                shift = dtype(shift_of(m_new))
                P = Sij[r]                        # row r of the tile, overwritten by p
                if fast_exp:
                    exp_row(P, n_c, shift, exponent_bits)
                else:
                    for c in range(n_c):
                        P[c] = math.exp(P[c] - shift)
                row_sum = dtype(0)
                for c in range(n_c):
                    row_sum += P[c]               # l sums the unrounded P
                if round_bits > 0:                # float16 / bfloat16: P as the matrix unit takes it
                    for c in range(n_c):
                        P[c] = dtype(round_to_bits(P[c], round_bits, round_min_exponent))
                l[r] = alpha * l[r] + row_sum
                m[r] = m_new
                for e in range(Dv):
                    Oi[r, e] *= alpha
            matmul_nt(Sij, VjT, PV, rows4, Dv2, n_c)   # Pij Vj
            for r in range(n_r):
                for e in range(Dv):
                    Oi[r, e] += PV[r, e]
        for r in range(n_r):                      # divide by l once; write Oi and lse once
            row_lse, inv_l = finalize(m[r], l[r])
            lse[b, h, r0 + r] = row_lse
            for e in range(Dv):
                out[b, h, r0 + r, e] = Oi[r, e] * dtype(inv_l)

    @numba.njit(cache=True, parallel=True)
    def forward_kernel(q, k, v, tiles, kv_head, Br, Bc, scale, cap, alibi, slopes,
                       offset, left, right, round_bits, round_min_exponent, fast_exp, out, lse):
        """Every (batch, head, query tile) work item, spread over the cores by prange.

        prange hands each thread a contiguous run of items.  With a causal mask
        later query tiles have more keys to see, so the items go in zigzag
        order (0, Tr-1, 1, Tr-2, ...) and every run mixes light and heavy tiles.
        """
        B, H, Nq = q.shape[0], q.shape[1], q.shape[2]
        Tr = tiles.shape[0]
        for item in numba.prange(B * H * Tr):
            bh, z = item // Tr, item % Tr
            b, h = bh // H, bh % H
            t = z // 2 if z % 2 == 0 else Tr - 1 - z // 2
            r0 = t * Br
            query_tile(q, k, v, b, h, kv_head[h], r0, min(r0 + Br, Nq), tiles[t], Br, Bc,
                       q.dtype.type(scale), q.dtype.type(cap), alibi, slopes[b, h],
                       offset, left, right, round_bits, round_min_exponent, fast_exp, out, lse)


def run_kernel(launch, q, k, v):
    """Launch ``forward_kernel`` with a host plan on prepared (contiguous, acc-dtype) q, k, v: (out, lse) in acc dtype."""
    B, H, Nq, _ = q.shape
    out = np.empty((B, H, Nq, v.shape[3]), dtype=launch.acc_dtype)
    lse = np.empty((B, H, Nq), dtype=launch.acc_dtype)
    try:
        forward_kernel(q, k, v, launch.tiles, launch.kv_head, launch.Br, launch.Bc,
                       launch.softmax_scale, launch.softcap, launch.alibi, launch.slopes,
                       launch.offset, launch.left, launch.right, launch.round_bits,
                       launch.round_min_exponent, launch.acc_dtype == np.float32, out, lse)
    except numba.core.errors.NumbaError as error:
        raise RuntimeError(f"flash_numba_cpu failed to compile for {q.dtype} inputs: {error}") from error
    return out, lse


def flash_forward(q, k, v, opts, mask):
    """The compiled forward for validated dense inputs: (out in q's dtype, lse)."""
    out, lse = run_kernel(*host.prepare(q, k, v, opts, mask, *host.DEFAULT_TILES["flash_numba_cpu"]))
    # The NaN rule, on the host like every impl: a NaN in V reaches rows that
    # cannot see its key through 0 * NaN, and such a row must not report an lse
    # that looks healthy.
    lse = nan_lse_where_out_is_nan(out, lse)
    return out.astype(rules.out_dtype(q.dtype), copy=False), lse.astype(rules.lse_dtype(q.dtype), copy=False)


attention_forward = flash_forward
