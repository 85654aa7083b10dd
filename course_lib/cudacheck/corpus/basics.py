"""The bugs every first CUDA kernel risks: a missing barrier, a read past the tail, a barrier some
threads never reach, memory read before anything wrote it; each beside its fixed twin."""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from ..memory import uninitialized
from .case import Case, ramp


# 1 --------------------------------------------------------------------------
@cuda.jit
def reverse_buggy(a, out):
    tile = cuda.shared.array(64, float32)
    t, i = cuda.threadIdx.x, cuda.grid(1)
    tile[t] = a[i]
    out[i] = tile[63 - t]            # reads a slot another warp may not have written yet


@cuda.jit
def reverse_fixed(a, out):
    tile = cuda.shared.array(64, float32)
    t, i = cuda.threadIdx.x, cuda.grid(1)
    tile[t] = a[i]
    cuda.syncthreads()
    out[i] = tile[63 - t]


# 2 --------------------------------------------------------------------------
@cuda.jit
def tile_loop_buggy(a, out):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    acc = float32(0)
    for base in range(0, a.shape[0], 64):
        tile[t] = a[base + t]
        cuda.syncthreads()
        acc += tile[(t + 1) % 64]    # the next load can overwrite this slot first: no barrier after
    out[t] = acc


@cuda.jit
def tile_loop_fixed(a, out):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    acc = float32(0)
    for base in range(0, a.shape[0], 64):
        tile[t] = a[base + t]
        cuda.syncthreads()
        acc += tile[(t + 1) % 64]
        cuda.syncthreads()
    out[t] = acc


def _tile_loop_spec(a, out):
    return {1: np.roll(a.reshape(-1, 64), -1, axis=1).sum(axis=0, dtype=np.float32)}


# 3 --------------------------------------------------------------------------
@cuda.jit
def tree_sum_buggy(a, out):
    s = cuda.shared.array(128, float32)
    t = cuda.threadIdx.x
    s[t] = a[cuda.grid(1)]
    cuda.syncthreads()
    stride = 64
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
        stride //= 2
    cuda.syncthreads()               # misplaced: each halving step needs its own barrier
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


@cuda.jit
def tree_sum_fixed(a, out):
    s = cuda.shared.array(128, float32)
    t = cuda.threadIdx.x
    s[t] = a[cuda.grid(1)]
    cuda.syncthreads()
    stride = 64
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
        stride //= 2
        cuda.syncthreads()
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


# 4 --------------------------------------------------------------------------
@cuda.jit
def scale_buggy(a, out):
    i = cuda.grid(1)
    out[i] = 2 * a[i]                # 128 threads for 100 elements: no tail guard


@cuda.jit
def scale_fixed(a, out):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = 2 * a[i]


# 5 --------------------------------------------------------------------------
@cuda.jit
def tile_tail_buggy(k, out):
    # one thread per query row; K rows come through shared memory 32 at a time (N = 40: a tail tile)
    tile = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    acc = float32(0)
    for base in range(0, k.shape[0], 32):
        tile[t] = k[base + t]        # the tail tile reads past the end of k
        cuda.syncthreads()
        for j in range(min(32, k.shape[0] - base)):
            acc += tile[j]
        cuda.syncthreads()
    out[t] = acc


@cuda.jit
def tile_tail_fixed(k, out):
    tile = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    acc = float32(0)
    for base in range(0, k.shape[0], 32):
        if base + t < k.shape[0]:
            tile[t] = k[base + t]
        else:
            tile[t] = 0
        cuda.syncthreads()
        for j in range(min(32, k.shape[0] - base)):
            acc += tile[j]
        cuda.syncthreads()
    out[t] = acc


# 6 --------------------------------------------------------------------------
@cuda.jit
def shared_global_index_buggy(a, out):
    tile = cuda.shared.array(64, float32)
    t, i = cuda.threadIdx.x, cuda.grid(1)  # noqa: F841 -- as in the fixed twin; the bug is not using t
    tile[i] = a[i]                   # the global index, not the thread's: past the tile from block 1 on
    cuda.syncthreads()
    out[i] = tile[i] + tile[i ^ 1]


@cuda.jit
def shared_global_index_fixed(a, out):
    tile = cuda.shared.array(64, float32)
    t, i = cuda.threadIdx.x, cuda.grid(1)
    tile[t] = a[i]
    cuda.syncthreads()
    out[i] = tile[t] + tile[t ^ 1]


def _pair_sum_spec(a, out):
    return {1: a + a[np.arange(a.size) ^ 1]}


