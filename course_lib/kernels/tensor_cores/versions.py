"""The tensor-core forward, one kernel per version, each a diff on the one before (chapter 11's chain).

    make_plain_kernel     (a0) each thread loads and stores a word of the K / V tiles at a time: one load in
                          flight; B fragments read word by word from padded tiles (V transposed for halves)
    make_staged_kernel    (a)  register-staged: all of a thread's words of a tile loaded before any is stored
    make_prefetch_kernel  (b)  the same with the next tile's words loaded during this one
    make_ldmatrix_kernel  (c)  staged loads into swizzled, unpadded tiles, V by keys; K's B fragments (and V's,
                          transposed, for halves) by ``ldmatrix``
    make_cp_async_kernel  (d)  the tiles copied by ``cp.async`` into two stages, the next tile's copies in
                          flight during this one; for 3xTF32, (e) with each A fragment split once where it
                          is loaded (``MmaTiling.split_once``: the products are ``fragments``')
    make_q_shared_kernel  (f)  Q's fragments in shared memory (for 3xTF32 split once), read back a chunk at a
                          time, instead of held in registers

Everything else (Q's fragments in registers, S = Q K^T, the rules and the online softmax on S's
accumulators, P straight into P V's A fragments, the write-back) is ``fragments``'; each factory takes a
``KernelShape`` and reads the counts it needs into locals, compile-time constants of the kernel.  Every
kernel has the signature (q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left,
right, out, lse): q (B, H, Nq, key_words) words, k (B, Hk, Nk, key_words), v (B, Hk, Nk, v_words) ->
out (S, B, H, Nq, Dv), lse (S, B, H, Nq); grid (B*H, Tr, S).
"""
from __future__ import annotations

from numba import cuda, float32, uint32

from ...core import rules
from .fragments import make_padded_products, make_q_to_shared, make_swizzled_products, make_tile_math, q_chunk_words
from .instructions import ops
from .loads import make_copy, make_fetch, make_place


