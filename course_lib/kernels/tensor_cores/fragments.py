"""What every tensor-core forward version shares on the device: the products on fragments, the rules and the
online softmax on S's accumulators, Q's fragments and the write-back.

Each piece is built for one ``KernelShape`` (its counts are compile-time constants: a fragment indexed by a
constant stays in registers) and inlined where a version calls it, so the versions in ``versions`` differ
only in how their K / V tiles reach shared memory and how the B fragments leave it:

- ``make_product(kind)``: C + A B on the tensor cores for one 16 x 8 fragment (one mma, one on tf32-rounded
  operands, or 3xTF32's three);
- ``make_padded_products`` / ``make_swizzled_products``: S = Q K^T and O += P V over a whole tile, B read
  word by word from padded tiles, or by ``ldmatrix`` from swizzled ones;
- ``make_tile_math``: Q's fragments, the rules and the online softmax on S, the last division and the
  write-back of (out, lse).

``unroll`` writes a loop out so that its counter is a constant in every call (the backward uses it too).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

from numba import cuda, float32, uint32

from ...core import rules
from ..cuda_steps.device import alibi_rebased_distance, finalize, rescale_exp2, shift_of, softcap, visible
from .instructions import inlined, ops
from .layout import HALF_A, TF32_A, k_address, k_rows, swizzle, tf32_key, v_address, v_rows, v_word_address

NEG_INF = float32(-math.inf)
ALL_LANES = 0xFFFFFFFF
a_word, b_word, c_elem = ops.a_word_gpu, ops.b_word_gpu, ops.c_elem_gpu
key_of = cuda.jit(device=True)(tf32_key)
swz, k_row, v_row, k_addr, v_addr, vw_addr = (cuda.jit(device=True)(f) for f in (
    swizzle, k_rows, v_rows, k_address, v_address, v_word_address))


def unroll(n, body, device=None):
    """A device function ``run(*args)`` that calls ``body(i, *args)`` for i = 0, 1, ..., n - 1, written out:
    i is a constant in every call.  Numba cannot be told to unroll a loop, and LLVM unrolls only short
    bodies; a fragment indexed by a loop counter that is not unrolled lives in local memory, not in
    registers (ptxas -v's "stack frame").  The 3xTF32 products (three mma and six splits a step) are too
    long for LLVM, so they are written out this way.  ``device``: the decorator of each piece (inlined on
    the GPU by default; the simulator takes no ``forceinline``)."""
    return _unroll(body, 0, n, device or inlined())


def _unroll(body, start, n, device):
    """body(i, *args) for i in [start, start + n): halves, so that typing recurses log2(n) deep, not n."""
    if n == 1:
        @device
        def one(*args):
            body(start, *args)
        return one
    first, second = _unroll(body, start, n // 2, device), _unroll(body, start + n // 2, n - n // 2, device)

    @device
    def both(*args):
        first(*args)
        second(*args)
    return both


@cuda.jit(device=True, inline=True)
def split(w):
    """A float32 (its word) -> (hi, lo): hi its tf32, lo the tf32 of what hi leaves out (exactly x - hi)."""
    hi = ops.round_tf32(w)
    return hi, ops.round_tf32(ops.word_of(ops.float_of(w) - ops.float_of(hi)))


def make_product(kind):
    """C + A B on the tensor cores for ``kind``: one mma on halves, one on operands rounded to tf32, or
    3xTF32's three (small terms first)."""
    to_tf32, float_of = ops.to_tf32, ops.float_of
    if kind in ("f16", "bf16"):
        return ops.mma_bf16 if kind == "bf16" else ops.mma_f16
    mma_tf32 = ops.mma_tf32

    @cuda.jit(device=True, inline=True)
    def tf32_product(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return mma_tf32(to_tf32(float_of(a0)), to_tf32(float_of(a1)), to_tf32(float_of(a2)),
                        to_tf32(float_of(a3)), to_tf32(float_of(b0)), to_tf32(float_of(b1)), c0, c1, c2, c3)

    @cuda.jit(device=True, inline=True)
    def three_tf32_product(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        h0, l0 = split(a0)
        h1, l1 = split(a1)
        h2, l2 = split(a2)
        h3, l3 = split(a3)
        hb0, lb0 = split(b0)
        hb1, lb1 = split(b1)
        c0, c1, c2, c3 = mma_tf32(l0, l1, l2, l3, hb0, hb1, c0, c1, c2, c3)
        c0, c1, c2, c3 = mma_tf32(h0, h1, h2, h3, lb0, lb1, c0, c1, c2, c3)
        return mma_tf32(h0, h1, h2, h3, hb0, hb1, c0, c1, c2, c3)
    return three_tf32_product if kind == "tf32x3" else tf32_product


def make_p_as_a(kind):
    """P's chunk pc as A's four words, straight from S's accumulators: for tf32 the floats TF32_A of one
    8-key tile (A's word w is key tf32_key(w)); for halves, two 8-key tiles' pairs of floats, rounded and
    packed (HALF_A)."""
    pack = ops.pack_bf16 if kind == "bf16" else ops.pack_f16

    @inlined()
    def p_as_a_tf32(s, pc):
        return (ops.word_of(s[pc, TF32_A[0]]), ops.word_of(s[pc, TF32_A[1]]),
                ops.word_of(s[pc, TF32_A[2]]), ops.word_of(s[pc, TF32_A[3]]))

    @inlined()
    def p_as_a_halves(s, pc):
        return (pack(s[2 * pc + HALF_A[0][0], HALF_A[0][1]], s[2 * pc + HALF_A[0][0], HALF_A[0][2]]),
                pack(s[2 * pc + HALF_A[1][0], HALF_A[1][1]], s[2 * pc + HALF_A[1][0], HALF_A[1][2]]),
                pack(s[2 * pc + HALF_A[2][0], HALF_A[2][1]], s[2 * pc + HALF_A[2][0], HALF_A[2][2]]),
                pack(s[2 * pc + HALF_A[3][0], HALF_A[3][1]], s[2 * pc + HALF_A[3][0], HALF_A[3][2]]))
    return p_as_a_tf32 if kind.startswith("tf32") else p_as_a_halves


def make_padded_products(shape):
    """(s_product(qf, ks, s, lane), pv_product(s, vs, vb, o, lane)) on padded tiles (rows padded by 4 words:
    a warp's fragment loads hit 32 different banks): K by keys; V by keys for tf32 (B's word w is key
    tf32_key(w) of the chunk, as A's), transposed for halves (a word holds two keys of one dim)."""
    s_tiles, o_tiles = shape.s_tiles, shape.o_tiles
    tf32 = shape.tf32
    product, p_as_a = make_product(shape.kind), make_p_as_a(shape.kind)

    @inlined()
    def s_step(x, qf, ks, s, lane):
        """S's fragment j += Q's chunk kc times K's (x = kc s_tiles + j)."""
        kc, j = x // s_tiles, x % s_tiles
        n0, w0 = b_word(lane, 0)
        n1, w1 = b_word(lane, 1)
        s[j, 0], s[j, 1], s[j, 2], s[j, 3] = product(
            qf[kc, 0], qf[kc, 1], qf[kc, 2], qf[kc, 3],
            ks[j * 8 + n0, kc * 8 + w0], ks[j * 8 + n1, kc * 8 + w1],
            s[j, 0], s[j, 1], s[j, 2], s[j, 3])

    @inlined()
    def v_word(vs, row, col):
        """Word (row, col) of the padded V tile."""
        return vs[row, col]

    @inlined()
    def pv_step(x, s, vs, vb, o, lane):
        """O's fragment e += P's chunk pc times V's (x = pc o_tiles + e): P's fragments become A's."""
        pc, e = x // o_tiles, x % o_tiles
        n0, w0 = b_word(lane, 0)
        n1, w1 = b_word(lane, 1)
        a0, a1, a2, a3 = p_as_a(s, pc)
        if tf32:
            b0 = v_word(vs, pc * 8 + key_of(w0), e * 8 + n0)
            b1 = v_word(vs, pc * 8 + key_of(w1), e * 8 + n1)
        else:
            b0 = v_word(vs, e * 8 + n0, pc * 8 + w0)
            b1 = v_word(vs, e * 8 + n1, pc * 8 + w1)
        o[e, 0], o[e, 1], o[e, 2], o[e, 3] = product(a0, a1, a2, a3, b0, b1, o[e, 0], o[e, 1], o[e, 2], o[e, 3])

    return unroll(shape.k_chunks * s_tiles, s_step), unroll(shape.pv_chunks * o_tiles, pv_step)


def make_k_fragments(shape):
    """k_fragments(ks, kb, j, kc, lane): B's words of S's key tiles j and j + 1 at k chunk kc, from the
    swizzled K tile at word kb, by one ldmatrix (``k_rows``; rows of whole 128-byte lines take the folded
    address, ``k_address``).  Every product on swizzled tiles loads K this way."""
    key_words, k_folded = shape.key_words, shape.k_folded

    @inlined()
    def k_fragments(ks, kb, j, kc, lane):
        if k_folded:
            at = k_addr(lane, j, kc, key_words)
        else:
            row, w = k_row(lane, j, kc)
            at = swz(row, w, key_words)
        return ops.ldmatrix_x4(ks, kb + at)
    return k_fragments


def make_swizzled_products(shape):
    """(s_product(qf, ks, kb, s, lane), pv_product(s, vs, vb, o, lane)) on swizzled, unpadded tiles at words
    kb and vb (ldmatrix's), V by keys: K's B fragments two tiles at once by ldmatrix (k_rows); V's by a
    transposed ldmatrix for halves (v_rows), word by word for tf32 (ldmatrix moves halves, it cannot
    transpose words).  Rows of whole 128-byte lines take the folded addresses."""
    s_tiles, o_tiles, v_words, v_folded = shape.s_tiles, shape.o_tiles, shape.v_words, shape.v_folded
    product, p_as_a = make_product(shape.kind), make_p_as_a(shape.kind)
    k_fragments = make_k_fragments(shape)

    @inlined()
    def s_step(x, qf, ks, kb, s, lane):
        """S's fragments j and j + 1 += Q's chunk kc times K's (x = kc s_tiles / 2 + j / 2): their four B
        words by one ldmatrix (k_rows)."""
        kc, j = x // (s_tiles // 2), 2 * (x % (s_tiles // 2))
        b0, b1, b2, b3 = k_fragments(ks, kb, j, kc, lane)
        s[j, 0], s[j, 1], s[j, 2], s[j, 3] = product(qf[kc, 0], qf[kc, 1], qf[kc, 2], qf[kc, 3], b0, b1,
                                                     s[j, 0], s[j, 1], s[j, 2], s[j, 3])
        s[j + 1, 0], s[j + 1, 1], s[j + 1, 2], s[j + 1, 3] = product(
            qf[kc, 0], qf[kc, 1], qf[kc, 2], qf[kc, 3], b2, b3, s[j + 1, 0], s[j + 1, 1], s[j + 1, 2], s[j + 1, 3])

    @inlined()
    def pv_step_halves(x, s, vs, vb, o, lane):
        """O's fragments e and e + 1 += P's chunk pc times V's (x = pc o_tiles / 2 + e / 2): the four B
        words by one transposed ldmatrix (v_rows)."""
        pc, e = x // (o_tiles // 2), 2 * (x % (o_tiles // 2))
        if v_folded:
            at = v_addr(lane, e, pc, v_words)
        else:
            row, w = v_row(lane, e, pc)
            at = swz(row, w, v_words)
        b0, b1, b2, b3 = ops.ldmatrix_x4_trans(vs, vb + at)
        a0, a1, a2, a3 = p_as_a(s, pc)
        o[e, 0], o[e, 1], o[e, 2], o[e, 3] = product(a0, a1, a2, a3, b0, b1, o[e, 0], o[e, 1], o[e, 2], o[e, 3])
        o[e + 1, 0], o[e + 1, 1], o[e + 1, 2], o[e + 1, 3] = product(
            a0, a1, a2, a3, b2, b3, o[e + 1, 0], o[e + 1, 1], o[e + 1, 2], o[e + 1, 3])

    @inlined()
    def v_word(vs, vb, row, col):
        """Word (row, col) of the swizzled V tile at word vb."""
        return vs[vb + swz(row, col, v_words)]

    @inlined()
    def pv_step_tf32(x, s, vs, vb, o, lane):
        """O's fragment e += P's chunk pc times V's (x = pc o_tiles + e), B's word w key tf32_key(w)."""
        pc, e = x // o_tiles, x % o_tiles
        n0, w0 = b_word(lane, 0)
        n1, w1 = b_word(lane, 1)
        a0, a1, a2, a3 = p_as_a(s, pc)
        if v_folded:   # the same words, their swizzled addresses folded
            b0 = vs[vb + vw_addr(lane, 0, e, pc, v_words)]
            b1 = vs[vb + vw_addr(lane, 1, e, pc, v_words)]
        else:
            b0 = v_word(vs, vb, pc * 8 + key_of(w0), e * 8 + n0)
            b1 = v_word(vs, vb, pc * 8 + key_of(w1), e * 8 + n1)
        o[e, 0], o[e, 1], o[e, 2], o[e, 3] = product(a0, a1, a2, a3, b0, b1, o[e, 0], o[e, 1], o[e, 2], o[e, 3])

    if shape.tiling.split_once:
        return make_split_once_products(shape)
    s_product = unroll(shape.k_chunks * s_tiles // 2, s_step)
    if shape.tiling.q_shared:
        s_product = make_q_shared_product(shape, product)
    if shape.tf32:
        return s_product, unroll(shape.pv_chunks * o_tiles, pv_step_tf32)
    return s_product, unroll(shape.pv_chunks * o_tiles // 2, pv_step_halves)


def make_q_shared_product(shape, product):
    """s_product(qs, qb, ks, kb, s, lane) with Q's chunks read back from shared memory (``make_q_to_shared``)
    in a loop that is not written out, each chunk's products over S's key tiles written out (``unroll``): ptxas
    cannot then load every K fragment of the tile ahead of its products, nor hold Q's fragments for the whole
    kernel."""
    s_tiles, k_chunks = shape.s_tiles, shape.k_chunks
    k_fragments = make_k_fragments(shape)

    @inlined()
    def s_pair(jp, a0, a1, a2, a3, kc, ks, kb, s, lane):
        j = 2 * jp
        b0, b1, b2, b3 = k_fragments(ks, kb, j, kc, lane)
        s[j, 0], s[j, 1], s[j, 2], s[j, 3] = product(a0, a1, a2, a3, b0, b1, s[j, 0], s[j, 1], s[j, 2], s[j, 3])
        s[j + 1, 0], s[j + 1, 1], s[j + 1, 2], s[j + 1, 3] = product(
            a0, a1, a2, a3, b2, b3, s[j + 1, 0], s[j + 1, 1], s[j + 1, 2], s[j + 1, 3])
    s_pairs = unroll(s_tiles // 2, s_pair)

    @inlined()
    def s_product(qs, qb, ks, kb, s, lane):
        for kc in range(k_chunks):
            at = qb + kc * 128
            s_pairs(qs[at], qs[at + 32], qs[at + 64], qs[at + 96], kc, ks, kb, s, lane)
    return s_product


@cuda.jit(device=True, inline=True)
def split4(a0, a1, a2, a3):
    """An A fragment's four words split (``split``): (hi0, hi1, hi2, hi3, lo0, lo1, lo2, lo3)."""
    h0, l0 = split(a0)
    h1, l1 = split(a1)
    h2, l2 = split(a2)
    h3, l3 = split(a3)
    return h0, h1, h2, h3, l0, l1, l2, l3


@cuda.jit(device=True, inline=True)
def split_b_product(h0, h1, h2, h3, l0, l1, l2, l3, b0, b1, c0, c1, c2, c3):
    """3xTF32's C + A B with A already split: B's two words split here, three mma, small terms first."""
    hb0, lb0 = split(b0)
    hb1, lb1 = split(b1)
    c0, c1, c2, c3 = ops.mma_tf32(l0, l1, l2, l3, hb0, hb1, c0, c1, c2, c3)
    c0, c1, c2, c3 = ops.mma_tf32(h0, h1, h2, h3, lb0, lb1, c0, c1, c2, c3)
    return ops.mma_tf32(h0, h1, h2, h3, hb0, hb1, c0, c1, c2, c3)


def make_split_once_products(shape):
    """``make_swizzled_products`` for 3xTF32 with each A fragment split once where it is loaded, as CUTLASS's
    ``mma_tensor_op_fast_f32`` splits its operands once per fragment load: Q's chunk kc once for all of S's
    key tiles, P's chunk pc once for all of O's dim tiles (split inside every product, the same four words
    were split s_tiles and o_tiles times over).  The loops over tiles are ``unroll``'s, nested: a fragment
    indexed by a constant stays in registers."""
    s_tiles, o_tiles, v_words, v_folded = shape.s_tiles, shape.o_tiles, shape.v_words, shape.v_folded
    k_fragments = make_k_fragments(shape)

    @inlined()
    def s_pair(jp, h0, h1, h2, h3, l0, l1, l2, l3, kc, ks, kb, s, lane):
        """S's key tiles j = 2 jp and j + 1 += Q's split chunk kc times K's (four B words by one ldmatrix)."""
        j = 2 * jp
        b0, b1, b2, b3 = k_fragments(ks, kb, j, kc, lane)
        s[j, 0], s[j, 1], s[j, 2], s[j, 3] = split_b_product(h0, h1, h2, h3, l0, l1, l2, l3, b0, b1,
                                                             s[j, 0], s[j, 1], s[j, 2], s[j, 3])
        s[j + 1, 0], s[j + 1, 1], s[j + 1, 2], s[j + 1, 3] = split_b_product(
            h0, h1, h2, h3, l0, l1, l2, l3, b2, b3, s[j + 1, 0], s[j + 1, 1], s[j + 1, 2], s[j + 1, 3])
    s_pairs = unroll(s_tiles // 2, s_pair)

    @inlined()
    def s_chunk(kc, qf, ks, kb, s, lane):
        h0, h1, h2, h3, l0, l1, l2, l3 = split4(qf[kc, 0], qf[kc, 1], qf[kc, 2], qf[kc, 3])
        s_pairs(h0, h1, h2, h3, l0, l1, l2, l3, kc, ks, kb, s, lane)

    @inlined()
    def s_chunk_shared(kc, qs, qb, ks, kb, s, lane):
        """The same with Q's chunk kc read back from shared memory, split already (``q_split_to_shared``)."""
        at = qb + kc * 256
        s_pairs(qs[at], qs[at + 32], qs[at + 64], qs[at + 96], qs[at + 128], qs[at + 160], qs[at + 192],
                qs[at + 224], kc, ks, kb, s, lane)

    @inlined()
    def o_tile(e, h0, h1, h2, h3, l0, l1, l2, l3, pc, vs, vb, o, lane):
        """O's dim tile e += P's split chunk pc times V's (B's word w key tf32_key(w), read word by word)."""
        if v_folded:
            b0 = vs[vb + vw_addr(lane, 0, e, pc, v_words)]
            b1 = vs[vb + vw_addr(lane, 1, e, pc, v_words)]
        else:
            n0, w0 = b_word(lane, 0)
            n1, w1 = b_word(lane, 1)
            b0 = vs[vb + swz(pc * 8 + key_of(w0), e * 8 + n0, v_words)]
            b1 = vs[vb + swz(pc * 8 + key_of(w1), e * 8 + n1, v_words)]
        o[e, 0], o[e, 1], o[e, 2], o[e, 3] = split_b_product(h0, h1, h2, h3, l0, l1, l2, l3, b0, b1,
                                                             o[e, 0], o[e, 1], o[e, 2], o[e, 3])
    o_tiles_of = unroll(o_tiles, o_tile)

    @inlined()
    def p_chunk(pc, s, vs, vb, o, lane):
        h0, h1, h2, h3, l0, l1, l2, l3 = split4(ops.word_of(s[pc, TF32_A[0]]), ops.word_of(s[pc, TF32_A[1]]),
                                                ops.word_of(s[pc, TF32_A[2]]), ops.word_of(s[pc, TF32_A[3]]))
        o_tiles_of(h0, h1, h2, h3, l0, l1, l2, l3, pc, vs, vb, o, lane)

    k_chunks = shape.k_chunks

    @inlined()
    def s_product_shared(qs, qb, ks, kb, s, lane):
        """Q's chunks from shared memory in a loop that is not written out: ptxas cannot then load every K
        fragment of the tile ahead of its products (32 ldmatrix, 128 registers at D = 128)."""
        for kc in range(k_chunks):
            s_chunk_shared(kc, qs, qb, ks, kb, s, lane)

    return s_product_shared if shape.tiling.q_shared else unroll(k_chunks, s_chunk), unroll(shape.pv_chunks, p_chunk)


def q_chunk_words(shape):
    """Words of shared memory one lane's Q chunk takes (``make_q_to_shared``): its A fragment's 4, or 8 for
    3xTF32 split once (hi and lo)."""
    return 8 if shape.tiling.split_once else 4


def make_q_to_shared(shape):
    """q_to_shared(q, b, h, row0, Nq, lane, qs, qb): this warp's Q fragments into shared memory for the whole
    kernel, for 3xTF32 split once (hi 0-3, then lo 0-3): chunk kc's words at qb + kc 32 w + 32 r (w =
    ``q_chunk_words``), lane by lane (qb = the warp's block of words + lane), so a warp reads each back
    conflict-free.  A lane reads back only what it wrote: no barrier."""
    k_chunks, split_once = shape.k_chunks, shape.tiling.split_once
    chunk = 32 * q_chunk_words(shape)

    @cuda.jit(device=True, inline=True)
    def q_to_shared(q, b, h, row0, Nq, lane, qs, qb):
        for kc in range(k_chunks):
            for r in range(4):
                row, w = a_word(lane, r)
                val = uint32(0)
                if row0 + row < Nq:
                    val = q[b, h, row0 + row, kc * 8 + w]
                if split_once:
                    hi, lo = split(val)
                    qs[qb + kc * chunk + 32 * r] = hi
                    qs[qb + kc * chunk + 128 + 32 * r] = lo
                else:
                    qs[qb + kc * chunk + 32 * r] = val
    return q_to_shared


@cuda.jit(device=True, fastmath=True)
def rule1(x, lane, r, row0, col0, Nk, edge, scale, cap, alibi, slope, offset, left, right):
    row, col = c_elem(lane, r)
    sc = x * scale
    if cap > 0:
        sc = float32(softcap(sc, cap))
    if alibi:
        sc -= slope * float32(alibi_rebased_distance(row0 + row, col0 + col, offset, Nk))
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


def make_tile_math(shape):
    """The steps of a forward kernel around its loads and products, for ``shape``: ``block_of``,
    ``q_fragments``, ``start``, ``visits``, ``zero_s``, ``softmax`` and ``write_back`` (a namespace of
    device functions)."""
    k_chunks, s_tiles, o_tiles = shape.k_chunks, shape.s_tiles, shape.o_tiles
    LN2 = float32(rules.LN2)
    max_nan = ops.max_nan

    Br = shape.tiling.Br

    @cuda.jit(device=True, inline=True)
    def block_of(q, kv_head, slopes):
        """(b, h, kh, tr, split_, t, lane, row0, slope) of this thread: grid (B*H, Tr, S), the last query
        tile first; row0 is this warp's first query row."""
        H = q.shape[1]
        b = cuda.blockIdx.x // H
        h = cuda.blockIdx.x % H
        tr = cuda.gridDim.y - 1 - cuda.blockIdx.y
        kh = kv_head[h]
        split_ = cuda.blockIdx.z
        t = cuda.threadIdx.x
        lane = t % 32
        row0 = tr * Br + 16 * (t // 32)
        slope = float32(slopes[b, h])
        return b, h, kh, tr, split_, t, lane, row0, slope

    @cuda.jit(device=True, inline=True)
    def q_fragments(q, b, h, row0, Nq, lane, qf):
        """This warp's Q fragments, for the whole kernel (zeros past Nq)."""
        for kc in range(k_chunks):
            for r in range(4):
                row, w = a_word(lane, r)
                val = uint32(0)
                if row0 + row < Nq:
                    val = q[b, h, row0 + row, kc * 8 + w]
                qf[kc, r] = val

    @cuda.jit(device=True, inline=True)
    def start(o, m, l):
        """O = 0, and the thread's two rows (g and g + 8) seen no key: m = -inf, l = 0."""
        for e in range(o_tiles):
            for r in range(4):
                o[e, r] = float32(0.0)
        for r in range(2):
            m[r] = NEG_INF
            l[r] = float32(0.0)

    @cuda.jit(device=True, inline=True)
    def visits(nvisit, tr, split_):
        """(first, last): the part of query tile tr's visit list that this split-KV piece takes."""
        n_all = nvisit[tr]
        per = (n_all + cuda.gridDim.z - 1) // cuda.gridDim.z
        first = split_ * per
        last = min(n_all, first + per)
        return first, last

    @cuda.jit(device=True, inline=True)
    def zero_s(s):
        for j in range(s_tiles):
            for r in range(4):
                s[j, r] = float32(0.0)

    @cuda.jit(device=True, inline=True)
    def softmax(s, o, m, l, edge, lane, row0, c0, Nk, scale, cap, alibi, slope, offset, left, right):
        """The rules, in log2 units, the mask only on the tiles that need one (``edge``), then the online
        softmax on the fragments: S becomes P, O and l rescaled.  A tile with none of the rules leaves S
        unscaled: the scale (> 0) goes into the row max and the exponent's multiply-add.  A row lives on
        the 4 lanes of a quad: two shuffles finish its max."""
        ruled = edge or alibi or cap > 0
        plain = not ruled and scale > 0
        ms = scale if plain else float32(1.0)       # what S is multiplied by on its way into exp2
        if ruled:
            for j in range(s_tiles):
                s[j, 0], s[j, 1], s[j, 2], s[j, 3] = rule(s[j, 0], s[j, 1], s[j, 2], s[j, 3], lane, row0,
                                                          c0 + j * 8, Nk, edge, scale, cap, alibi, slope,
                                                          offset, left, right)
        elif not plain:
            for j in range(s_tiles):
                for r in range(4):
                    s[j, r] *= scale
        for r in range(2):
            mx = NEG_INF
            for j in range(s_tiles):
                mx = max_nan(mx, max_nan(s[j, 2 * r], s[j, 2 * r + 1]))
            mx = max_nan(mx, ops.shfl_xor_sync(ALL_LANES, mx, 1))
            mx = max_nan(mx, ops.shfl_xor_sync(ALL_LANES, mx, 2))
            m_new = max_nan(m[r], mx * ms)
            alpha = float32(rescale_exp2(m[r], m_new))
            shift = float32(shift_of(m_new))
            m[r] = m_new
            l[r] *= alpha
            for e in range(o_tiles):
                o[e, 2 * r] *= alpha
                o[e, 2 * r + 1] *= alpha
            for j in range(s_tiles):
                for c in range(2):
                    p = rules.exp2(s[j, 2 * r + c] * ms - shift)
                    l[r] += p
                    s[j, 2 * r + c] = p

    @cuda.jit(device=True, inline=True)
    def write_back(o, m, l, out, lse, split_, b, h, row0, lane, Nq):
        """Each lane summed its own columns: the quad's four shares make a row's l; then out = O / l and
        lse of this warp's rows (the split's piece under split-KV)."""
        for r in range(2):
            total = l[r]
            total += ops.shfl_xor_sync(ALL_LANES, total, 1)
            total += ops.shfl_xor_sync(ALL_LANES, total, 2)
            row_lse, inv_l = finalize(m[r] * LN2, total)
            i = row0 + lane // 4 + 8 * r
            if i < Nq:
                if lane % 4 == 0:
                    lse[split_, b, h, i] = row_lse
                for e in range(o_tiles):
                    for c in range(2):
                        col = e * 8 + 2 * (lane % 4) + c
                        if col < out.shape[4]:
                            out[split_, b, h, i, col] = o[e, 2 * r + c] * float32(inv_l)

    return SimpleNamespace(block_of=block_of, q_fragments=q_fragments, start=start, visits=visits, zero_s=zero_s, softmax=softmax,
                           write_back=write_back)