# 7 --------------------------------------------------------------------------
@cuda.jit
def block_sum_tail_buggy(a, out):
    tile = cuda.shared.array(64, float32)
    t, i = cuda.threadIdx.x, cuda.grid(1)
    if i < a.shape[0]:
        tile[t] = a[i]               # past the tail nobody writes the slot ...
    cuda.syncthreads()
    if t == 0:
        s = float32(0)
        for j in range(64):
            s += tile[j]             # ... and thread 0 adds it anyway
        out[cuda.blockIdx.x] = s


@cuda.jit
def block_sum_tail_fixed(a, out):
    tile = cuda.shared.array(64, float32)
    t, i = cuda.threadIdx.x, cuda.grid(1)
    if i < a.shape[0]:
        tile[t] = a[i]
    else:
        tile[t] = 0
    cuda.syncthreads()
    if t == 0:
        s = float32(0)
        for j in range(64):
            s += tile[j]
        out[cuda.blockIdx.x] = s


# 8 --------------------------------------------------------------------------
@cuda.jit
def accumulate_buggy(a, out):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] += a[i]               # out came from cuda.device_array: never written


@cuda.jit
def accumulate_fixed(a, out):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i]


# 9 --------------------------------------------------------------------------
@cuda.jit
def local_acc_buggy(a, out):
    acc = cuda.local.array(4, float32)
    i = cuda.grid(1)
    for r in range(a.shape[0]):
        for d in range(4):
            acc[d] += a[r, d] * (i + 1)   # the accumulator was never zeroed
    out[i] = acc[0] + acc[1] + acc[2] + acc[3]


@cuda.jit
def local_acc_fixed(a, out):
    acc = cuda.local.array(4, float32)
    i = cuda.grid(1)
    for d in range(4):
        acc[d] = 0
    for r in range(a.shape[0]):
        for d in range(4):
            acc[d] += a[r, d] * (i + 1)
    out[i] = acc[0] + acc[1] + acc[2] + acc[3]


# 10 -------------------------------------------------------------------------
@cuda.jit
def barrier_in_branch_buggy(a, out, n):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    if t < n:                        # only the threads with data ...
        tile[t] = a[t]
        cuda.syncthreads()           # ... reach this barrier
        out[t] = tile[n - 1 - t]


@cuda.jit
def barrier_in_branch_fixed(a, out, n):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    if t < n:
        tile[t] = a[t]
    cuda.syncthreads()
    if t < n:
        out[t] = tile[n - 1 - t]


# 11 -------------------------------------------------------------------------
@cuda.jit
def early_return_buggy(a, out):
    tile = cuda.shared.array(64, float32)
    t, i = cuda.threadIdx.x, cuda.grid(1)
    if i >= a.shape[0]:
        return                       # the tail threads leave before the barrier
    tile[t] = a[i]
    cuda.syncthreads()
    out[i] = tile[t] + tile[t ^ 1]


@cuda.jit
def early_return_fixed(a, out):
    tile = cuda.shared.array(64, float32)
    t, i = cuda.threadIdx.x, cuda.grid(1)
    tile[t] = a[i] if i < a.shape[0] else 0
    cuda.syncthreads()
    if i < a.shape[0]:
        out[i] = tile[t] + tile[t ^ 1]


def _early_return_spec(a, out):
    padded = np.concatenate([a, np.zeros(128 - a.size, a.dtype)])
    return {1: (padded + padded[np.arange(128) ^ 1])[:a.size]}


# 12 -------------------------------------------------------------------------
@cuda.jit
def split_barriers_buggy(a, out):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    if t < 32:                       # warp 0 loads the first half ...
        tile[t] = a[t]
        cuda.syncthreads()
        out[t] = tile[t + 32]
    else:                            # ... warp 1 the second, each at a barrier of its own
        tile[t] = a[t]
        cuda.syncthreads()
        out[t] = tile[t - 32]


@cuda.jit
def split_barriers_fixed(a, out):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    tile[t] = a[t]
    cuda.syncthreads()
    if t < 32:
        out[t] = tile[t + 32]
    else:
        out[t] = tile[t - 32]


# 13 -------------------------------------------------------------------------
@cuda.jit
def grid_sum_buggy(a, out):
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = a[cuda.grid(1)]
    cuda.syncthreads()
    if t == 0:
        partial = float32(0)
        for j in range(64):
            partial += s[j]
        out[0] += partial            # every block adds to out[0] at once: updates get lost


