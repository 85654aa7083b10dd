"""The host side of chapter 08's kernels: tile sizes, work items, BLAS threads, the launch.

What the versions in ``versions`` decide before their compiled kernel runs:
which tiles (``tile_sizes_for``, ``wide_tiles``), which work items in which
order (``zigzag_items``, ``balanced_items``, ``heaviest_first_items``), how
many pieces a row's keys are cut into (``key_splits``), and, for the kernels
that keep their buffers per thread, which run of items each thread takes
(``thread_runs``).  ``run`` bundles what every kernel reads (``Work``,
``Scores``), runs the kernel with SciPy's BLAS held to one thread, and merges
the key splits.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

try:
    import numba
except ModuleNotFoundError:  # an optional package missing: the impl is unavailable, nothing else
    numba = None

from ...core import rules
from ...core.machine import cache_sizes
from ...core.online_softmax import merge_all

MIN_ITEMS_PER_THREAD = 4    # fewer (batch, head, query tile) items than this per thread: split the keys


def scipy_openblas():
    """SciPy's OpenBLAS, which ``np.dot`` inside njit calls, as a ctypes library; None for another BLAS.

    The kernel's threads are prange's: a BLAS that starts threads of its own
    inside each of them fights them for the cores (OpenBLAS warns "Detect
    OpenMP Loop and this application may hang").  ``run`` sets it to one
    thread for the call and back after.  Which kernels OpenBLAS runs (AVX2's
    "Haswell", AVX-512's "SkylakeX", ...) it decides when it loads, from the
    CPU or from OPENBLAS_CORETYPE: ``blas_core`` says.
    """
    import ctypes
    import glob
    import os

    import scipy
    import scipy.linalg.cython_blas
    folder = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
    for path in glob.glob(os.path.join(folder, "libscipy_openblas*.so*")):
        library = ctypes.CDLL(path)
        if hasattr(library, "scipy_openblas_set_num_threads"):
            library.scipy_openblas_get_corename.restype = ctypes.c_char_p
            return library
    return None


_BLAS = [scipy_openblas() if numba is not None else None]


def blas_core():
    """The kernels SciPy's OpenBLAS runs here ("SkylakeX", "Haswell", ...), or None for another BLAS."""
    return _BLAS[0].scipy_openblas_get_corename().decode() if _BLAS[0] is not None else None


@contextmanager
def one_blas_thread():
    """SciPy's OpenBLAS on one thread while the block runs (prange's threads are the kernel's), then back."""
    blas = _BLAS[0]
    threads = blas.scipy_openblas_get_num_threads() if blas is not None else None
    if blas is not None:
        blas.scipy_openblas_set_num_threads(1)
    try:
        yield
    finally:
        if blas is not None:
            blas.scipy_openblas_set_num_threads(threads)


# -- tile sizes ----------------------------------------------------------------------------

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


# -- work items ----------------------------------------------------------------------------

def zigzag_items(batch, heads, tiles, splits):
    """The (batch, head, query tile, split) work items, an (n, 4) int64 array, query tiles in zigzag
    order (0, Tr-1, 1, Tr-2, ...) within each head: under a causal mask a long row follows a short one.

    ``prange`` cuts its range into one contiguous run per thread before it
    starts (measured: ``numba.set_parallel_chunksize(1)`` does not make it
    hand items out one at a time here), so this order is what each thread gets.
    """
    Tr = tiles.shape[0]
    zigzag = [z // 2 if z % 2 == 0 else Tr - 1 - z // 2 for z in range(Tr)]
    return np.array([(b, h, t, s) for b in range(batch) for h in range(heads) for t in zigzag
                     for s in range(splits)], dtype=np.int64).reshape(-1, 4)


def heaviest_first_items(batch, heads, tiles, splits):
    """``zigzag_items`` sorted by the number of key tiles each computes, heaviest first (a stable sort):
    the order for items handed out one at a time (the longest go first, the short ones fill the gaps)."""
    items = zigzag_items(batch, heads, tiles, splits)
    if not len(items):
        return items
    Tc = tiles.shape[1]
    computed = np.cumsum(np.concatenate([np.zeros((tiles.shape[0], 1), np.int64),
                                         (tiles != rules.EMPTY).astype(np.int64)], axis=1), axis=1)
    lo, hi = items[:, 3] * Tc // splits, (items[:, 3] + 1) * Tc // splits
    cost = computed[items[:, 2], hi] - computed[items[:, 2], lo]
    return items[np.argsort(-cost, kind="stable")]


def balanced_items(batch, heads, tiles, splits):
    """``heaviest_first_items`` laid out heaviest, lightest, second heaviest, second lightest, ...: any
    contiguous run of them (prange's run per thread) holds about its share of the work, across heads and
    splits too (heaviest first cut in runs would give one thread every heavy causal item)."""
    items = heaviest_first_items(batch, heads, tiles, splits)
    n = len(items)
    snake = np.empty(n, np.int64)
    snake[0::2], snake[1::2] = np.arange((n + 1) // 2), np.arange(n - 1, (n + 1) // 2 - 1, -1)
    return items[snake]


def thread_runs(n_items, threads):
    """One contiguous run of items per thread, cut as prange would cut them: run r is items
    [runs[r], runs[r + 1])."""
    return np.array([n_items * r // threads for r in range(threads + 1)], dtype=np.int64)


def key_splits(batch, heads, query_tiles, key_tiles, threads):
    """How many pieces each row's keys are cut into: 1 unless there are fewer than
    MIN_ITEMS_PER_THREAD items per thread (decoding), then enough to make that many."""
    items = batch * heads * query_tiles
    if items >= MIN_ITEMS_PER_THREAD * threads or items == 0:
        return 1
    return max(1, min(key_tiles, -(-MIN_ITEMS_PER_THREAD * threads // items)))


# -- the launch ----------------------------------------------------------------------------

class Work(NamedTuple):
    """Which work items a kernel runs, and the tile plan they read."""

    items: np.ndarray     # (n, 4) int64: (batch, head, query tile, key split)
    tiles: np.ndarray     # (Tr, Tc) int8: rules.EMPTY / PARTIAL / FULL
    kv_head: np.ndarray   # (H,) int64: the K / V head of each query head
    slopes: np.ndarray    # (B, H) float64: ALiBi's slopes, zeros when off
    Br: int
    Bc: int
    splits: int           # split s of an item owns key tiles [s Tc / splits, (s + 1) Tc / splits)


class Scores(NamedTuple):
    """What turns a tile of Q K^T into P: the launch's numbers, scale and cap in the kernel's dtype."""

    scale: float
    cap: float
    alibi: bool
    offset: int
    left: int
    right: int
    round_bits: int
    round_min_exponent: int
    fast_exp: bool         # float32: exp by ``tile.exp_row``'s polynomial, not libm's


def run(kernel, launch, q, k, v, items, splits, *extra):
    """Run ``kernel(q, k, v, Work, Scores, *extra, out, lse)`` on prepared (contiguous, acc-dtype)
    q, k, v: (out, lse) in the accumulation dtype, the key splits merged with chapter 04's lse rule."""
    B, H, Nq, _ = q.shape
    dtype = launch.acc_dtype.type
    work = Work(items, launch.tiles, launch.kv_head, launch.slopes, launch.Br, launch.Bc, splits)
    scores = Scores(dtype(launch.softmax_scale), dtype(launch.softcap), launch.alibi, launch.offset,
                    launch.left, launch.right, launch.round_bits, launch.round_min_exponent,
                    launch.acc_dtype == np.float32)
    out = np.empty((splits, B, H, Nq, v.shape[3]), dtype=launch.acc_dtype)
    lse = np.empty((splits, B, H, Nq), dtype=launch.acc_dtype)
    try:
        with one_blas_thread():
            kernel(q, k, v, work, scores, *extra, out, lse)
    except numba.core.errors.NumbaError as error:
        raise RuntimeError(f"flash_numba_cpu failed to compile for {q.dtype} inputs: {error}") from error
    if splits == 1:
        return out[0], lse[0]
    merged, merged_lse = merge_all(list(out), list(lse))    # chapter 04's lse rule, over the splits
    return merged.astype(launch.acc_dtype, copy=False), merged_lse.astype(launch.acc_dtype, copy=False)
