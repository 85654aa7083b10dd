"""What a work item of chapter 08's kernel does to one tile besides BLAS: the tile pieces.

The register micro-kernel (``matmul_nt``, version ``microkernel``), the
vectorised exp, and the row passes that turn a tile of scores Sij into Pij
while they update the online softmax's (m, l) and rescale Oi: one score at a
time through the scalar rules (``softmax_tile_scalar``), whole-row loops with
no branch (``softmax_tile_vector``), and in base 2 with two passes over a row
(``softmax_tile_exp2``); then ``round_p``, P as the matrix unit takes it.
Chapter 12's compiled backward shares the exp and the masks.

Two small LLVM intrinsics let the base-2 pass vectorise where plain Python
cannot say what it means: ``maximum`` (IEEE 754-2019's maximum, a NaN on either
side wins: Python's ``max`` drops a NaN on one side, and LLVM vectorises neither
it nor a compare-and-select max without 'nnan'), and ``float_from_bits`` (the
float32 with a given bit pattern, no instruction at all: 2**k from k's exponent
bits inside the loop, where ``exp_row`` needs a second pass over a view).
"""
from __future__ import annotations

import math

import numpy as np

try:
    import numba
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic
except ModuleNotFoundError:  # an optional package missing: the impl is unavailable, nothing else
    numba = None

from ...core import rules

# What fastmath may do here (see the module docstring): no 'nnan', no 'ninf'.
FASTMATH = {"reassoc", "contract", "arcp", "nsz"}
# exp_row's constants: ln 2 split in two (Cody and Waite), and exp(r) on
# [-ln 2, 0] as a degree-6 polynomial (Chebyshev fit, coefficients in float32).
LOG2E, LN2 = rules.LOG2E, rules.LN2
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4
EXP_POLY = (1.0, 0.9999997615814209, 0.4999949038028717, 0.1666249781847,
            0.041497647762298584, 0.007970437407493591, 0.0009860550053417683)