def make_plain_kernel(shape):
    """(a0): the K / V tiles loaded a word at a time by each thread, between two barriers."""
    Bc, threads = shape.tiling.Bc, shape.tiling.threads
    key_words, v_words, k_chunks, s_tiles, o_tiles = (shape.key_words, shape.v_words, shape.k_chunks,
                                                      shape.s_tiles, shape.o_tiles)
    v_tile_rows, v_tile_cols = shape.padded_v_tile
    k_stride = key_words + 4                      # K's rows padded by 4 words
    tf32 = shape.tf32
    f = make_tile_math(shape)
    block_of, q_fragments, start, visits, zero_s, softmax, write_back = (
        f.block_of, f.q_fragments, f.start, f.visits, f.zero_s, f.softmax, f.write_back)
    s_product, pv_product = make_padded_products(shape)

    @cuda.jit(fastmath=True)
    def plain_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right,
                     out, lse):
        Nq, Nk = q.shape[2], k.shape[2]
        b, h, kh, tr, split_, t, lane, row0, slope = block_of(q, kv_head, slopes)
        ks = cuda.shared.array((Bc, k_stride), uint32)
        vs = cuda.shared.array((v_tile_rows, v_tile_cols), uint32)
        qf = cuda.local.array((k_chunks, 4), uint32)
        q_fragments(q, b, h, row0, Nq, lane, qf)
        s = cuda.local.array((s_tiles, 4), float32)
        o = cuda.local.array((o_tiles, 4), float32)
        m = cuda.local.array(2, float32)       # the thread's two rows: g and g + 8
        l = cuda.local.array(2, float32)
        start(o, m, l)
        first, last = visits(nvisit, tr, split_)
        for n in range(first, last):
            tc = visit[tr, n]
            c0 = tc * Bc
            cuda.syncthreads()             # nobody reads the last tile any more
            for x in range(t, Bc * key_words, threads):
                c = x // key_words
                w = x % key_words
                val = uint32(0)
                if c0 + c < Nk:
                    val = k[b, kh, c0 + c, w]
                ks[c, w] = val
            if tf32:                        # V as it is: keys by rows
                for x in range(t, Bc * v_words, threads):
                    c = x // v_words
                    w = x % v_words
                    val = uint32(0)
                    if c0 + c < Nk:
                        val = v[b, kh, c0 + c, w]
                    vs[c, w] = val
            else:                           # V transposed: a word holds keys 2p and 2p + 1 of one dim
                for x in range(t, (Bc // 2) * v_words, threads):
                    p = x // v_words
                    w = x % v_words
                    lo = uint32(0)
                    hi = uint32(0)
                    if c0 + 2 * p < Nk:
                        lo = v[b, kh, c0 + 2 * p, w]
                    if c0 + 2 * p + 1 < Nk:
                        hi = v[b, kh, c0 + 2 * p + 1, w]
                    vs[2 * w, p] = ops.low_halves(lo, hi)
                    vs[2 * w + 1, p] = ops.high_halves(lo, hi)
            cuda.syncthreads()             # the tiles are complete

            zero_s(s)
            s_product(qf, ks, s, lane)     # S = Q K^T
            edge = tiles[tr, tc] == rules.PARTIAL or c0 + Bc > Nk
            softmax(s, o, m, l, edge, lane, row0, c0, Nk, scale, cap, alibi, slope, offset, left, right)
            pv_product(s, vs, 0, o, lane)  # O += P V
        write_back(o, m, l, out, lse, split_, b, h, row0, lane, Nq)
    return plain_kernel


def make_staged_kernel(shape):
    """(a): each thread's words of a tile all loaded into registers (``fetch``), then stored (``place``)."""
    Bc = shape.tiling.Bc
    key_words, k_chunks, s_tiles, o_tiles = shape.key_words, shape.k_chunks, shape.s_tiles, shape.o_tiles
    v_tile_rows, v_tile_cols = shape.padded_v_tile
    k_stride = key_words + 4                      # K's rows padded by 4 words
    k_each, v_each = shape.k_words_each, shape.v_words_each
    f = make_tile_math(shape)
    block_of, q_fragments, start, visits, zero_s, softmax, write_back = (
        f.block_of, f.q_fragments, f.start, f.visits, f.zero_s, f.softmax, f.write_back)
    s_product, pv_product = make_padded_products(shape)
    fetch, place = make_fetch(shape), make_place(shape)

    @cuda.jit(fastmath=True)
    def staged_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right,
                      out, lse):
        Nq, Nk = q.shape[2], k.shape[2]
        b, h, kh, tr, split_, t, lane, row0, slope = block_of(q, kv_head, slopes)
        ks = cuda.shared.array((Bc, k_stride), uint32)
        vs = cuda.shared.array((v_tile_rows, v_tile_cols), uint32)
        qf = cuda.local.array((k_chunks, 4), uint32)
        q_fragments(q, b, h, row0, Nq, lane, qf)
        s = cuda.local.array((s_tiles, 4), float32)
        o = cuda.local.array((o_tiles, 4), float32)
        m = cuda.local.array(2, float32)
        l = cuda.local.array(2, float32)
        kw = cuda.local.array(k_each, uint32)     # a thread's share of a K tile, and of a V tile
        vw = cuda.local.array((v_each, 2), uint32)
        start(o, m, l)
        first, last = visits(nvisit, tr, split_)
        for n in range(first, last):
            tc = visit[tr, n]
            c0 = tc * Bc
            fetch(k, v, b, kh, c0, Nk, t, kw, vw)     # this tile's words, all in flight at once
            cuda.syncthreads()         # nobody reads the last tile any more
            place(kw, vw, ks, vs, t)
            cuda.syncthreads()         # the tiles are complete

            zero_s(s)
            s_product(qf, ks, s, lane)
            edge = tiles[tr, tc] == rules.PARTIAL or c0 + Bc > Nk
            softmax(s, o, m, l, edge, lane, row0, c0, Nk, scale, cap, alibi, slope, offset, left, right)
            pv_product(s, vs, 0, o, lane)
        write_back(o, m, l, out, lse, split_, b, h, row0, lane, Nq)
    return staged_kernel


def make_prefetch_kernel(shape):
    """(b): (a) with the next tile's words fetched right after this one is placed, in flight during its math
    (registers: Bc (D + Dv) / threads words a thread)."""
    Bc = shape.tiling.Bc
    key_words, k_chunks, s_tiles, o_tiles = shape.key_words, shape.k_chunks, shape.s_tiles, shape.o_tiles
    v_tile_rows, v_tile_cols = shape.padded_v_tile
    k_stride = key_words + 4                      # K's rows padded by 4 words
    k_each, v_each = shape.k_words_each, shape.v_words_each
    f = make_tile_math(shape)
    block_of, q_fragments, start, visits, zero_s, softmax, write_back = (
        f.block_of, f.q_fragments, f.start, f.visits, f.zero_s, f.softmax, f.write_back)
    s_product, pv_product = make_padded_products(shape)
    fetch, place = make_fetch(shape), make_place(shape)

    @cuda.jit(fastmath=True)
    def prefetch_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right,
                        out, lse):
        Nq, Nk = q.shape[2], k.shape[2]
        b, h, kh, tr, split_, t, lane, row0, slope = block_of(q, kv_head, slopes)
        ks = cuda.shared.array((Bc, k_stride), uint32)
        vs = cuda.shared.array((v_tile_rows, v_tile_cols), uint32)
        qf = cuda.local.array((k_chunks, 4), uint32)
        q_fragments(q, b, h, row0, Nq, lane, qf)
        s = cuda.local.array((s_tiles, 4), float32)
        o = cuda.local.array((o_tiles, 4), float32)
        m = cuda.local.array(2, float32)
        l = cuda.local.array(2, float32)
        kw = cuda.local.array(k_each, uint32)
        vw = cuda.local.array((v_each, 2), uint32)
        start(o, m, l)
        first, last = visits(nvisit, tr, split_)
        for n in range(first, last):
            tc = visit[tr, n]
            c0 = tc * Bc
            if n == first:
                fetch(k, v, b, kh, c0, Nk, t, kw, vw)
            cuda.syncthreads()
            place(kw, vw, ks, vs, t)
            cuda.syncthreads()
            if n + 1 < last:           # the next tile's words, in flight during this one
                fetch(k, v, b, kh, visit[tr, n + 1] * Bc, Nk, t, kw, vw)

            zero_s(s)
            s_product(qf, ks, s, lane)
            edge = tiles[tr, tc] == rules.PARTIAL or c0 + Bc > Nk
            softmax(s, o, m, l, edge, lane, row0, c0, Nk, scale, cap, alibi, slope, offset, left, right)
            pv_product(s, vs, 0, o, lane)
        write_back(o, m, l, out, lse, split_, b, h, row0, lane, Nq)
    return prefetch_kernel


