"""Chapter 08's compiled forward, version by version: each one change on the version before.

A version is two things: what one work item (query rows [r0, r1) of one
(batch, head) against a range of key tiles) does, compiled (``*_item``), with
the kernel that spreads the items over the cores (``*_kernel``); and the host
function that picks the tiles and the items and launches it (``run_*``).  A
version that changes only the host reuses the kernel before it; the pieces
every item shares (its rows, its buffers, the row passes of ``tile``) are
written once.  The package docstring lists the versions and their speeds.
"""
from __future__ import annotations

import numpy as np

try:
    import numba
except ModuleNotFoundError:  # an optional package missing: the impl is unavailable, nothing else
    numba = None

from ...core import rules
from . import host
from .host import balanced_items, heaviest_first_items, key_splits, thread_runs, zigzag_items
from .tile import FASTMATH, LN2, LOG2E

if numba is not None:
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    from .tile import finalize, matmul_nt, round_p, softmax_tile_exp2, softmax_tile_scalar, softmax_tile_vector

    # -- what every work item shares -------------------------------------------------------

    @numba.njit(cache=True)
    def item_rows(work, n, Nq):
        """Work item n as (b, h, its K / V head, query tile t, split s, rows r0, r1, key tiles tc_lo, tc_hi)."""
        b, h, t, s = work.items[n, 0], work.items[n, 1], work.items[n, 2], work.items[n, 3]
        r0 = t * work.Br
        Tc = work.tiles.shape[1]
        return (b, h, work.kv_head[h], t, s, r0, min(r0 + work.Br, Nq), s * Tc // work.splits,
                (s + 1) * Tc // work.splits)

    @numba.njit(cache=True)
    def padded_buffers(Br, Bc, D, Dv, dtype):
        """A work item's scratch ("SRAM") for ``matmul_nt``: Qi, Kj, Vj transposed (P V is also A B^T), Sij
        and Pij Vj, zero-padded to its 4 x 2 blocks (zero, so that the pads stay finite); then Oi, m, l and
        ``exp_row``'s bits."""
        rows4, Dv2, Bc2 = (Br + 3) // 4 * 4, (Dv + 1) // 2 * 2, (Bc + 1) // 2 * 2
        return (np.zeros((rows4, D), dtype), np.zeros((Bc2, D), dtype), np.zeros((Dv2, Bc2), dtype),
                np.zeros((rows4, Bc2), dtype), np.zeros((rows4, Dv2), dtype),
                np.empty(Br * Dv, dtype), np.empty(Br, dtype), np.empty(Br, dtype), np.zeros(Bc2, np.int32))

    @numba.njit(cache=True)
    def tile_buffers(Br, Bc, D, Dv, dtype):
        """A work item's scratch ("SRAM") for np.dot: flat Sij, Pij Vj and scaled Qi, each reshaped to its
        tile's size (so that every tile is contiguous); then Oi, m, l and ``exp_row``'s bits."""
        return (np.empty(Br * Bc, dtype), np.empty(Br * Dv, dtype), np.empty(Br * D, dtype),
                np.empty(Br * Dv, dtype), np.empty(Br, dtype), np.empty(Br, dtype),
                np.zeros((Bc + 1) // 2 * 2, np.int32))

    @numba.njit(cache=True)
    def start_rows(O_flat, m, l, n_r, Dv):
        """The online softmax's state for n_r rows: Oi = 0 (n_r, Dv), m = -inf, l = 0; returns Oi."""
        Oi = O_flat[:n_r * Dv].reshape((n_r, Dv))   # the unnormalised output, on chip throughout
        Oi[:] = 0
        m[:] = -np.inf
        l[:] = 0
        return Oi

    @numba.njit(cache=True)
    def scaled_rows(q, b, h, r0, n_r, scale, Q_flat):
        """Qi = scale * q[b, h, r0:r0 + n_r], contiguous for np.dot: the scale folded in once, not per Sij."""
        D = q.shape[3]
        Qi = Q_flat[:n_r * D].reshape((n_r, D))
        for r in range(n_r):
            for d in range(D):
                Qi[r, d] = q[b, h, r0 + r, d] * scale
        return Qi

    @numba.njit(cache=True, fastmath=FASTMATH)
    def write_rows(Oi, m, l, n_r, b, h, r0, out, lse):
        """Divide by l once and write Oi and lse once: out[b, h, r0:r0 + n_r], lse[b, h, r0:r0 + n_r]."""
        for r in range(n_r):
            row_lse, inv_l = finalize(m[r], l[r])
            lse[b, h, r0 + r] = row_lse
            for e in range(Oi.shape[1]):
                out[b, h, r0 + r, e] = Oi[r, e] * Oi.dtype.type(inv_l)

    @numba.njit(cache=True)
    def write_rows_base2(Oi, m, l, n_r, b, h, r0, out, lse):
        """``write_rows`` for m kept in log2 units, turned back to natural units in a pass of its own: m ln 2
        is rounded to m's dtype before log l is added, never fused into one multiply-add, whatever the
        compiler inlines."""
        ln2 = m.dtype.type(LN2)
        for r in range(n_r):
            m[r] *= ln2
        write_rows(Oi, m, l, n_r, b, h, r0, out, lse)

    # -- microkernel: flash_numpy's loops compiled, both matmuls by the 4 x 2 micro-kernel -----

    @numba.njit(cache=True, fastmath=FASTMATH)
    def microkernel_item(q, k, v, work, scores, n, buffers, out, lse):
        """One work item: Kj and Vj^T copied into padded tiles, S = Qi Kj^T and P V by ``matmul_nt``,
        every score through the scalar rules (``softmax_tile_scalar``)."""
        b, h, kh, t, s, r0, r1, tc_lo, tc_hi = item_rows(work, n, q.shape[2])
        Q_pad, K_pad, VT_pad, S_pad, PV_pad, O_flat, m, l, bits = buffers
        Nk, D, Dv = k.shape[2], k.shape[3], v.shape[3]
        n_r = r1 - r0
        rows4, Dv2 = (n_r + 3) // 4 * 4, (Dv + 1) // 2 * 2     # matmul_nt's padding
        Q_pad[:n_r] = q[b, h, r0:r1]
        Oi = start_rows(O_flat, m, l, n_r, Dv)
        slope = work.slopes[b, h]
        for tc in range(tc_lo, tc_hi):
            kind = work.tiles[t, tc]
            if kind == rules.EMPTY:
                continue                          # skipped: Kj and Vj are never loaded
            c0 = tc * work.Bc
            n_c = min(c0 + work.Bc, Nk) - c0
            for c in range(n_c):                  # load Kj, and Vj transposed
                K_pad[c] = k[b, kh, c0 + c]
                for e in range(Dv):
                    VT_pad[e, c] = v[b, kh, c0 + c, e]
            matmul_nt(Q_pad, K_pad, S_pad, rows4, (n_c + 1) // 2 * 2, D)          # Sij = Qi Kj^T
            S = S_pad[:n_r, :n_c]
            softmax_tile_scalar(S, n_r, n_c, r0, c0, kind, scores.scale, scores.cap, scores.alibi, slope,
                                scores.offset, Nk, scores.left, scores.right, scores.fast_exp, m, l, Oi, bits)
            round_p(S, n_r, n_c, scores.round_bits, scores.round_min_exponent)
            matmul_nt(S_pad, VT_pad, PV_pad, rows4, Dv2, n_c)                      # Oi += Pij Vj
            Oi += PV_pad[:n_r, :Dv]
        write_rows(Oi, m, l, n_r, b, h, r0, out[s], lse[s])

    @numba.njit(cache=True, parallel=True)
    def microkernel_kernel(q, k, v, work, scores, out, lse):
        """Every work item, prange's static split over the cores, each item with buffers of its own."""
        for n in numba.prange(work.items.shape[0]):
            buffers = padded_buffers(work.Br, work.Bc, q.shape[3], v.shape[3], q.dtype)
            microkernel_item(q, k, v, work, scores, n, buffers, out, lse)

    # -- blas: the two matmuls by np.dot (SciPy's BLAS) on contiguous tiles -------------------

    @numba.njit(cache=True, fastmath=FASTMATH)
    def blas_item(q, k, v, work, scores, n, buffers, out, lse):
        """``microkernel_item`` with both matmuls by np.dot: Kj and Vj read where they lie, no copy, and
        Qi scaled once as it is read."""
        b, h, kh, t, s, r0, r1, tc_lo, tc_hi = item_rows(work, n, q.shape[2])
        S_flat, PV_flat, Q_flat, O_flat, m, l, bits = buffers
        Nk, Dv = k.shape[2], v.shape[3]
        n_r = r1 - r0
        Qi = scaled_rows(q, b, h, r0, n_r, scores.scale, Q_flat)
        PV = PV_flat[:n_r * Dv].reshape((n_r, Dv))
        Oi = start_rows(O_flat, m, l, n_r, Dv)
        slope, one = work.slopes[b, h], q.dtype.type(1)      # the scale is in Qi
        for tc in range(tc_lo, tc_hi):
            kind = work.tiles[t, tc]
            if kind == rules.EMPTY:
                continue
            c0 = tc * work.Bc
            n_c = min(c0 + work.Bc, Nk) - c0
            S = S_flat[:n_r * n_c].reshape((n_r, n_c))
            np.dot(Qi, k[b, kh, c0:c0 + n_c].T, S)                                  # Sij = Qi Kj^T
            softmax_tile_scalar(S, n_r, n_c, r0, c0, kind, one, scores.cap, scores.alibi, slope,
                                scores.offset, Nk, scores.left, scores.right, scores.fast_exp, m, l, Oi, bits)
            round_p(S, n_r, n_c, scores.round_bits, scores.round_min_exponent)
            np.dot(S, v[b, kh, c0:c0 + n_c], PV)                                    # Oi += Pij Vj
            Oi += PV
        write_rows(Oi, m, l, n_r, b, h, r0, out[s], lse[s])

    @numba.njit(cache=True, parallel=True)
    def blas_kernel(q, k, v, work, scores, out, lse):
        """``microkernel_kernel`` over ``blas_item``, with its flat buffers."""
        for n in numba.prange(work.items.shape[0]):
            buffers = tile_buffers(work.Br, work.Bc, q.shape[3], v.shape[3], q.dtype)
            blas_item(q, k, v, work, scores, n, buffers, out, lse)

    # -- rowvec: a row's scores scaled, capped, biased and masked by whole-row loops ----------

    @numba.njit(cache=True, fastmath=FASTMATH)
    def rowvec_item(q, k, v, work, scores, n, buffers, out, lse):
        """``blas_item`` with the row pass ``softmax_tile_vector``: no branch per score, a PARTIAL tile's
        mask two index bounds per row."""
        b, h, kh, t, s, r0, r1, tc_lo, tc_hi = item_rows(work, n, q.shape[2])
        S_flat, PV_flat, Q_flat, O_flat, m, l, bits = buffers
        Nk, Dv = k.shape[2], v.shape[3]
        n_r = r1 - r0
        Qi = scaled_rows(q, b, h, r0, n_r, scores.scale, Q_flat)
        PV = PV_flat[:n_r * Dv].reshape((n_r, Dv))
        Oi = start_rows(O_flat, m, l, n_r, Dv)
        slope, one = work.slopes[b, h], q.dtype.type(1)
        for tc in range(tc_lo, tc_hi):
            kind = work.tiles[t, tc]
            if kind == rules.EMPTY:
                continue
            c0 = tc * work.Bc
            n_c = min(c0 + work.Bc, Nk) - c0
            S = S_flat[:n_r * n_c].reshape((n_r, n_c))
            np.dot(Qi, k[b, kh, c0:c0 + n_c].T, S)
            softmax_tile_vector(S, n_r, n_c, r0, c0, kind, one, scores.cap, scores.alibi, slope,
                                scores.offset, Nk, scores.left, scores.right, scores.fast_exp, m, l, Oi, bits)
            round_p(S, n_r, n_c, scores.round_bits, scores.round_min_exponent)
            np.dot(S, v[b, kh, c0:c0 + n_c], PV)
            Oi += PV
        write_rows(Oi, m, l, n_r, b, h, r0, out[s], lse[s])

    @numba.njit(cache=True, parallel=True)
    def rowvec_kernel(q, k, v, work, scores, out, lse):
        """``blas_kernel`` over ``rowvec_item``."""
        for n in numba.prange(work.items.shape[0]):
            buffers = tile_buffers(work.Br, work.Bc, q.shape[3], v.shape[3], q.dtype)
            rowvec_item(q, k, v, work, scores, n, buffers, out, lse)

    # -- exp2: scores in log2 units, two passes over a row ------------------------------------

    @numba.njit(cache=True, fastmath=FASTMATH)
    def exp2_item(q, k, v, work, scores, n, buffers, out, lse):
        """``rowvec_item`` in base 2: log2(e) folded into Qi with the scale, the row pass
        ``softmax_tile_exp2`` (a vectorised max, then 2**(s - m) and its sum in one loop), lse back in
        natural units at the end."""
        b, h, kh, t, s, r0, r1, tc_lo, tc_hi = item_rows(work, n, q.shape[2])
        S_flat, PV_flat, Q_flat, O_flat, m, l, bits = buffers
        Nk, Dv = k.shape[2], v.shape[3]
        n_r = r1 - r0
        Qi = scaled_rows(q, b, h, r0, n_r, scores.scale * q.dtype.type(LOG2E), Q_flat)  # 2**(s log2 e) = e**s
        PV = PV_flat[:n_r * Dv].reshape((n_r, Dv))
        Oi = start_rows(O_flat, m, l, n_r, Dv)
        slope = work.slopes[b, h]
        for tc in range(tc_lo, tc_hi):
            kind = work.tiles[t, tc]
            if kind == rules.EMPTY:
                continue
            c0 = tc * work.Bc
            n_c = min(c0 + work.Bc, Nk) - c0
            S = S_flat[:n_r * n_c].reshape((n_r, n_c))
            np.dot(Qi, k[b, kh, c0:c0 + n_c].T, S)
            softmax_tile_exp2(S, n_r, n_c, r0, c0, kind, scores.cap, scores.alibi, slope, scores.offset, Nk,
                              scores.left, scores.right, scores.fast_exp, m, l, Oi)
            round_p(S, n_r, n_c, scores.round_bits, scores.round_min_exponent)
            np.dot(S, v[b, kh, c0:c0 + n_c], PV)
            Oi += PV
        write_rows_base2(Oi, m, l, n_r, b, h, r0, out[s], lse[s])

    @numba.njit(cache=True, parallel=True)
    def exp2_kernel(q, k, v, work, scores, out, lse):
        """``rowvec_kernel`` over ``exp2_item``."""
        for n in numba.prange(work.items.shape[0]):
            buffers = tile_buffers(work.Br, work.Bc, q.shape[3], v.shape[3], q.dtype)
            exp2_item(q, k, v, work, scores, n, buffers, out, lse)

    # -- scratch: tile buffers allocated once per thread ---------------------------------------

    @numba.njit(cache=True, parallel=True)
    def scratch_kernel(q, k, v, work, scores, runs, out, lse):
        """``exp2_kernel`` with one iteration per thread, not per item: its buffers allocated once, then
        its run of items, [runs[r], runs[r + 1]), through them."""
        for r in numba.prange(runs.shape[0] - 1):
            buffers = tile_buffers(work.Br, work.Bc, q.shape[3], v.shape[3], q.dtype)
            for n in range(runs[r], runs[r + 1]):
                exp2_item(q, k, v, work, scores, n, buffers, out, lse)

    # -- handout: each thread takes the next item from a shared counter ------------------------

    @intrinsic
    def fetch_add(typingctx, counter):
        """counter[0] += 1, atomically, returning the value before: the threads draw item numbers from it.

        LLVM's ``atomicrmw add`` (one ``lock xadd`` on x86): numba has no atomics
        on the CPU, and a plain ``counter[0] += 1`` from two threads loses counts."""
        if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
            return None

        def codegen(context, builder, signature, args):
            data = context.make_array(counter)(context, builder, args[0]).data
            return builder.atomic_rmw("add", data, ir.Constant(ir.IntType(64), 1), "monotonic")
        return types.int64(counter), codegen

    @numba.njit(cache=True, parallel=True)
    def handout_kernel(q, k, v, work, scores, workers, next_item, out, lse):
        """``scratch_kernel`` with no fixed runs: each of ``workers`` threads, its buffers allocated once,
        takes the next item from the counter ``next_item`` until none is left."""
        for _ in numba.prange(workers):
            buffers = tile_buffers(work.Br, work.Bc, q.shape[3], v.shape[3], q.dtype)
            n = fetch_add(next_item)
            while n < work.items.shape[0]:
                exp2_item(q, k, v, work, scores, n, buffers, out, lse)
                n = fetch_add(next_item)


# -- the host side of each version -------------------------------------------------------------
# run_X(launch, q, k, v, splits): q, k, v prepared (contiguous, in the accumulation dtype); splits None:
# the version's own choice.

def run_microkernel(launch, q, k, v, splits=None):
    """Query tiles in zigzag order, prange's static split, the keys never split."""
    splits = 1 if splits is None else splits
    items = zigzag_items(q.shape[0], q.shape[1], launch.tiles, splits)
    return host.run(microkernel_kernel, launch, q, k, v, items, splits)


def run_blas(launch, q, k, v, splits=None):
    """``run_microkernel`` with ``blas_kernel``."""
    splits = 1 if splits is None else splits
    items = zigzag_items(q.shape[0], q.shape[1], launch.tiles, splits)
    return host.run(blas_kernel, launch, q, k, v, items, splits)


def run_rowvec(launch, q, k, v, splits=None):
    """``run_blas`` with ``rowvec_kernel``."""
    splits = 1 if splits is None else splits
    items = zigzag_items(q.shape[0], q.shape[1], launch.tiles, splits)
    return host.run(rowvec_kernel, launch, q, k, v, items, splits)


def run_balanced(launch, q, k, v, splits=None):
    """``run_rowvec`` with the items by cost, heaviest and lightest in turn: every thread's run even."""
    splits = 1 if splits is None else splits
    items = balanced_items(q.shape[0], q.shape[1], launch.tiles, splits)
    return host.run(rowvec_kernel, launch, q, k, v, items, splits)


def run_tuned(launch, q, k, v, splits=None):
    """``run_balanced`` with the keys split across items where there are too few items for the cores."""
    if splits is None:
        splits = key_splits(q.shape[0], q.shape[1], *launch.tiles.shape, numba.get_num_threads())
    items = balanced_items(q.shape[0], q.shape[1], launch.tiles, splits)
    return host.run(rowvec_kernel, launch, q, k, v, items, splits)


def run_exp2(launch, q, k, v, splits=None):
    """``run_tuned`` with ``exp2_kernel`` (and version ``wide``, whose tiles only differ)."""
    if splits is None:
        splits = key_splits(q.shape[0], q.shape[1], *launch.tiles.shape, numba.get_num_threads())
    items = balanced_items(q.shape[0], q.shape[1], launch.tiles, splits)
    return host.run(exp2_kernel, launch, q, k, v, items, splits)


def run_scratch(launch, q, k, v, splits=None):
    """``run_exp2`` with one run of items per thread, cut as prange would cut them."""
    threads = numba.get_num_threads()
    if splits is None:
        splits = key_splits(q.shape[0], q.shape[1], *launch.tiles.shape, threads)
    items = balanced_items(q.shape[0], q.shape[1], launch.tiles, splits)
    return host.run(scratch_kernel, launch, q, k, v, items, splits, thread_runs(len(items), threads))


def run_handout(launch, q, k, v, splits=None):
    """``run_scratch`` with the items heaviest first and a counter that hands them out."""
    threads = numba.get_num_threads()
    if splits is None:
        splits = key_splits(q.shape[0], q.shape[1], *launch.tiles.shape, threads)
    items = heaviest_first_items(q.shape[0], q.shape[1], launch.tiles, splits)
    return host.run(handout_kernel, launch, q, k, v, items, splits, threads, np.zeros(1, dtype=np.int64))
