"""Tiles and staging as a learner first writes them: a 2-D tiled matmul, a device function's shared
scratch reused in a loop, a tile sized for another block shape, overlapping slices of one array,
a shared histogram, int8 data accumulated and requantized in int8."""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, int8, int32

from ..memory import to_device
from .case import Case, ramp

# Each case's expected verdict is its ``expect``, written down before the case was first run.
T = 8   # the matmul tile


# 1 --------------------------------------------------------------------------
@cuda.jit
def matmul_tail_buggy(a, b, c):      # c = a @ b in T x T tiles, a 2-D block per output tile
    sa = cuda.shared.array((T, T), float32)
    sb = cuda.shared.array((T, T), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.blockIdx.y * T + ty, cuda.blockIdx.x * T + tx
    acc = float32(0)
    for k0 in range(0, a.shape[1], T):
        sa[ty, tx] = a[row, k0 + tx]     # the last tile runs past n = 12: no guard on the loads
        sb[ty, tx] = b[k0 + ty, col]
        cuda.syncthreads()
        for kk in range(T):
            acc += sa[ty, kk] * sb[kk, tx]
        cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


@cuda.jit
def matmul_tail_fixed(a, b, c):
    sa = cuda.shared.array((T, T), float32)
    sb = cuda.shared.array((T, T), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.blockIdx.y * T + ty, cuda.blockIdx.x * T + tx
    n = a.shape[1]
    acc = float32(0)
    for k0 in range(0, n, T):
        sa[ty, tx] = a[row, k0 + tx] if row < a.shape[0] and k0 + tx < n else 0
        sb[ty, tx] = b[k0 + ty, col] if k0 + ty < n and col < b.shape[1] else 0
        cuda.syncthreads()
        for kk in range(T):
            acc += sa[ty, kk] * sb[kk, tx]
        cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


# 2 --------------------------------------------------------------------------
@cuda.jit
def matmul_2d_buggy(a, b, c):        # n = 16, a multiple of T: no tail
    sa = cuda.shared.array((T, T), float32)
    sb = cuda.shared.array((T, T), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.blockIdx.y * T + ty, cuda.blockIdx.x * T + tx
    acc = float32(0)
    for k0 in range(0, a.shape[1], T):
        sa[ty, tx] = a[row, k0 + tx]
        sb[ty, tx] = b[k0 + ty, col]
        cuda.syncthreads()
        for kk in range(T):
            acc += sa[ty, kk] * sb[kk, tx]
    c[row, col] = acc                # no barrier before the next tile's loads overwrite sa and sb


@cuda.jit
def matmul_2d_fixed(a, b, c):
    sa = cuda.shared.array((T, T), float32)
    sb = cuda.shared.array((T, T), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.blockIdx.y * T + ty, cuda.blockIdx.x * T + tx
    acc = float32(0)
    for k0 in range(0, a.shape[1], T):
        sa[ty, tx] = a[row, k0 + tx]
        sb[ty, tx] = b[k0 + ty, col]
        cuda.syncthreads()
        for kk in range(T):
            acc += sa[ty, kk] * sb[kk, tx]
        cuda.syncthreads()
    c[row, col] = acc


def _matmul_args(n):
    return ramp(n * n).reshape(n, n) / 4, ramp(n * n)[::-1].reshape(n, n) / 4, np.zeros((n, n), np.float32)


# 3 --------------------------------------------------------------------------
@cuda.jit
def copy_buggy(src, dst):            # launched as copy(x[1:], x[:-1]): an in-place shift left
    i = cuda.grid(1)
    if i < dst.shape[0]:
        dst[i] = src[i]              # thread i reads x[i + 1], which thread i + 1 overwrites


@cuda.jit
def copy_fixed(src, dst):
    i = cuda.grid(1)
    v = src[i] if i < src.shape[0] else 0
    cuda.syncthreads()               # one block: every read is done before any write
    if i < dst.shape[0]:
        dst[i] = v


def _overlapping():
    x = to_device(ramp(64))
    return x[1:], x[:-1]


# 4 --------------------------------------------------------------------------
@cuda.jit(device=True)
def block_max_buggy(x):
    buf = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    buf[t] = x
    cuda.syncthreads()
    m = buf[0]
    for j in range(1, 32):
        m = max(m, buf[j])
    return m                         # the next call writes buf while other threads still read it


@cuda.jit
def tile_maxima_buggy(a, out):       # the sum, over tiles of 32, of each tile's max
    t = cuda.threadIdx.x
    total = float32(0)
    for base in range(0, a.shape[0], 32):
        total += block_max_buggy(a[base + t])
    if t == 0:
        out[0] = total


@cuda.jit(device=True)
def block_max_fixed(x):
    buf = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    buf[t] = x
    cuda.syncthreads()
    m = buf[0]
    for j in range(1, 32):
        m = max(m, buf[j])
    cuda.syncthreads()
    return m


@cuda.jit
def tile_maxima_fixed(a, out):
    t = cuda.threadIdx.x
    total = float32(0)
    for base in range(0, a.shape[0], 32):
        total += block_max_fixed(a[base + t])
    if t == 0:
        out[0] = total


# 5 --------------------------------------------------------------------------
@cuda.jit
def tile_2d_sum_buggy(a, out):       # written for 16 x 16 blocks, launched with 8 x 8
    tile = cuda.shared.array((16, 16), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = a[ty, tx]
    cuda.syncthreads()
    if tx == 0 and ty == 0:
        s = float32(0)
        for y in range(16):
            for x in range(16):
                s += tile[y, x]
        out[0] = s


@cuda.jit
def tile_2d_sum_fixed(a, out):
    tile = cuda.shared.array((16, 16), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for y in range(ty, 16, cuda.blockDim.y):
        for x in range(tx, 16, cuda.blockDim.x):
            tile[y, x] = a[y, x]
    cuda.syncthreads()
    if tx == 0 and ty == 0:
        s = float32(0)
        for y in range(16):
            for x in range(16):
                s += tile[y, x]
        out[0] = s


# 6 --------------------------------------------------------------------------
@cuda.jit
def int8_dot_buggy(q, k, out):       # int8 scores q . k, one thread per row
    t = cuda.threadIdx.x
    acc = cuda.local.array(1, int8)  # the products of int8 values need more than 8 bits
    acc[0] = 0
    for d in range(q.shape[1]):
        acc[0] += q[t, d] * k[d]
    out[t] = acc[0]


@cuda.jit
def int8_dot_fixed(q, k, out):
    t = cuda.threadIdx.x
    acc = cuda.local.array(1, int32)
    acc[0] = 0
    for d in range(q.shape[1]):
        acc[0] += q[t, d] * k[d]
    out[t] = acc[0]


def _int8_args():
    q = (np.arange(32 * 16) * 37 % 201 - 100).astype(np.int8).reshape(32, 16)
    return q, (np.arange(16) * 53 % 201 - 100).astype(np.int8), np.zeros(32, np.int32)


# 7 --------------------------------------------------------------------------
@cuda.jit
def requantize_buggy(x, scale, out):  # int8 = round(x / scale), for scores larger than 127 steps
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = round(x[i] / scale)     # no clamp to [-127, 127] before the int8 store


@cuda.jit
def requantize_fixed(x, scale, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = min(127, max(-127, round(x[i] / scale)))


# 8 --------------------------------------------------------------------------
@cuda.jit
def histogram_buggy(a, out):         # 8 bins of a block's values, counted in shared memory
    hist = cuda.shared.array(8, int32)
    t = cuda.threadIdx.x
    if t < 8:
        hist[t] = 0
    cuda.syncthreads()
    b = int(a[t]) % 8
    hist[b] += 1                     # threads with the same bin read and write one counter at once
    cuda.syncthreads()
    if t < 8:
        out[t] = hist[t]


@cuda.jit
def histogram_fixed(a, out):
    hist = cuda.shared.array(8, int32)
    t = cuda.threadIdx.x
    if t < 8:
        hist[t] = 0
    cuda.syncthreads()
    b = int(a[t]) % 8
    cuda.atomic.add(hist, b, 1)
    cuda.syncthreads()
    if t < 8:
        out[t] = hist[t]


# 9 --------------------------------------------------------------------------
@cuda.jit
def shared_total_buggy(a, out):      # every thread adds its value to one shared total
    total = cuda.shared.array(1, float32)
    t = cuda.threadIdx.x
    cuda.atomic.add(total, 0, a[t])  # nobody set total to 0: shared memory starts as garbage
    cuda.syncthreads()
    if t == 0:
        out[0] = total[0]


@cuda.jit
def shared_total_fixed(a, out):
    total = cuda.shared.array(1, float32)
    t = cuda.threadIdx.x
    if t == 0:
        total[0] = 0
    cuda.syncthreads()
    cuda.atomic.add(total, 0, a[t])
    cuda.syncthreads()
    if t == 0:
        out[0] = total[0]


# 10 -------------------------------------------------------------------------
@cuda.jit
def grid_stride_buggy(a, out):       # a grid-stride loop over n = 100 elements
    i = cuda.grid(1)
    while i <= a.shape[0]:           # <= : one trip too many at the end
        out[i] = 3 * a[i]
        i += cuda.gridsize(1)


@cuda.jit
def grid_stride_fixed(a, out):
    i = cuda.grid(1)
    while i < a.shape[0]:
        out[i] = 3 * a[i]
        i += cuda.gridsize(1)


CASES = (
    Case("matmul_2d_tail_tile_unguarded", "a 2-D tiled matmul, n = 12 with tiles of 8: the last tile's "
         "loads are not guarded", matmul_tail_buggy, matmul_tail_fixed, (2, 2), (T, T),
         lambda: _matmul_args(12), "out_of_bounds", lambda a, b, c: {2: (a @ b).astype(np.float32)}),
    Case("matmul_2d_no_second_barrier", "a 2-D tiled matmul without the barrier at the end of the k loop",
         matmul_2d_buggy, matmul_2d_fixed, (2, 2), (T, T), lambda: _matmul_args(16), "race",
         lambda a, b, c: {2: (a @ b).astype(np.float32)}),
    Case("overlapping_slices_in_place", "copy(x[1:], x[:-1]): two slices of one device array, overlapping",
         copy_buggy, copy_fixed, 1, 64, _overlapping, "race",
         lambda src, dst: {1: np.asarray(src)}),
    Case("device_function_shared_in_loop", "a device function's shared scratch, called once per tile in a "
         "loop, no barrier at its end", tile_maxima_buggy, tile_maxima_fixed, 1, 32,
         lambda: (ramp(128), np.zeros(1, np.float32)), "race",
         lambda a, out: {1: np.array([a.reshape(4, 32).max(axis=1).sum()], np.float32)}),
    Case("tile_2d_sized_for_another_block", "a 16 x 16 shared tile loaded one element per thread, launched "
         "with 8 x 8 threads", tile_2d_sum_buggy, tile_2d_sum_fixed, 1, (8, 8),
         lambda: (ramp(256).reshape(16, 16), np.zeros(1, np.float32)), "uninitialized",
         lambda a, out: {1: np.array([a.sum()], np.float32)}),
    Case("int8_accumulator_wraps", "int8 q . k accumulated in an int8: the sum wraps past 127",
         int8_dot_buggy, int8_dot_fixed, 1, 32, _int8_args, "integer_overflow",
         lambda q, k, out: {2: q.astype(np.int32) @ k.astype(np.int32)}),
    Case("int8_requantize_unclamped", "round(x / scale) stored into int8 with no clamp to [-127, 127]",
         requantize_buggy, requantize_fixed, 1, 64, lambda: (ramp(64) * 40, 1.5, np.zeros(64, np.int8)),
         "integer_overflow",
         lambda x, scale, out: {2: np.clip(np.round(x / np.float32(scale)), -127, 127).astype(np.int8)}),
    Case("shared_histogram_without_atomics", "hist[bin] += 1 in shared memory by every thread, no atomic",
         histogram_buggy, histogram_fixed, 1, 64, lambda: (np.abs(ramp(64)) + 3, np.zeros(8, np.int32)),
         "race", lambda a, out: {1: np.bincount(a.astype(np.int64) % 8, minlength=8).astype(np.int32)}),
    Case("shared_total_not_zeroed", "atomic adds into a shared total nobody set to 0",
         shared_total_buggy, shared_total_fixed, 1, 32, lambda: (ramp(32), np.zeros(1, np.float32)),
         "uninitialized", lambda a, out: {1: np.array([a.sum()], np.float32)}),
    Case("grid_stride_loop_one_too_far", "a grid-stride loop `while i <= n`", grid_stride_buggy,
         grid_stride_fixed, 2, 32, lambda: (ramp(100), np.zeros(100, np.float32)), "out_of_bounds",
         lambda a, out: {1: 3 * a}),
)
