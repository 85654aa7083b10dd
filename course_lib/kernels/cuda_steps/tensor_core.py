"""Steps ``mma_f16`` and ``mma_3xtf32``: both tile matmuls on the tensor cores, FlashAttention-2's way.

Every step before this one computes S = Q K^T and O += P V with one FMA per
multiply-add, about 67 TFLOP/s on an H200 however well it is fed.  A tensor
core does a whole 16 x 8 x 16 product per warp-wide instruction (``mma.sync``,
course_lib.kernels.cuda_steps.mma), an order of magnitude faster, if the
operands are halves (float16 / bfloat16) or tf32.  The kernel is FA2's:

- a block is ``warps`` warps; each warp owns 16 query rows, and its Q
  fragments stay in registers for the whole kernel (no shared memory for Q);
- each K / V tile of ``Bc`` keys is loaded by the whole block into shared
  memory (rows padded by 4 words: a warp's fragment loads hit 32 different
  banks);
- S (16 x Bc per warp) is ``Bc / 8`` accumulator fragments; the rules (scale,
  softcap, ALiBi, the mask on PARTIAL and tail tiles) are applied to them where
  they are, element (row, column) being ``mma.c_elem(lane, reg)``;
- the row max and sum: a row's 16 x 8 fragments live on the 4 lanes of a quad,
  so two ``shfl_xor`` (1, 2) finish each reduction: no shared memory, no barrier;
- P goes from S's accumulators straight into P V's A fragments (two floats
  packed into one word of halves: ``mma``'s register reuse), so P never leaves
  the registers either;
- O (16 x Dv per warp) is ``Dv / 8`` accumulator fragments, in float32.

``mma_f16`` takes float16 or bfloat16 inputs (one m16n8k16 per 16 x 8 x 16)
and rounds P to the input dtype before P V, as ``core.rules`` says every
low-precision kernel does.  For P V's B fragments the V tile is stored
transposed (a word holds two keys of one output dim: ``mma.low_halves``).

``mma_3xtf32`` takes float32 and keeps float32 accuracy on the tf32 tensor
cores as PyTorch's efficient kernel does: every operand is split into a tf32
high part and its remainder, x = hi + lo, and a b = hi_a hi_b + hi_a lo_b +
lo_a hi_b (three m16n8k8, the lo lo term below float32's rounding).  P's
accumulators are not in A's layout for m16n8k8; the keys of each 8-key chunk
are taken in the order (0, 2, 4, 6, 1, 3, 5, 7) by A and by B alike, which
puts them there (a sum does not care in which order its terms come).

The layout (tilings, where P's accumulators go, the swizzle and the rows each
lane gives ldmatrix) is plain Python in ``mma_layout``.  Tiles skipped, split-KV
and the launch are ``run``'s (the same visit lists, the same (out, lse) partials
and merge).  Inline PTX runs on a GPU only: not in
numba's simulator, not in cudacheck (``available``).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

try:
    import numba
    from numba import cuda, float32, uint32
except ModuleNotFoundError:  # numba (with numba-cuda) missing: the steps are unavailable
    numba = None

from ...core import rules
from ...core.options import call_forward
from ...core.reference import nan_lse_where_out_is_nan
from .. import launch as host
from .device import on_gpu
from .mma_layout import (DECODE_ROWS, HALF_A, INPUT_DTYPE, KINDS, RUN_CHAIN, RUN_TUNED, STEPS, TF32_A, TUNED,  # noqa: F401
                         TUNED_STAGED, MmaTiling, decode_tiling, default_tiling, k_address, k_rows, kind_of,
                         padded, shared_bytes, staged_tiling, swizzle, tf32_key, v_address, v_rows,
                         v_word_address, words)   # the layout (re-exported)
from .run import Plan, kernel_args
from .run import launcher as run_launcher
from .tiling import MAX_SHARED, STATIC_SHARED
from .tuning import decode_splits as _decode_splits

if numba is not None:
    from . import mma
    from .device import alibi_distance, finalize, rescale_exp2, shift_of, softcap, visible

def available() -> bool:
    """Inline PTX needs a real GPU (sm_80 or newer for these mma shapes)."""
    return numba is not None and on_gpu()


_KERNELS = {}


def unroll(n, body):
    """A device function ``run(*args)`` that calls ``body(i, *args)`` for i = 0, 1, ..., n - 1, written out:
    i is a constant in every call.  Numba cannot be told to unroll a loop, and LLVM unrolls only short
    bodies; a fragment indexed by a loop counter that is not unrolled lives in local memory, not in
    registers (ptxas -v's "stack frame").  The 3xTF32 products (three mma and six splits a step) are too
    long for LLVM, so they are written out this way."""
    return _unroll(body, 0, n)


def _unroll(body, start, n):
    """body(i, *args) for i in [start, start + n): halves, so that typing recurses log2(n) deep, not n."""
    if n == 1:
        @cuda.jit(device=True, forceinline=True)
        def one(*args):
            body(start, *args)
        return one
    first, second = _unroll(body, start, n // 2), _unroll(body, start + n // 2, n - n // 2)

    @cuda.jit(device=True, forceinline=True)
    def both(*args):
        first(*args)
        second(*args)
    return both


def make_mma_kernel(kind: str, tiling: MmaTiling, D: int, Dv: int):
    """The tensor-core forward for ``kind`` ("f16", "bf16" or "tf32x3"), built once per shape."""
    key = (kind, tiling, D, Dv)
    if key in _KERNELS:
        return _KERNELS[key]
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    limit = MAX_SHARED if tiling.stages > 1 else STATIC_SHARED     # cp.async's buffers: dynamic shared memory
    if shared_bytes(kind, tiling, D, Dv) > limit or tiling.Bc % 16:
        raise ValueError(f"{tiling} at D={D}, Dv={Dv} takes {shared_bytes(kind, tiling, D, Dv)} bytes of shared "
                         f"memory (at most {limit}) or Bc is not a multiple of 16")
    if tiling.ldmatrix and tiling.stages == 1 and not tiling.staged:
        raise ValueError(f"ldmatrix's swizzled tiles are filled by staged loads or by cp.async (stages=2), got {tiling}")
    if tiling.stages not in (1, 2) or (tiling.stages == 2 and not tiling.ldmatrix):
        raise ValueError(f"stages is 1 or 2, and 2 (cp.async) copies rows as they are: it needs ldmatrix=True "
                         f"(V by keys, swizzled), got {tiling}")
    TF32 = kind.startswith("tf32")
    THREE = kind == "tf32x3"
    mma_op = {"f16": mma.mma_f16, "bf16": mma.mma_bf16, "tf32x1": mma.mma_tf32, "tf32x3": mma.mma_tf32}[kind]
    pack = mma.pack_bf16 if kind == "bf16" else mma.pack_f16
    Bc, NTH, W = tiling.Bc, tiling.threads, tiling.warps
    Br = tiling.Br
    DW = padded(D, kind) // (1 if TF32 else 2)      # words per row of q and k
    EP = padded(Dv, kind)                           # output dims computed
    VW = EP // (1 if TF32 else 2)                   # words per row of v
    KC = DW // 8                                    # 8-word k chunks of S = Q K^T
    NT = Bc // 8                                    # 8-key column tiles of S
    NE = EP // 8                                    # 8-dim column tiles of O
    PC = Bc // 8 if TF32 else Bc // 16              # k chunks of O += P V
    KSTRIDE = DW + 4
    NKW = -(-Bc * DW // NTH)                        # K words a thread fetches per tile
    NVW = -(-Bc * VW // NTH) if TF32 else -(-(Bc // 2) * VW // NTH)   # V words (pairs of words for halves)
    STAGED, PREFETCH = tiling.staged, tiling.prefetch
    LD, ASYNC = tiling.ldmatrix, tiling.stages == 2
    BYKEY = TF32 or LD                              # V stored by keys (rows of VW words), not transposed
    if LD:      # flat, swizzled tiles (ldmatrix), one per stage; V by keys
        NVW = -(-Bc * VW // NTH)
        KTILE, VTILE = Bc * DW, Bc * VW
    VROWS, VCOLS = (Bc, EP + 4) if TF32 else (EP, Bc // 2 + 4)
    KCH, VCH = DW // 4, VW // 4                     # 16-byte chunks a row of K, of V
    NKC, NVC = -(-Bc * KCH // NTH), -(-Bc * VCH // NTH)   # chunks a thread copies a tile (cp.async)
    NEG_INF = float32(-math.inf)
    LN2 = float32(rules.LN2)
    ALL = 0xFFFFFFFF
    a_word, b_word, c_elem = mma.a_word_gpu, mma.b_word_gpu, mma.c_elem_gpu
    key_of = cuda.jit(device=True)(tf32_key)
    swz, k_row, v_row, k_addr, v_addr, vw_addr = (cuda.jit(device=True)(f) for f in (
        swizzle, k_rows, v_rows, k_address, v_address, v_word_address))
    K_FOLDED, V_FOLDED = KCH % 8 == 0, VCH % 8 == 0     # rows of whole 128-byte lines: the folded addresses
    to_tf32, float_of, max_nan = mma.to_tf32, mma.float_of, mma.max_nan

    @cuda.jit(device=True, inline=True)
    def split(w):
        """A float32 (its word) -> (hi, lo): hi its tf32, lo the tf32 of what hi leaves out (exactly x - hi)."""
        hi = mma.round_tf32(w)
        return hi, mma.round_tf32(mma.word_of(float_of(w) - float_of(hi)))

    @cuda.jit(device=True, inline=True)
    def product(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """C + A B on the tensor cores: one mma (plain TF32: each operand rounded to tf32), or 3xTF32's
        three (small terms first)."""
        if not TF32:
            return mma_op(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        if not THREE:
            return mma_op(to_tf32(float_of(a0)), to_tf32(float_of(a1)), to_tf32(float_of(a2)),
                          to_tf32(float_of(a3)), to_tf32(float_of(b0)), to_tf32(float_of(b1)), c0, c1, c2, c3)
        h0, l0 = split(a0)
        h1, l1 = split(a1)
        h2, l2 = split(a2)
        h3, l3 = split(a3)
        hb0, lb0 = split(b0)
        hb1, lb1 = split(b1)
        c0, c1, c2, c3 = mma_op(l0, l1, l2, l3, hb0, hb1, c0, c1, c2, c3)
        c0, c1, c2, c3 = mma_op(h0, h1, h2, h3, lb0, lb1, c0, c1, c2, c3)
        return mma_op(h0, h1, h2, h3, hb0, hb1, c0, c1, c2, c3)

    @cuda.jit(device=True, fastmath=True)
    def rule1(x, lane, r, row0, col0, Nk, edge, scale, cap, alibi, slope, offset, left, right):
        row, col = c_elem(lane, r)
        sc = x * scale
        if cap > 0:
            sc = float32(softcap(sc, cap))
        if alibi:
            sc -= slope * float32(alibi_distance(row0 + row, col0 + col, offset))
        if edge:
            if col0 + col >= Nk or not visible(row0 + row, col0 + col, offset, left, right):
                sc = NEG_INF
        return sc

    @cuda.jit(device=True, fastmath=True)
    def rule(x0, x1, x2, x3, lane, row0, col0, Nk, edge, scale, cap, alibi, slope, offset, left, right):
        """The rules for one 16 x 8 fragment of scores, in log2 units: scale, softcap, ALiBi, the mask."""
        return (rule1(x0, lane, 0, row0, col0, Nk, edge, scale, cap, alibi, slope, offset, left, right),
                rule1(x1, lane, 1, row0, col0, Nk, edge, scale, cap, alibi, slope, offset, left, right),
                rule1(x2, lane, 2, row0, col0, Nk, edge, scale, cap, alibi, slope, offset, left, right),
                rule1(x3, lane, 3, row0, col0, Nk, edge, scale, cap, alibi, slope, offset, left, right))

    @cuda.jit(device=True, forceinline=True)
    def fetch(k, v, b, kh, c0, Nk, t, kw, vw):
        """Thread t's words of the K and V tiles at key c0 into registers: every load issued before any is
        used (NKW + NVW of them, constant counts: the loops are unrolled), zeros past Nk."""
        for u in range(NKW):
            x = t + u * NTH
            val = uint32(0)
            if x < Bc * DW and c0 + x // DW < Nk:
                val = k[b, kh, c0 + x // DW, x % DW]
            kw[u] = val
        for u in range(NVW):
            x = t + u * NTH
            lo = uint32(0)
            hi = uint32(0)
            if BYKEY:
                if x < Bc * VW and c0 + x // VW < Nk:
                    lo = v[b, kh, c0 + x // VW, x % VW]
            else:       # keys 2p and 2p + 1, word w
                p = x // VW
                if x < (Bc // 2) * VW and c0 + 2 * p < Nk:
                    lo = v[b, kh, c0 + 2 * p, x % VW]
                if x < (Bc // 2) * VW and c0 + 2 * p + 1 < Nk:
                    hi = v[b, kh, c0 + 2 * p + 1, x % VW]
            vw[u, 0] = lo
            vw[u, 1] = hi

    @cuda.jit(device=True, forceinline=True)
    def place(kw, vw, ks, vs, t):
        """The words fetch loaded, into the shared tiles (V transposed for the half kinds, unless LD)."""
        for u in range(NKW):
            x = t + u * NTH
            if x < Bc * DW:
                if LD:
                    ks[swz(x // DW, x % DW, DW)] = kw[u]
                else:
                    ks[x // DW, x % DW] = kw[u]
        for u in range(NVW):
            x = t + u * NTH
            if LD:
                if x < Bc * VW:
                    vs[swz(x // VW, x % VW, VW)] = vw[u, 0]
            elif TF32:
                if x < Bc * VW:
                    vs[x // VW, x % VW] = vw[u, 0]
            elif x < (Bc // 2) * VW:
                w = x % VW
                vs[2 * w, x // VW] = mma.low_halves(vw[u, 0], vw[u, 1])
                vs[2 * w + 1, x // VW] = mma.high_halves(vw[u, 0], vw[u, 1])

    @cuda.jit(device=True, forceinline=True)
    def copy_rows(src, tile, base, rw, chunks, per_thread, c0, Nk, t):
        """Thread t's 16-byte chunks of Bc rows of one head's ``src`` (``rw`` words, ``chunks`` chunks a row)
        at key c0, by cp.async, into ``tile`` at word ``base`` (swizzled); rows past Nk zero-filled (0 bytes
        read: the address is clamped to a real row).  When the threads cover the tile evenly, no test."""
        for u in range(per_thread):
            x = t + u * NTH
            if (Bc * chunks) % NTH == 0 or x < Bc * chunks:
                row, w = x // chunks, 4 * (x % chunks)
                mma.cp_async16(tile, base + swz(row, w, rw), src, min(c0 + row, Nk - 1) * rw + w,
                               16 if c0 + row < Nk else 0)

    @cuda.jit(device=True, forceinline=True)
    def copy(kh_, vh_, c0, Nk, t, ks, vs, kb, vb):
        """The K and V tiles at key c0 of one head (kh_, vh_: its (keys, words) rows), by cp.async, into the
        tiles at words kb and vb."""
        copy_rows(kh_, ks, kb, DW, KCH, NKC, c0, Nk, t)
        copy_rows(vh_, vs, vb, VW, VCH, NVC, c0, Nk, t)

    @cuda.jit(device=True, forceinline=True)
    def s_step_ld(x, qf, ks, kb, s, lane):
        """S's fragments j and j + 1 += Q's chunk kc times K's (x = kc NT / 2 + j / 2): their four B words
        by one ldmatrix (k_rows)."""
        kc, j = x // (NT // 2), 2 * (x % (NT // 2))
        if K_FOLDED:
            at = k_addr(lane, j, kc, DW)
        else:
            row, w = k_row(lane, j, kc)
            at = swz(row, w, DW)
        b0, b1, b2, b3 = mma.ldmatrix_x4(ks, kb + at)
        s[j, 0], s[j, 1], s[j, 2], s[j, 3] = product(qf[kc, 0], qf[kc, 1], qf[kc, 2], qf[kc, 3], b0, b1,
                                                     s[j, 0], s[j, 1], s[j, 2], s[j, 3])
        s[j + 1, 0], s[j + 1, 1], s[j + 1, 2], s[j + 1, 3] = product(
            qf[kc, 0], qf[kc, 1], qf[kc, 2], qf[kc, 3], b2, b3, s[j + 1, 0], s[j + 1, 1], s[j + 1, 2], s[j + 1, 3])

    @cuda.jit(device=True, forceinline=True)
    def p_as_a(s, pc):
        """P's chunk pc as A's four words, straight from S's accumulators: for tf32 the floats TF32_A of one
        8-key tile (A's word w is key tf32_key(w)); for halves, two 8-key tiles' pairs of floats, rounded
        and packed (HALF_A)."""
        if TF32:
            return (mma.word_of(s[pc, TF32_A[0]]), mma.word_of(s[pc, TF32_A[1]]),
                    mma.word_of(s[pc, TF32_A[2]]), mma.word_of(s[pc, TF32_A[3]]))
        return (pack(s[2 * pc + HALF_A[0][0], HALF_A[0][1]], s[2 * pc + HALF_A[0][0], HALF_A[0][2]]),
                pack(s[2 * pc + HALF_A[1][0], HALF_A[1][1]], s[2 * pc + HALF_A[1][0], HALF_A[1][2]]),
                pack(s[2 * pc + HALF_A[2][0], HALF_A[2][1]], s[2 * pc + HALF_A[2][0], HALF_A[2][2]]),
                pack(s[2 * pc + HALF_A[3][0], HALF_A[3][1]], s[2 * pc + HALF_A[3][0], HALF_A[3][2]]))

    @cuda.jit(device=True, forceinline=True)
    def v_word(vs, vb, row, col):
        """Word (row, col) of the V tile: padded rows, or the swizzled tile at word vb (LD)."""
        if LD:
            return vs[vb + swz(row, col, VW)]
        return vs[row, col]

    @cuda.jit(device=True, forceinline=True)
    def pv_step_ld(x, s, vs, vb, o, lane):
        """O's fragments e and e + 1 += P's chunk pc times V's (x = pc NE / 2 + e / 2), halves: the four B
        words by one transposed ldmatrix (v_rows)."""
        pc, e = x // (NE // 2), 2 * (x % (NE // 2))
        if V_FOLDED:
            at = v_addr(lane, e, pc, VW)
        else:
            row, w = v_row(lane, e, pc)
            at = swz(row, w, VW)
        b0, b1, b2, b3 = mma.ldmatrix_x4_trans(vs, vb + at)
        a0, a1, a2, a3 = p_as_a(s, pc)
        o[e, 0], o[e, 1], o[e, 2], o[e, 3] = product(a0, a1, a2, a3, b0, b1, o[e, 0], o[e, 1], o[e, 2], o[e, 3])
        o[e + 1, 0], o[e + 1, 1], o[e + 1, 2], o[e + 1, 3] = product(
            a0, a1, a2, a3, b2, b3, o[e + 1, 0], o[e + 1, 1], o[e + 1, 2], o[e + 1, 3])

    @cuda.jit(device=True, forceinline=True)
    def s_step(x, qf, ks, s, lane):
        """S's fragment j += Q's chunk kc times K's (x = kc NT + j)."""
        kc, j = x // NT, x % NT
        n0, w0 = b_word(lane, 0)
        n1, w1 = b_word(lane, 1)
        s[j, 0], s[j, 1], s[j, 2], s[j, 3] = product(
            qf[kc, 0], qf[kc, 1], qf[kc, 2], qf[kc, 3],
            ks[j * 8 + n0, kc * 8 + w0], ks[j * 8 + n1, kc * 8 + w1],
            s[j, 0], s[j, 1], s[j, 2], s[j, 3])

    @cuda.jit(device=True, forceinline=True)
    def pv_step(x, s, vs, vb, o, lane):
        """O's fragment e += P's chunk pc times V's (x = pc NE + e): P's fragments become A's, V's words
        one at a time (for 3xTF32's swizzled tiles too: ldmatrix moves halves, it cannot transpose words)."""
        pc, e = x // NE, x % NE
        n0, w0 = b_word(lane, 0)
        n1, w1 = b_word(lane, 1)
        a0, a1, a2, a3 = p_as_a(s, pc)
        if TF32 and LD and V_FOLDED:   # the same words, their swizzled addresses folded
            b0 = vs[vb + vw_addr(lane, 0, e, pc, VW)]
            b1 = vs[vb + vw_addr(lane, 1, e, pc, VW)]
        elif TF32:   # B's word w is key tf32_key(w) of the chunk, as A's
            b0 = v_word(vs, vb, pc * 8 + key_of(w0), e * 8 + n0)
            b1 = v_word(vs, vb, pc * 8 + key_of(w1), e * 8 + n1)
        else:      # V transposed: a word holds two keys of one dim
            b0 = v_word(vs, vb, e * 8 + n0, pc * 8 + w0)
            b1 = v_word(vs, vb, e * 8 + n1, pc * 8 + w1)
        o[e, 0], o[e, 1], o[e, 2], o[e, 3] = product(a0, a1, a2, a3, b0, b1, o[e, 0], o[e, 1], o[e, 2], o[e, 3])

    s_product = unroll(KC * NT // 2, s_step_ld) if LD else unroll(KC * NT, s_step)
    pv_product = unroll(PC * NE // 2, pv_step_ld) if LD and not TF32 else unroll(PC * NE, pv_step)

    @cuda.jit(fastmath=True)
    def mma_forward_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes,
                           offset, left, right, out, lse):
        """q (B, H, Nq, DW) words, k (B, Hk, Nk, DW), v (B, Hk, Nk, VW) -> out (S, B, H, Nq, Dv),
        lse (S, B, H, Nq); grid (B*H, Tr, S), the last query tile first."""
        H, Nq, Nk = q.shape[1], q.shape[2], k.shape[2]
        b = cuda.blockIdx.x // H
        h = cuda.blockIdx.x % H
        tr = cuda.gridDim.y - 1 - cuda.blockIdx.y
        kh = kv_head[h]
        split_ = cuda.blockIdx.z
        t = cuda.threadIdx.x
        lane = t % 32
        row0 = tr * Br + 16 * (t // 32)     # this warp's first query row
        slope = float32(slopes[b, h])
        if ASYNC:    # two stages of each tile, in dynamic shared memory (above 48 KB at D = 128)
            dyn = cuda.shared.array(0, uint32)
            ks = dyn[:2 * KTILE]
            vs = dyn[2 * KTILE:2 * KTILE + 2 * VTILE]
        elif LD:
            ks = cuda.shared.array(KTILE, uint32)
            vs = cuda.shared.array(VTILE, uint32)
        else:
            ks = cuda.shared.array((Bc, KSTRIDE), uint32)
            vs = cuda.shared.array((VROWS, VCOLS), uint32)

        # this warp's Q fragments, for the whole kernel (zeros past Nq)
        qf = cuda.local.array((KC, 4), uint32)
        for kc in range(KC):
            for r in range(4):
                row, w = a_word(lane, r)
                val = uint32(0)
                if row0 + row < Nq:
                    val = q[b, h, row0 + row, kc * 8 + w]
                qf[kc, r] = val

        s = cuda.local.array((NT, 4), float32)
        o = cuda.local.array((NE, 4), float32)
        m = cuda.local.array(2, float32)       # the thread's two rows: g and g + 8
        l = cuda.local.array(2, float32)
        kw = cuda.local.array(NKW, uint32)     # a thread's share of a K tile, and of a V tile
        vw = cuda.local.array((NVW, 2), uint32)
        for e in range(NE):
            for r in range(4):
                o[e, r] = float32(0.0)
        for r in range(2):
            m[r] = NEG_INF
            l[r] = float32(0.0)

        n_all = nvisit[tr]
        per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
        first = split_ * per
        last = min(n_all, first + per)
        k_head, v_head = k[b, kh], v[b, kh]    # this block's head: (keys, words) rows
        if ASYNC and first < last:    # the first tile's copies, in flight before the loop
            copy(k_head, v_head, visit[tr, first] * Bc, Nk, t, ks, vs, 0, 0)
            mma.cp_async_commit()
        for n in range(first, last):
            tc = visit[tr, n]
            c0 = tc * Bc
            stage = (n - first) & 1
            if ASYNC:
                if n + 1 < last:   # the next tile's copies into the other stage, then wait for this tile's
                    copy(k_head, v_head, visit[tr, n + 1] * Bc, Nk, t, ks, vs, (1 - stage) * KTILE,
                         (1 - stage) * VTILE)
                    mma.cp_async_commit()
                    mma.cp_async_wait1()
                else:
                    mma.cp_async_wait0()
                cuda.syncthreads()         # every thread's copies of this tile have landed
            elif not STAGED:   # each thread loads and stores a word at a time: one load in flight
                cuda.syncthreads()             # nobody reads the last tile any more
                for x in range(t, Bc * DW, NTH):
                    c = x // DW
                    w = x % DW
                    val = uint32(0)
                    if c0 + c < Nk:
                        val = k[b, kh, c0 + c, w]
                    ks[c, w] = val
                if TF32:                        # V as it is: keys by rows
                    for x in range(t, Bc * VW, NTH):
                        c = x // VW
                        w = x % VW
                        val = uint32(0)
                        if c0 + c < Nk:
                            val = v[b, kh, c0 + c, w]
                        vs[c, w] = val
                else:                           # V transposed: a word holds keys 2p and 2p + 1 of one dim
                    for x in range(t, (Bc // 2) * VW, NTH):
                        p = x // VW
                        w = x % VW
                        lo = uint32(0)
                        hi = uint32(0)
                        if c0 + 2 * p < Nk:
                            lo = v[b, kh, c0 + 2 * p, w]
                        if c0 + 2 * p + 1 < Nk:
                            hi = v[b, kh, c0 + 2 * p + 1, w]
                        vs[2 * w, p] = mma.low_halves(lo, hi)
                        vs[2 * w + 1, p] = mma.high_halves(lo, hi)
                cuda.syncthreads()             # the tiles are complete
            else:
                if n == first or not PREFETCH:
                    fetch(k, v, b, kh, c0, Nk, t, kw, vw)     # this tile's words, all in flight at once
                cuda.syncthreads()         # nobody reads the last tile any more
                place(kw, vw, ks, vs, t)
                cuda.syncthreads()         # the tiles are complete
                if PREFETCH and n + 1 < last:   # the next tile's words, in flight during this one
                    fetch(k, v, b, kh, visit[tr, n + 1] * Bc, Nk, t, kw, vw)

            # S = Q K^T: NT accumulator fragments, KC k chunks each
            for j in range(NT):
                for r in range(4):
                    s[j, r] = float32(0.0)
            if LD:
                s_product(qf, ks, stage * KTILE if ASYNC else 0, s, lane)
            else:
                s_product(qf, ks, s, lane)

            # the rules, in log2 units; the mask only on the tiles that need one.  A tile with none of them
            # leaves S unscaled: the scale (> 0) goes into the row max and the exponent's multiply-add
            edge = tiles[tr, tc] == rules.PARTIAL or c0 + Bc > Nk
            ruled = edge or alibi or cap > 0
            plain = not ruled and scale > 0
            ms = scale if plain else float32(1.0)       # what S is multiplied by on its way into exp2
            if ruled:
                for j in range(NT):
                    s[j, 0], s[j, 1], s[j, 2], s[j, 3] = rule(s[j, 0], s[j, 1], s[j, 2], s[j, 3], lane, row0,
                                                              c0 + j * 8, Nk, edge, scale, cap, alibi, slope,
                                                              offset, left, right)
            elif not plain:
                for j in range(NT):
                    for r in range(4):
                        s[j, r] *= scale

            # online softmax on the fragments: a row lives on the 4 lanes of a quad
            for r in range(2):
                mx = NEG_INF
                for j in range(NT):
                    mx = max_nan(mx, max_nan(s[j, 2 * r], s[j, 2 * r + 1]))
                mx = max_nan(mx, cuda.shfl_xor_sync(ALL, mx, 1))
                mx = max_nan(mx, cuda.shfl_xor_sync(ALL, mx, 2))
                m_new = max_nan(m[r], mx * ms)
                alpha = float32(rescale_exp2(m[r], m_new))
                shift = float32(shift_of(m_new))
                m[r] = m_new
                l[r] *= alpha
                for e in range(NE):
                    o[e, 2 * r] *= alpha
                    o[e, 2 * r + 1] *= alpha
                for j in range(NT):
                    for c in range(2):
                        p = rules.exp2(s[j, 2 * r + c] * ms - shift)
                        l[r] += p
                        s[j, 2 * r + c] = p

            # O += P V: P's fragments become A's, V's come from shared memory
            pv_product(s, vs, stage * VTILE if ASYNC else 0, o, lane)
            if ASYNC:
                cuda.syncthreads()         # nobody reads this stage any more: the copy after next may fill it

        # each lane summed its own columns: the quad's four shares make a row's l
        for r in range(2):
            total = l[r]
            total += cuda.shfl_xor_sync(ALL, total, 1)
            total += cuda.shfl_xor_sync(ALL, total, 2)
            row_lse, inv_l = finalize(m[r] * LN2, total)
            i = row0 + lane // 4 + 8 * r
            if i < Nq:
                if lane % 4 == 0:
                    lse[split_, b, h, i] = row_lse
                for e in range(NE):
                    for c in range(2):
                        col = e * 8 + 2 * (lane % 4) + c
                        if col < out.shape[4]:
                            out[split_, b, h, i, col] = o[e, 2 * r + c] * float32(inv_l)

    _KERNELS[key] = mma_forward_kernel
    return mma_forward_kernel


def plan(step, q, k, v, opts, mask, *, tiling=None, splits=1) -> Plan:
    """One launch of ``step``, decided on the host: ``run``'s Plan (the kernel, the grid (B*H, Tr, S), the
    arguments of every micro-tiled step), so that ``run.launcher`` launches it and merges split-KV's pieces."""
    kind = kind_of(step, q.dtype)
    B, H, Nq, D = q.shape
    Dv = v.shape[3]
    tiling = tiling or (decode_tiling(kind, D, Dv) if Nq <= DECODE_ROWS else default_tiling(kind, D, Dv))
    if opts.block_q not in (None, tiling.Br) or opts.block_k not in (None, tiling.Bc):
        raise ValueError(f"{step} runs {tiling.Br} x {tiling.Bc} tiles (warps of 16 rows); pass tiling=MmaTiling(...) "
                         f"to change them, not block_q / block_k")
    kernel = make_mma_kernel(kind, tiling, D, Dv)
    launch = host.prepare(q[:, :, :0], k[:, :, :0], v[:, :, :0], opts, mask, tiling.Br, tiling.Bc)[0]
    args, splits = kernel_args(launch, splits)
    grid = (B * H, launch.tiles.shape[0], splits)
    dynamic = shared_bytes(kind, tiling, D, Dv) if tiling.stages > 1 else 0
    return Plan(step, kernel, grid, tiling.threads, dynamic, args, splits, (B, H, Nq, Dv), launch, tiling)


def decode_splits(step, dtype, B, H, Nq, Nk, D, Dv, tiling=None):
    """Split-KV's rule (``tuning.decode_splits``) for a tensor-core launch: (splits, the numbers it used), for
    the launch's tiling (``decode_tiling`` at decode's few rows); registers taken at their limit, 255."""
    kind = kind_of(step, dtype)
    tiling = tiling or (decode_tiling(kind, D, Dv) if Nq <= DECODE_ROWS else default_tiling(kind, D, Dv))
    return _decode_splits(B * H * -(-Nq // tiling.Br), -(-Nk // tiling.Bc), tiling, D, Dv, regs=255,
                          shared=shared_bytes(kind, tiling, D, Dv))


def launcher(step, q, k, v, opts, mask, *, tiling=None, splits=1):
    """(a zero-argument callable that runs one launch on device arrays, out, lse): the inputs converted and
    copied to the device once, here, so that a timing loop times the kernel (and split-KV's merge) alone."""
    p = plan(step, q, k, v, opts, mask, tiling=tiling, splits=splits)
    kind = kind_of(step, q.dtype)
    qw, kw, vw = (cuda.to_device(words(x, kind)) for x in (q, k, v))
    p = replace(p, args=tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in p.args))
    out = cuda.to_device(np.full(p.out_shape, np.nan, np.float32))
    lse = cuda.to_device(np.full(p.out_shape[:3], np.nan, np.float32))
    parts = (None, None) if p.splits == 1 else (
        cuda.to_device(np.full((p.splits, *p.out_shape), np.nan, np.float32)),
        cuda.to_device(np.full((p.splits, *p.out_shape[:3]), np.nan, np.float32)))
    return run_launcher(p, qw, kw, vw, out, lse, *parts), out, lse


def mma_forward(q, k, v, opts, mask, step="mma_f16", *, tiling=None, splits=1):
    """Run ``step`` on validated dense numpy inputs: (out in the input dtype, lse) (an ``attention_forward``)."""
    if not available():
        raise RuntimeError(f"{step} is inline PTX for a GPU's tensor cores: it runs on a GPU only")
    go, out, lse = launcher(step, q, k, v, opts, mask, tiling=tiling, splits=splits)
    go()
    out, lse = out.copy_to_host(), lse.copy_to_host()
    lse = nan_lse_where_out_is_nan(out, lse).astype(rules.lse_dtype(q.dtype), copy=False)
    return out.astype(rules.out_dtype(q.dtype)), lse


def attention(q, k, v, *, step="mma_f16", tiling=None, splits=1, return_lse=False, **options):
    """``course_lib.attention`` for a tensor-core step with its tiling and split-KV pieces chosen by hand."""
    from functools import partial
    return call_forward(partial(mma_forward, step=step, tiling=tiling, splits=splits), q, k, v,
                        return_lse=return_lse, **options)