def make_ldmatrix_kernel(shape):
    """(c): (a)'s loads into flat, swizzled tiles (no padding, V by keys), B fragments by ldmatrix."""
    Bc = shape.tiling.Bc
    k_chunks, s_tiles, o_tiles = shape.k_chunks, shape.s_tiles, shape.o_tiles
    k_tile, v_tile = shape.k_tile_words, shape.v_tile_words
    k_each, v_each = shape.k_words_each, shape.v_words_each
    f = make_tile_math(shape)
    block_of, q_fragments, start, visits, zero_s, softmax, write_back = (
        f.block_of, f.q_fragments, f.start, f.visits, f.zero_s, f.softmax, f.write_back)
    s_product, pv_product = make_swizzled_products(shape)
    fetch, place = make_fetch(shape), make_place(shape)

    @cuda.jit(fastmath=True)
    def ldmatrix_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right,
                        out, lse):
        Nq, Nk = q.shape[2], k.shape[2]
        b, h, kh, tr, split_, t, lane, row0, slope = block_of(q, kv_head, slopes)
        ks = cuda.shared.array(k_tile, uint32)
        vs = cuda.shared.array(v_tile, uint32)
        qf = cuda.local.array((k_chunks, 4), uint32)
        q_fragments(q, b, h, row0, Nq, lane, qf)
        s = cuda.local.array((s_tiles, 4), float32)
        o = cuda.local.array((o_tiles, 4), float32)
        m = cuda.local.array(2, float32)
        l = cuda.local.array(2, float32)
        kw = cuda.local.array(k_each, uint32)
        vw = cuda.local.array((v_each, 2), uint32)
        start(o, m, l)
        first, last = visits(nvisit, tr, split_)
        for n in range(first, last):
            tc = visit[tr, n]
            c0 = tc * Bc
            fetch(k, v, b, kh, c0, Nk, t, kw, vw)
            cuda.syncthreads()
            place(kw, vw, ks, vs, t)   # swizzled
            cuda.syncthreads()

            zero_s(s)
            s_product(qf, ks, 0, s, lane)     # K's B fragments by ldmatrix
            edge = tiles[tr, tc] == rules.PARTIAL or c0 + Bc > Nk
            softmax(s, o, m, l, edge, lane, row0, c0, Nk, scale, cap, alibi, slope, offset, left, right)
            pv_product(s, vs, 0, o, lane)
        write_back(o, m, l, out, lse, split_, b, h, row0, lane, Nq)
    return ldmatrix_kernel