if numba is not None:
    @intrinsic
    def maximum(typingctx, a, b):
        """IEEE 754-2019 maximum(a, b) of two floats of one type: a NaN on either side wins.

        LLVM's ``llvm.maximum``, which its loop vectorizer turns into SIMD code
        for a reduction (a row's max), with no 'nnan' needed."""
        if not (isinstance(a, types.Float) and a == b):
            return None

        def codegen(context, builder, signature, args):
            t = context.get_value_type(a)
            name = f"llvm.maximum.f{a.bitwidth}"
            return builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t]), name), args)
        return a(a, b), codegen

    @intrinsic
    def float_from_bits(typingctx, bits):
        """The float32 whose bit pattern is the low 32 bits of the integer ``bits``: a bitcast, no instruction."""
        if not isinstance(bits, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            low = context.cast(builder, args[0], bits, types.int32)
            return builder.bitcast(low, ir.FloatType())
        return types.float32(bits), codegen

    _rule = numba.njit(cache=True)
    visible = _rule(rules.visible)
    alibi_anchor = _rule(rules.alibi_anchor)
    alibi_rebased_distance = _rule(rules.alibi_rebased_distance)
    softcap = _rule(rules.softcap)
    max_nan = _rule(rules.max_nan)
    shift_of = _rule(rules.shift_of)
    rescale = _rule(rules.rescale)
    rescale_exp2 = _rule(rules.rescale_exp2)
    finalize = _rule(rules.finalize)
    round_to_bits = _rule(rules.round_to_bits)

    @numba.njit(cache=True)
    def alibi_row(row, n_c, centre, slope):
        """ALiBi on one row of a tile, rebased: score c -= slope |centre - c|, centre = the row's
        ``alibi_anchor`` - j0 (in tile columns)."""
        dtype = row.dtype.type
        for c in range(n_c):
            row[c] -= dtype(slope * abs(centre - c))

    @numba.njit(cache=True)
    def hide_outside_window(row, n_c, centre, left, right):
        """A PARTIAL tile's mask on one row: the keys outside [lo, hi) (tile columns; centre = i + offset - j0,
        the window's sides left / right, -1 unbounded) become -inf; a branch per row, none per score."""
        lo, hi = 0, n_c
        if left >= 0:
            lo = min(max(centre - left, 0), n_c)
        if right >= 0:
            hi = max(min(centre + right + 1, n_c), lo)
        neg_inf = row.dtype.type(-np.inf)
        for c in range(lo):
            row[c] = neg_inf
        for c in range(hi, n_c):
            row[c] = neg_inf

    @numba.njit(inline="always", fastmath={"contract"})
    def exp_parts(x):
        """exp(x) = p 2**k for float32 x <= 0, as (p, the exponent bits of 2**k); see ``exp_row``."""
        underflow = x < np.float32(-87.0)
        if underflow:
            x = np.float32(-87.0)
        k = np.int32(x * np.float32(LOG2E))             # toward 0: k >= x / ln 2
        r = x - np.float32(k) * np.float32(LN2_HI)       # exact: k and LN2_HI have few bits
        r = r - np.float32(k) * np.float32(LN2_LO)
        p = np.float32(EXP_POLY[6])
        for i in range(5, -1, -1):                       # Horner
            p = p * r + np.float32(EXP_POLY[i])
        return p, np.int32(0) if underflow else (k + np.int32(127)) << 23

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
            P[c], exponent_bits[c] = exp_parts(P[c] - shift)
        two_to_k = exponent_bits.view(np.float32)            # the float32 with exponent k, mantissa 1
        for c in range(n):
            P[c] *= two_to_k[c]

    @numba.njit(cache=True, fastmath={"contract"})
    def exp_row_shifted(P, n, shifts, exponent_bits):
        """P[:n] = exp(P[:n] - shifts[:n]): ``exp_row`` with a shift per element (chapter 12's transposed
        tile: a row is one key against many query rows, each with its own lse), in one pass."""
        for c in range(n):
            P[c], exponent_bits[c] = exp_parts(P[c] - shifts[c])
        two_to_k = exponent_bits.view(np.float32)
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
    def softmax_tile_scalar(S, n_r, n_c, i0, j0, kind, scale, cap, alibi, slope, offset, Nk, left, right,
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
                    s -= dtype(slope * alibi_rebased_distance(i, j, offset, Nk))
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
    def softmax_tile_vector(S, n_r, n_c, i0, j0, kind, scale, cap, alibi, slope, offset, Nk, left, right,
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
                alibi_row(row, n_c, alibi_anchor(i, offset, Nk) - j0, slope)
            if kind == rules.PARTIAL:
                hide_outside_window(row, n_c, i + offset - j0, left, right)
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

    @numba.njit(cache=True, fastmath=FASTMATH)
    def exp2_and_sum(P, n, shift):
        """P[:n] = 2**(P[:n] - shift) in float32, in place, for scores at or below ``shift``; their sum.

        One loop that vectorises, for scores in log2 units: x = k + f with k
        = int(x) (toward 0, so f in (-1, 0] is exact: no Cody-Waite split),
        2**f = exp(f ln 2) from ``exp_row``'s polynomial, 2**k from k's exponent
        bits (``float_from_bits``).  Below -127 (2**k would leave float32's
        normal range) p is exactly 0, so a masked score (-inf) gives 0; a NaN
        stays NaN (its integer part is taken from -127, its f is NaN).
        """
        total = np.float32(0.0)
        for c in range(n):
            x = P[c] - shift
            k = np.int32(x if x > np.float32(-127.0) else np.float32(-127.0))
            f = (x - np.float32(k)) * np.float32(LN2)
            p = np.float32(EXP_POLY[6])
            for i in range(5, -1, -1):                                  # Horner
                p = p * f + np.float32(EXP_POLY[i])
            p *= float_from_bits((k + np.int32(127)) << np.int32(23))
            p = np.float32(0.0) if x < np.float32(-127.0) else p
            P[c] = p
            total += p
        return total

    @numba.njit(cache=True, fastmath=FASTMATH)
    def softmax_tile_exp2(S, n_r, n_c, i0, j0, kind, cap, alibi, slope, offset, Nk, left, right,
                          fast_exp, m, l, Oi):
        """``softmax_tile_vector`` in base 2, with two passes over a row where it had four.

        S comes in log2 units: scale * log2(e) was folded into Qi, so the
        scores need no pass of their own, and p = 2**(s - m) (m, and so lse's
        m, in log2 units too; ``versions.write_rows_base2`` turns lse back).  The cap and the
        bias work in natural units, converted on the way.  Pass one: the row's
        max, by ``maximum`` (vectorised; a NaN score wins, so the row comes out
        NaN).  Pass two: 2**(s - m) and its sum in one loop.  Oi is rescaled
        only where the max moved (alpha != 1).
        """
        dtype = S.dtype.type
        neg_inf = dtype(-np.inf)
        for r in range(n_r):
            i = i0 + r
            row = S[r]
            if cap > 0:                           # cap tanh(s / cap) of the natural score s = row ln 2
                to_natural, cap2 = dtype(LN2) / cap, cap * dtype(LOG2E)
                for c in range(n_c):
                    row[c] = cap2 * math.tanh(row[c] * to_natural)
            if alibi:
                alibi_row(row, n_c, alibi_anchor(i, offset, Nk) - j0, slope * LOG2E)
            if kind == rules.PARTIAL:
                hide_outside_window(row, n_c, i + offset - j0, left, right)
            m_tile = neg_inf
            for c in range(n_c):
                m_tile = maximum(m_tile, row[c])
            m_new = maximum(m[r], m_tile)
            alpha = dtype(rescale_exp2(m[r], m_new))
            shift = dtype(shift_of(m_new))
            if fast_exp:
                row_sum = exp2_and_sum(row, n_c, shift)
            else:
                row_sum = dtype(0)
                for c in range(n_c):
                    row[c] = np.exp2(row[c] - shift)
                    row_sum += row[c]
            l[r] = alpha * l[r] + row_sum
            m[r] = m_new
            if alpha != 1:
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
