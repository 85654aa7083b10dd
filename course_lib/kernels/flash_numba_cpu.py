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
- ``balanced``: the work items sorted by cost (key tiles computed) and laid
  out heaviest, lightest, second heaviest, second lightest, ...: ``prange``
  gives each thread one contiguous run of them, and every run then holds the
  same work, whatever the number of threads.
- ``tuned``: the tile sizes from this CPU's L2 (``tile_sizes_for``); and
  where there are fewer work items than cores want (decoding: one query
  row), the keys are split across work items and the partial (out, lse)
  merged with the lse rule (``core.online_softmax.merge_all``).
- ``exp2``: log2(e) folded into Qi with the scale, so the row pass works in
  base 2 and walks a row twice: a vectorised max (``cpu_tile.maximum``), then
  2**(s - m) and its sum in one loop (``cpu_tile.exp2_and_sum``).
- ``wide``: PyTorch's CPU tiles (``wide_tiles``: 256 x 512 from Nq = 768
  on): fewer, longer BLAS calls.
- ``scratch``: each thread allocates its tile buffers once (``tile_buffers``)
  and runs its items through them, where every item allocated its own: a
  freed 512 KiB tile that the allocator hands back to the OS comes back as
  page faults on the next item's first touch.
- ``handout`` (= ``flash_numba_cpu``): the items sorted heaviest first and
  drawn one at a time from a shared counter (``fetch_add``, an atomic add),
  so a thread that loses its core to another program for a while takes
  fewer items instead of holding the others up at the end.

The structure every step shares, ``query_tile``: one place where each tile's
P is formed (``cpu_tile.form_p``), one where it meets Vj.

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
from .cpu_tile import FASTMATH, LN2, LOG2E

if numba is not None:
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    from .cpu_tile import (alibi_distance, exp_and_sum, exp_row, finalize, form_p, matmul_nt, max_nan,  # noqa: F401
                           rescale, round_p, round_to_bits, shift_of, softcap, softmax_tile_exp2,
                           softmax_tile_scalar, softmax_tile_vector, visible)



@dataclass(frozen=True)
class Step:
    """One version of the kernel: what it changes, and the switches that make it."""

    what: str
    blas: bool          # tile matmuls by np.dot (BLAS) instead of matmul_nt
    row_vector: bool    # whole-row score loops, masks as index bounds
    balanced: bool      # items by cost, heaviest and lightest in turn
    tuned: bool         # tile sizes from the caches; keys split when items are few
    base2: bool = False  # scores in log2 units, two passes over a row (softmax_tile_exp2)
    wide: bool = False   # PyTorch's tiles: 256 query rows (64 below 768) x 512 keys
    scratch: bool = False  # tile buffers allocated once per thread, not once per work item
    handout: bool = False  # items heaviest first, each thread taking the next from a shared counter


STEPS = {
    "microkernel": Step("4 x 2 register micro-kernel, scalar rules per score, zigzag items, 64 x 64",
                        False, False, False, False),
    "blas": Step("tile matmuls by np.dot on contiguous tiles (SciPy's BLAS), Qi scaled once",
                 True, False, False, False),
    "rowvec": Step("scores scaled, capped and masked by whole-row loops: no branch per score",
                   True, True, False, False),
    "balanced": Step("work items by cost, heaviest and lightest in turn: even runs", True, True, True, False),
    "tuned": Step("tile sizes from the L2 size, keys split across cores when items are few",
                  True, True, True, True),
    "exp2": Step("log2(e) folded into Qi: row max vectorised, exp2 and its sum in one loop",
                 True, True, True, True, base2=True),
    "wide": Step("PyTorch's tiles, 256 x 512: half as many BLAS calls, each longer",
                 True, True, True, True, base2=True, wide=True),
    "scratch": Step("tile buffers allocated once per thread, not once per work item",
                    True, True, True, True, base2=True, wide=True, scratch=True),
    "handout": Step("work items heaviest first, handed out one at a time from a shared counter",
                    True, True, True, True, base2=True, wide=True, scratch=True, handout=True),
}
FINAL_STEP = "handout"
MIN_ITEMS_PER_THREAD = 4    # fewer (batch, head, query tile) items than this per thread: split the keys


def available() -> bool:
    return numba is not None