def make_cp_async_kernel(shape):
    """(d): (c)'s swizzled tiles in two stages of dynamic shared memory (above 48 KB at D = 128), filled by
    cp.async: the next tile's copies into the other stage are in flight while this one is computed."""
    Bc = shape.tiling.Bc
    k_chunks, s_tiles, o_tiles = shape.k_chunks, shape.s_tiles, shape.o_tiles
    k_tile, v_tile = shape.k_tile_words, shape.v_tile_words
    f = make_tile_math(shape)
    block_of, q_fragments, start, visits, zero_s, softmax, write_back = (
        f.block_of, f.q_fragments, f.start, f.visits, f.zero_s, f.softmax, f.write_back)
    s_product, pv_product = make_swizzled_products(shape)
    copy = make_copy(shape)

    @cuda.jit(fastmath=True)
    def cp_async_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right,
                        out, lse):
        Nq, Nk = q.shape[2], k.shape[2]
        b, h, kh, tr, split_, t, lane, row0, slope = block_of(q, kv_head, slopes)
        dyn = cuda.shared.array(0, uint32)
        ks = dyn[:2 * k_tile]
        vs = dyn[2 * k_tile:2 * k_tile + 2 * v_tile]
        qf = cuda.local.array((k_chunks, 4), uint32)
        q_fragments(q, b, h, row0, Nq, lane, qf)
        s = cuda.local.array((s_tiles, 4), float32)
        o = cuda.local.array((o_tiles, 4), float32)
        m = cuda.local.array(2, float32)
        l = cuda.local.array(2, float32)
        start(o, m, l)
        first, last = visits(nvisit, tr, split_)
        k_head, v_head = k[b, kh], v[b, kh]    # this block's head: (keys, words) rows
        if first < last:               # the first tile's copies, in flight before the loop
            copy(k_head, v_head, visit[tr, first] * Bc, Nk, t, ks, vs, 0, 0)
            ops.cp_async_commit()
        for n in range(first, last):
            tc = visit[tr, n]
            c0 = tc * Bc
            stage = (n - first) & 1
            if n + 1 < last:           # the next tile's copies into the other stage, then wait for this tile's
                copy(k_head, v_head, visit[tr, n + 1] * Bc, Nk, t, ks, vs, (1 - stage) * k_tile,
                     (1 - stage) * v_tile)
                ops.cp_async_commit()
                ops.cp_async_wait1()
            else:
                ops.cp_async_wait0()
            cuda.syncthreads()         # every thread's copies of this tile have landed

            zero_s(s)
            s_product(qf, ks, stage * k_tile, s, lane)
            edge = tiles[tr, tc] == rules.PARTIAL or c0 + Bc > Nk
            softmax(s, o, m, l, edge, lane, row0, c0, Nk, scale, cap, alibi, slope, offset, left, right)
            pv_product(s, vs, stage * v_tile, o, lane)
            cuda.syncthreads()         # nobody reads this stage any more: the copy after next may fill it
        write_back(o, m, l, out, lse, split_, b, h, row0, lane, Nq)
    return cp_async_kernel