@cuda.jit
def grid_sum_fixed(a, out):
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = a[cuda.grid(1)]
    cuda.syncthreads()
    if t == 0:
        partial = float32(0)
        for j in range(64):
            partial += s[j]
        cuda.atomic.add(out, 0, partial)


# 14 -------------------------------------------------------------------------
@cuda.jit
def stencil_buggy(a, out):
    i = cuda.grid(1)
    if i < a.shape[0] - 1:           # guards the right edge only: a[i - 1] at i = 0 is a[-1]
        out[i] = a[i - 1] + a[i] + a[i + 1]


@cuda.jit
def stencil_fixed(a, out):
    i = cuda.grid(1)
    if 0 < i < a.shape[0] - 1:
        out[i] = a[i - 1] + a[i] + a[i + 1]


def _stencil_spec(a, out):
    want = out.copy()
    want[1:-1] = a[:-2] + a[1:-1] + a[2:]
    return {1: want}


# 15 -------------------------------------------------------------------------
TILE = 16


@cuda.jit
def matmul_buggy(A, B, C):
    sA = cuda.shared.array((TILE, TILE), float32)
    sB = cuda.shared.array((TILE, TILE), float32)
    x, y = cuda.grid(2)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    acc = float32(0)
    for k0 in range(0, A.shape[1], TILE):
        sA[ty, tx] = A[y, k0 + tx]
        sB[ty, tx] = B[k0 + ty, x]
        cuda.syncthreads()
        for k in range(TILE):
            acc += sA[ty, k] * sB[k, tx]
        # missing: a barrier before the next tile overwrites sA / sB
    C[y, x] = acc


@cuda.jit
def matmul_fixed(A, B, C):
    sA = cuda.shared.array((TILE, TILE), float32)
    sB = cuda.shared.array((TILE, TILE), float32)
    x, y = cuda.grid(2)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    acc = float32(0)
    for k0 in range(0, A.shape[1], TILE):
        sA[ty, tx] = A[y, k0 + tx]
        sB[ty, tx] = B[k0 + ty, x]
        cuda.syncthreads()
        for k in range(TILE):
            acc += sA[ty, k] * sB[k, tx]
        cuda.syncthreads()
    C[y, x] = acc