def scipy_openblas():
    """SciPy's OpenBLAS, which ``np.dot`` inside njit calls, as a ctypes library; None for another BLAS.

    The kernel's threads are prange's: a BLAS that starts threads of its own
    inside each of them fights them for the cores (OpenBLAS warns "Detect
    OpenMP Loop and this application may hang").  ``run_kernel`` sets it to
    one thread for the call and back after.  Which kernels OpenBLAS runs
    (AVX2's "Haswell", AVX-512's "SkylakeX", ...) it decides when it loads,
    from the CPU or from OPENBLAS_CORETYPE: ``blas_core`` says.
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
            library.scipy_openblas_get_corename.restype = ctypes.c_char_p
            return library
    return None


def blas_core():
    """The kernels SciPy's OpenBLAS runs here ("SkylakeX", "Haswell", ...), or None for another BLAS."""
    return _BLAS[0].scipy_openblas_get_corename().decode() if _BLAS[0] is not None else None


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


def wide_tiles(seqlen_q):
    """PyTorch's CPU FlashAttention tiles (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp):
    256 query rows from 768 on, 64 from 192, else 32, and 512 keys."""
    return (256 if seqlen_q >= 768 else 64 if seqlen_q >= 192 else 32), 512


if numba is not None:
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

    @numba.njit(cache=True)
    def tile_buffers(Br, Bc, D, Dv, dtype, blas):
        """A work item's scratch ("SRAM") for up to Br query rows and Bc keys.

        For np.dot: flat S, P V and scaled Qi, reshaped to each tile's size (so
        every tile is contiguous).  For ``matmul_nt``: its zero-padded tiles
        (zero, so that the pads stay finite).  Then Oi, m, l, exp_row's bits.
        """
        rows4, Dv2, Bc2 = (Br + 3) // 4 * 4, (Dv + 1) // 2 * 2, (Bc + 1) // 2 * 2  # matmul_nt's padding
        flat = 0 if not blas else 1
        pad = 1 - flat
        return (np.empty(flat * Br * Bc, dtype), np.empty(flat * Br * Dv, dtype), np.empty(flat * Br * D, dtype),
                np.zeros((pad * rows4, Bc2), dtype), np.zeros((pad * rows4, Dv2), dtype),
                np.zeros((pad * rows4, D), dtype), np.zeros((pad * Bc2, D), dtype),
                np.zeros((pad * Dv2, Bc2), dtype),                    # Vj transposed: P V is also A B^T
                np.empty(Br * Dv, dtype), np.empty(Br, dtype), np.empty(Br, dtype), np.zeros(Bc2, np.int32))

    @numba.njit(cache=True, fastmath=FASTMATH)
    def query_tile(q, k, v, b, h, kh, r0, r1, tc_lo, tc_hi, tiles_row, Bc, scale, cap, alibi, slope,
                   offset, left, right, round_bits, round_min_exponent, fast_exp, blas, row_vector, base2,
                   buffers, out, lse):
        """One work item: query rows [r0, r1) of (batch b, head h) against key tiles [tc_lo, tc_hi) of head kh.

        ``buffers`` are ``tile_buffers``'; ``out`` and ``lse`` are this split's
        (B, H, Nq, Dv) and (B, H, Nq).
        """
        Nk, D = k.shape[2], k.shape[3]
        Dv = v.shape[3]
        n_r = r1 - r0
        rows4, Dv2 = (n_r + 3) // 4 * 4, (Dv + 1) // 2 * 2     # matmul_nt's padding
        S_flat, PV_flat, Q_flat, S_pad, PV_pad, Q_pad, K_pad, VT_pad, O_flat, m, l, exponent_bits = buffers
        if blas:     # Qi scaled and contiguous for np.dot; Kj and Vj are views of k, v
            PV = PV_flat[:n_r * Dv].reshape((n_r, Dv))
            if base2:                             # scores in log2 units: 2**(s log2 e) = e**s
                scale = scale * q.dtype.type(LOG2E)
            Qi = Q_flat[:n_r * D].reshape((n_r, D))
            for r in range(n_r):                  # the scale folded into Qi once, not into every Sij
                for d in range(D):
                    Qi[r, d] = q[b, h, r0 + r, d] * scale
            scale = q.dtype.type(1)
        else:
            Q_pad[:n_r] = q[b, h, r0:r1]
        Oi = O_flat[:n_r * Dv].reshape((n_r, Dv))  # the unnormalised output, on chip throughout
        Oi[:] = 0
        m[:] = -np.inf
        l[:] = 0
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
                       fast_exp, row_vector, base2, round_bits, round_min_exponent, m, l, Oi, exponent_bits)
                np.dot(S, v[b, kh, c0:c0 + n_c], PV)                    # Oi += Pij Vj
                Oi += PV
            else:
                for c in range(n_c):              # load Kj, and Vj transposed
                    K_pad[c] = k[b, kh, c0 + c]
                    for e in range(Dv):
                        VT_pad[e, c] = v[b, kh, c0 + c, e]
                matmul_nt(Q_pad, K_pad, S_pad, rows4, (n_c + 1) // 2 * 2, D)
                form_p(S_pad[:n_r, :n_c], n_r, n_c, r0, c0, kind, scale, cap, alibi, slope, offset, left, right,
                       fast_exp, row_vector, base2, round_bits, round_min_exponent, m, l, Oi, exponent_bits)
                matmul_nt(S_pad, VT_pad, PV_pad, rows4, Dv2, n_c)
                Oi += PV_pad[:n_r, :Dv]
        for r in range(n_r):                      # divide by l once; write Oi and lse once
            row_lse, inv_l = finalize(m[r] * q.dtype.type(LN2) if base2 else m[r], l[r])
            lse[b, h, r0 + r] = row_lse
            for e in range(Dv):
                out[b, h, r0 + r, e] = Oi[r, e] * q.dtype.type(inv_l)

    @numba.njit(cache=True)
    def run_of_items(q, k, v, items, first, last, next_item, tiles, kv_head, Br, Bc, splits, scale, cap, alibi,
                     slopes, offset, left, right, round_bits, round_min_exponent, fast_exp, blas, row_vector,
                     base2, out, lse):
        """What one prange iteration does: its tile buffers, allocated once, then its work items.

        Items [first, last) of ``items``, one after another; or, when
        ``next_item`` holds a counter, whichever item it hands out next, until
        none is left.  Split s of an item owns key tiles [s Tc / splits,
        (s + 1) Tc / splits) and writes out[s], lse[s].
        """
        Nq = q.shape[2]
        Tc = tiles.shape[1]
        buffers = tile_buffers(Br, Bc, q.shape[3], v.shape[3], q.dtype, blas)
        handout = next_item.shape[0] > 0
        n = fetch_add(next_item) if handout else first
        while n < last:
            b, h, t, s = items[n, 0], items[n, 1], items[n, 2], items[n, 3]
            r0 = t * Br
            query_tile(q, k, v, b, h, kv_head[h], r0, min(r0 + Br, Nq), s * Tc // splits,
                       (s + 1) * Tc // splits, tiles[t], Bc, q.dtype.type(scale), q.dtype.type(cap), alibi,
                       slopes[b, h], offset, left, right, round_bits, round_min_exponent, fast_exp, blas,
                       row_vector, base2, buffers, out[s], lse[s])
            n = fetch_add(next_item) if handout else n + 1

    @numba.njit(cache=True, parallel=True)
    def forward_kernel(q, k, v, items, runs, next_item, tiles, kv_head, Br, Bc, splits, scale, cap, alibi, slopes,
                       offset, left, right, round_bits, round_min_exponent, fast_exp, blas, row_vector, base2,
                       out, lse):
        """Every work item, spread over the cores by prange.

        ``items`` lists them, each as (batch, head, query tile, key split);
        ``runs`` cuts that list into contiguous runs, run r being items
        [runs[r], runs[r + 1]), and prange hands each thread a contiguous
        stretch of runs.  With a counter in ``next_item`` a run is not a fixed
        stretch but a worker: it takes the next item from the counter until
        the list is done (``runs`` then only says how many workers).
        """
        for r in numba.prange(runs.shape[0] - 1):
            last = items.shape[0] if next_item.shape[0] > 0 else runs[r + 1]
            run_of_items(q, k, v, items, runs[r], last, next_item, tiles, kv_head, Br, Bc, splits, scale, cap,
                         alibi, slopes, offset, left, right, round_bits, round_min_exponent, fast_exp, blas,
                         row_vector, base2, out, lse)


def work_items(batch, heads, tiles, splits, balanced, heaviest_first=False):
    """The (batch, head, query tile, split) work items, as an (n, 4) int64 array in prange's order.

    ``prange`` cuts its range into one contiguous run per thread before it
    starts (measured: ``numba.set_parallel_chunksize(1)`` does not make it
    hand items out one at a time here, and heaviest first cut in runs gives
    one thread every heavy causal item).  Not balanced: query tiles in zigzag
    order (0, Tr-1, 1, Tr-2, ...) within each head.  Balanced: every item
    sorted by the number of key tiles it computes, then laid out heaviest,
    lightest, second heaviest, second lightest, ...: any contiguous run of
    them holds about its share of the work, across heads and splits too.
    Heaviest first: sorted by that cost and no more, the order for items
    handed out one at a time (the longest go first, the short ones fill the
    gaps at the end).
    """
    Tr, Tc = tiles.shape
    zigzag = [z // 2 if z % 2 == 0 else Tr - 1 - z // 2 for z in range(Tr)]
    items = np.array([(b, h, t, s) for b in range(batch) for h in range(heads) for t in zigzag
                      for s in range(splits)], dtype=np.int64).reshape(-1, 4)
    if (balanced or heaviest_first) and len(items):
        computed = np.cumsum(np.concatenate([np.zeros((Tr, 1), np.int64),
                                             (tiles != rules.EMPTY).astype(np.int64)], axis=1), axis=1)
        lo, hi = items[:, 3] * Tc // splits, (items[:, 3] + 1) * Tc // splits
        cost = computed[items[:, 2], hi] - computed[items[:, 2], lo]
        items = items[np.argsort(-cost, kind="stable")]
        if heaviest_first:
            return items
        n = len(items)                                  # heaviest, lightest, 2nd heaviest, 2nd lightest, ...
        snake = np.empty(n, np.int64)
        snake[0::2], snake[1::2] = np.arange((n + 1) // 2), np.arange(n - 1, (n + 1) // 2 - 1, -1)
        items = items[snake]
    return items


def item_runs(n_items, threads, per_thread):
    """``forward_kernel``'s runs: item n alone in run n (its buffers its own), or, ``per_thread``,
    one contiguous run per thread, cut as prange would cut the items (the buffers then once a thread)."""
    if not per_thread:
        return np.arange(n_items + 1, dtype=np.int64)
    return np.array([n_items * r // threads for r in range(threads + 1)], dtype=np.int64)


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
    items = work_items(B, H, launch.tiles, splits, config.balanced, heaviest_first=config.handout)
    runs = item_runs(len(items), threads, config.scratch)
    next_item = np.zeros(1 if config.handout else 0, dtype=np.int64)    # the hand-out's counter
    blas = _BLAS[0] if config.blas else None
    blas_threads = blas.scipy_openblas_get_num_threads() if blas is not None else None
    if blas is not None:
        blas.scipy_openblas_set_num_threads(1)
    try:
        forward_kernel(q, k, v, items, runs, next_item, launch.tiles, launch.kv_head, launch.Br, launch.Bc, splits,
                       launch.softmax_scale, launch.softcap, launch.alibi, launch.slopes,
                       launch.offset, launch.left, launch.right, launch.round_bits,
                       launch.round_min_exponent, launch.acc_dtype == np.float32, config.blas,
                       config.row_vector, config.base2, out, lse)
    except numba.core.errors.NumbaError as error:
        raise RuntimeError(f"flash_numba_cpu failed to compile for {q.dtype} inputs: {error}") from error
    finally:
        if blas is not None:
            blas.scipy_openblas_set_num_threads(blas_threads)
    if splits == 1:
        return out[0], lse[0]
    merged, merged_lse = merge_all(list(out), list(lse))    # chapter 04's lse rule, over the splits
    return merged.astype(launch.acc_dtype, copy=False), merged_lse.astype(launch.acc_dtype, copy=False)


def default_tiles(step, q, v):
    """(block_q, block_k) a step runs when the call gives none (clamped to the problem by ``flash_forward``)."""
    if STEPS[step].wide:
        return wide_tiles(q.shape[2])
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