def make_q_shared_kernel(shape):
    """(f): (d) (for 3xTF32 (e)) with Q's fragments put into shared memory after the two K / V stages at the start
    (``make_q_to_shared``; 3xTF32's split once) and read back a chunk at a time in a loop that is not written
    out: Q's words (64 a thread for 3xTF32 at D = 128) no longer live in registers for the whole kernel beside
    O's accumulators, and ptxas cannot load a whole tile's K fragments ahead of their products."""
    Bc, warps = shape.tiling.Bc, shape.tiling.warps
    k_chunks, s_tiles, o_tiles = shape.k_chunks, shape.s_tiles, shape.o_tiles
    k_tile, v_tile = shape.k_tile_words, shape.v_tile_words
    f = make_tile_math(shape)
    block_of, start, visits, zero_s, softmax, write_back = (
        f.block_of, f.start, f.visits, f.zero_s, f.softmax, f.write_back)
    s_product, pv_product = make_swizzled_products(shape)
    q_to_shared = make_q_to_shared(shape)
    copy = make_copy(shape)
    q_words = k_chunks * 32 * q_chunk_words(shape)     # one warp's Q in shared memory

    @cuda.jit(fastmath=True)
    def q_shared_kernel(q, k, v, visit, nvisit, tiles, kv_head, scale, cap, alibi, slopes, offset, left, right,
                        out, lse):
        Nq, Nk = q.shape[2], k.shape[2]
        b, h, kh, tr, split_, t, lane, row0, slope = block_of(q, kv_head, slopes)
        dyn = cuda.shared.array(0, uint32)
        ks = dyn[:2 * k_tile]
        vs = dyn[2 * k_tile:2 * k_tile + 2 * v_tile]
        qs = dyn[2 * k_tile + 2 * v_tile:2 * k_tile + 2 * v_tile + warps * q_words]
        qb = (t // 32) * q_words + lane
        q_to_shared(q, b, h, row0, Nq, lane, qs, qb)
        s = cuda.local.array((s_tiles, 4), float32)
        o = cuda.local.array((o_tiles, 4), float32)
        m = cuda.local.array(2, float32)
        l = cuda.local.array(2, float32)
        start(o, m, l)
        first, last = visits(nvisit, tr, split_)
        k_head, v_head = k[b, kh], v[b, kh]
        if first < last:
            copy(k_head, v_head, visit[tr, first] * Bc, Nk, t, ks, vs, 0, 0)
            ops.cp_async_commit()
        for n in range(first, last):
            tc = visit[tr, n]
            c0 = tc * Bc
            stage = (n - first) & 1
            if n + 1 < last:
                copy(k_head, v_head, visit[tr, n + 1] * Bc, Nk, t, ks, vs, (1 - stage) * k_tile,
                     (1 - stage) * v_tile)
                ops.cp_async_commit()
                ops.cp_async_wait1()
            else:
                ops.cp_async_wait0()
            cuda.syncthreads()

            zero_s(s)
            s_product(qs, qb, ks, stage * k_tile, s, lane)
            edge = tiles[tr, tc] == rules.PARTIAL or c0 + Bc > Nk
            softmax(s, o, m, l, edge, lane, row0, c0, Nk, scale, cap, alibi, slope, offset, left, right)
            pv_product(s, vs, stage * v_tile, o, lane)
            cuda.syncthreads()
        write_back(o, m, l, out, lse, split_, b, h, row0, lane, Nq)
    return q_shared_kernel