# 16 -------------------------------------------------------------------------
@cuda.jit
def causal_loop_buggy(k, out):
    # one thread per query row t; row t sees keys 0..t (causal), K comes through shared memory in tiles of 8
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    acc = float32(0)
    for base in range(0, t + 1, 8):  # a per-row trip count: rows stop at different barriers
        tile[t] = k[base + t % 8]
        cuda.syncthreads()
        for j in range(min(8, t + 1 - base)):
            acc += tile[(t // 8) * 8 + j]
        cuda.syncthreads()
    out[t] = acc


@cuda.jit
def causal_loop_fixed(k, out):
    tile = cuda.shared.array(8, float32)
    t = cuda.threadIdx.x
    acc = float32(0)
    last = cuda.blockDim.x           # the block's last row decides the trip count; rows mask what they can't see
    for base in range(0, last, 8):
        if t < 8:
            tile[t] = k[base + t]
        cuda.syncthreads()
        for j in range(8):
            if base + j <= t:
                acc += tile[j]
        cuda.syncthreads()
    out[t] = acc


def _causal_spec(k, out):
    return {1: np.cumsum(k[:out.size], dtype=np.float32)}


def _scaled(factor):
    return lambda a, out: {1: factor * a}


CASES = (
    Case("reverse_no_barrier", "reads a shared slot another warp writes, with no syncthreads between",
         reverse_buggy, reverse_fixed, 2, 64, lambda: (ramp(128), np.zeros(128, np.float32)), "race",
         lambda a, out: {1: a.reshape(2, 64)[:, ::-1].reshape(-1)}),
    Case("tile_loop_no_second_barrier", "the next tile load overwrites shared memory other threads still read",
         tile_loop_buggy, tile_loop_fixed, 1, 64, lambda: (ramp(256), np.zeros(64, np.float32)), "race",
         _tile_loop_spec),
    Case("tree_sum_barrier_outside_loop", "one syncthreads after the halving loop instead of one per step",
         tree_sum_buggy, tree_sum_fixed, 2, 128, lambda: (ramp(256), np.zeros(2, np.float32)), "race",
         lambda a, out: {1: a.reshape(2, 128).sum(axis=1, dtype=np.float32)}),
    Case("no_tail_guard", "128 threads for 100 elements, no `if i < n`",
         scale_buggy, scale_fixed, 2, 64, lambda: (ramp(100), np.zeros(100, np.float32)), "out_of_bounds",
         _scaled(2)),
    Case("tile_load_past_tail", "the last K tile is loaded without a guard (N = 40, tiles of 32)",
         tile_tail_buggy, tile_tail_fixed, 1, 32, lambda: (ramp(40), np.zeros(32, np.float32)), "out_of_bounds",
         lambda k, out: {1: np.full(32, k.sum(dtype=np.float32), np.float32)}),
    Case("shared_indexed_by_global_index", "the shared tile is indexed with cuda.grid(1), not threadIdx.x",
         shared_global_index_buggy, shared_global_index_fixed, 4, 64,
         lambda: (ramp(256), np.zeros(256, np.float32)), "out_of_bounds", _pair_sum_spec),
    Case("shared_tail_never_written", "past the tail nobody writes the shared slot, and thread 0 sums it",
         block_sum_tail_buggy, block_sum_tail_fixed, 2, 64, lambda: (ramp(100), np.zeros(2, np.float32)),
         "uninitialized",
         lambda a, out: {1: np.array([a[:64].sum(), a[64:].sum()], np.float32)},
         "initcheck checks global memory only, not shared memory"),
    Case("accumulate_into_unwritten_output", "out[i] += ... into cuda.device_array memory nobody wrote",
         accumulate_buggy, accumulate_fixed, 2, 64, lambda: (ramp(100), uninitialized(100, np.float32)),
         "uninitialized", lambda a, out: {1: a}),
    Case("local_accumulator_not_zeroed", "a cuda.local.array accumulator used without setting it to 0",
         local_acc_buggy, local_acc_fixed, 1, 32,
         lambda: (ramp(24).reshape(6, 4), np.zeros(32, np.float32)), "uninitialized",
         lambda a, out: {1: a.sum(dtype=np.float32) * np.arange(1, 33, dtype=np.float32)},
         "initcheck checks global memory only; a cuda.local.array is local memory"),
    Case("barrier_inside_tail_branch", "syncthreads inside `if t < n`, n = 40 of 64 threads",
         barrier_in_branch_buggy, barrier_in_branch_fixed, 1, 64,
         lambda: (ramp(64), np.zeros(64, np.float32), 40), "barrier",
         lambda a, out, n: {1: np.concatenate([a[:n][::-1], out[n:]])}),
    Case("early_return_before_barrier", "`if i >= n: return` before the tile load and its syncthreads",
         early_return_buggy, early_return_fixed, 2, 64, lambda: (ramp(100), np.zeros(100, np.float32)),
         "barrier", _early_return_spec),
    Case("a_barrier_per_branch", "each warp waits at a syncthreads of its own branch",
         split_barriers_buggy, split_barriers_fixed, 1, 64, lambda: (ramp(64), np.zeros(64, np.float32)),
         "barrier", lambda a, out: {1: np.roll(a, 32)}),
    Case("blocks_add_to_one_element", "every block does out[0] += partial, no atomic",
         grid_sum_buggy, grid_sum_fixed, 4, 64, lambda: (ramp(256), np.zeros(1, np.float32)), "race",
         lambda a, out: {1: np.array([a.sum(dtype=np.float32)], np.float32)},
         "racecheck checks shared memory only; this race is on global memory, between blocks"),
    Case("stencil_negative_index", "a[i - 1] at i = 0: numba wraps it to a[-1]",
         stencil_buggy, stencil_fixed, 1, 64, lambda: (ramp(64), np.zeros(64, np.float32)), "out_of_bounds",
         _stencil_spec, "numba wraps a[-1] to the last element, so the access stays inside the allocation"),
    Case("matmul_no_second_barrier", "tiled matmul without the barrier at the end of the k loop",
         matmul_buggy, matmul_fixed, (2, 2), (TILE, TILE),
         lambda: (ramp(32 * 64).reshape(32, 64) / 8, ramp(64 * 32).reshape(64, 32)[::-1].copy() / 8,
                  np.zeros((32, 32), np.float32)), "race",
         lambda A, B, C: {2: (A.astype(np.float64) @ B).astype(np.float32)}),
    Case("causal_loop_per_row", "the K-tile loop's trip count depends on the row, with barriers inside",
         causal_loop_buggy, causal_loop_fixed, 1, 64, lambda: (ramp(64), np.zeros(64, np.float32)), "barrier",
         _causal_spec),
)

