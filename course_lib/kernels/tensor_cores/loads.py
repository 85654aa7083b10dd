"""How a tensor-core forward version's K / V tiles reach shared memory, for one ``KernelShape``.

- ``make_fetch`` / ``make_place``: register-staged loads (steps a to c): every one of a thread's words of
  the K and V tiles loaded into registers before any is stored (``fetch``), then stored (``place``) into
  padded tiles (V transposed for halves: a word holds two keys of one dim) or swizzled ones (ldmatrix's);
- ``make_copy``: cp.async (step d): 16-byte chunks from global to shared memory without the registers,
  into one stage of a pair of swizzled tiles.
"""
from __future__ import annotations

from numba import uint32

from .fragments import swz
from .instructions import inlined, ops


def make_fetch(shape):
    """fetch(k, v, b, kh, c0, Nk, t, kw, vw): thread t's words of the K and V tiles at key c0 into registers,
    every load issued before any is used (constant counts: the loops are unrolled), zeros past Nk; V by keys,
    or, for padded tiles of halves, keys 2p and 2p + 1 of word w as the pair (lo, hi)."""
    Bc, threads, key_words, v_words = shape.tiling.Bc, shape.tiling.threads, shape.key_words, shape.v_words
    k_each, v_each = shape.k_words_each, shape.v_words_each

    @inlined()
    def fetch_by_keys(k, v, b, kh, c0, Nk, t, kw, vw):
        for u in range(k_each):
            x = t + u * threads
            val = uint32(0)
            if x < Bc * key_words and c0 + x // key_words < Nk:
                val = k[b, kh, c0 + x // key_words, x % key_words]
            kw[u] = val
        for u in range(v_each):
            x = t + u * threads
            lo = uint32(0)
            hi = uint32(0)
            if x < Bc * v_words and c0 + x // v_words < Nk:
                lo = v[b, kh, c0 + x // v_words, x % v_words]
            vw[u, 0] = lo
            vw[u, 1] = hi

    @inlined()
    def fetch_key_pairs(k, v, b, kh, c0, Nk, t, kw, vw):
        for u in range(k_each):
            x = t + u * threads
            val = uint32(0)
            if x < Bc * key_words and c0 + x // key_words < Nk:
                val = k[b, kh, c0 + x // key_words, x % key_words]
            kw[u] = val
        for u in range(v_each):
            x = t + u * threads
            lo = uint32(0)
            hi = uint32(0)
            p = x // v_words
            if x < (Bc // 2) * v_words and c0 + 2 * p < Nk:
                lo = v[b, kh, c0 + 2 * p, x % v_words]
            if x < (Bc // 2) * v_words and c0 + 2 * p + 1 < Nk:
                hi = v[b, kh, c0 + 2 * p + 1, x % v_words]
            vw[u, 0] = lo
            vw[u, 1] = hi
    return fetch_by_keys if shape.v_by_keys else fetch_key_pairs


def make_place(shape):
    """place(kw, vw, ks, vs, t): the words ``fetch`` loaded, into the shared tiles: swizzled (ldmatrix's
    tilings), padded by keys (tf32), or padded with V transposed (halves)."""
    Bc, threads, key_words, v_words = shape.tiling.Bc, shape.tiling.threads, shape.key_words, shape.v_words
    k_each, v_each = shape.k_words_each, shape.v_words_each

    @inlined()
    def place_swizzled(kw, vw, ks, vs, t):
        for u in range(k_each):
            x = t + u * threads
            if x < Bc * key_words:
                ks[swz(x // key_words, x % key_words, key_words)] = kw[u]
        for u in range(v_each):
            x = t + u * threads
            if x < Bc * v_words:
                vs[swz(x // v_words, x % v_words, v_words)] = vw[u, 0]

    @inlined()
    def place_by_keys(kw, vw, ks, vs, t):
        for u in range(k_each):
            x = t + u * threads
            if x < Bc * key_words:
                ks[x // key_words, x % key_words] = kw[u]
        for u in range(v_each):
            x = t + u * threads
            if x < Bc * v_words:
                vs[x // v_words, x % v_words] = vw[u, 0]

    @inlined()
    def place_transposed(kw, vw, ks, vs, t):
        for u in range(k_each):
            x = t + u * threads
            if x < Bc * key_words:
                ks[x // key_words, x % key_words] = kw[u]
        for u in range(v_each):
            x = t + u * threads
            if x < (Bc // 2) * v_words:
                w = x % v_words
                vs[2 * w, x // v_words] = ops.low_halves(vw[u, 0], vw[u, 1])
                vs[2 * w + 1, x // v_words] = ops.high_halves(vw[u, 0], vw[u, 1])
    if shape.tiling.ldmatrix:
        return place_swizzled
    return place_by_keys if shape.tf32 else place_transposed


def make_copy(shape):
    """copy(k_head, v_head, c0, Nk, t, ks, vs, kb, vb): the K and V tiles at key c0 of one head (its (keys,
    words) rows), by cp.async, into the swizzled tiles at words kb and vb."""
    Bc, threads = shape.tiling.Bc, shape.tiling.threads
    key_words, v_words, k_row_chunks, v_row_chunks = shape.key_words, shape.v_words, shape.k_row_chunks, shape.v_row_chunks
    k_chunks_each, v_chunks_each = shape.k_chunks_each, shape.v_chunks_each

    @inlined()
    def copy_rows(src, tile, base, rw, chunks, per_thread, c0, Nk, t):
        """Thread t's 16-byte chunks of Bc rows of one head's ``src`` (``rw`` words, ``chunks`` chunks a row)
        at key c0, by cp.async, into ``tile`` at word ``base`` (swizzled); rows past Nk zero-filled (0 bytes
        read: the address is clamped to a real row).  When the threads cover the tile evenly, no test."""
        for u in range(per_thread):
            x = t + u * threads
            if (Bc * chunks) % threads == 0 or x < Bc * chunks:
                row, w = x // chunks, 4 * (x % chunks)
                ops.cp_async16(tile, base + swz(row, w, rw), src, min(c0 + row, Nk - 1) * rw + w,
                               16 if c0 + row < Nk else 0)

    @inlined()
    def copy(k_head, v_head, c0, Nk, t, ks, vs, kb, vb):
        copy_rows(k_head, ks, kb, key_words, k_row_chunks, k_chunks_each, c0, Nk, t)
        copy_rows(v_head, vs, vb, v_words, v_row_chunks, v_chunks_each, c0, Nk, t)
    return copy
