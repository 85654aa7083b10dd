"""Bugs a simulator only sees, and correct kernels it only passes, when it does what the GPU does:
a ``cuda.shared.array`` is one array for the block however often its line runs, one device array
passed twice is one buffer, and the GPU's arithmetic is IEEE floats and integers that wrap."""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int16, int32

from ..memory import to_device
from .case import Case, ramp


# 1 --------------------------------------------------------------------------
@cuda.jit(device=True)
def block_total_buggy(x):
    buf = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    buf[t] = x
    cuda.syncthreads()
    total = float32(0)
    for j in range(64):
        total += buf[j]
    return total                     # the next call writes buf while other threads still read it


@cuda.jit
def two_totals_buggy(a, b, out):
    i = cuda.grid(1)
    out[i] = block_total_buggy(a[i]) - block_total_buggy(b[i])


@cuda.jit(device=True)
def block_total_fixed(x):
    buf = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    buf[t] = x
    cuda.syncthreads()
    total = float32(0)
    for j in range(64):
        total += buf[j]
    cuda.syncthreads()               # every thread has read buf before the next call writes it
    return total


@cuda.jit
def two_totals_fixed(a, b, out):
    i = cuda.grid(1)
    out[i] = block_total_fixed(a[i]) - block_total_fixed(b[i])


def _two_totals_spec(a, b, out):
    per_block = a.reshape(2, 64).sum(axis=1) - b.reshape(2, 64).sum(axis=1)
    return {2: np.repeat(per_block, 64).astype(np.float32)}


# 2 --------------------------------------------------------------------------
@cuda.jit
def tile_in_loop_buggy(a, out):
    t = cuda.threadIdx.x
    acc = float32(0)
    for base in range(0, a.shape[0], 64):
        tile = cuda.shared.array(64, float32)   # one array for the block, not a fresh one per trip
        tile[t] = a[base + t]
        cuda.syncthreads()
        acc += tile[63 - t]
    out[t] = acc


@cuda.jit
def tile_in_loop_fixed(a, out):
    t = cuda.threadIdx.x
    acc = float32(0)
    for base in range(0, a.shape[0], 64):
        tile = cuda.shared.array(64, float32)
        tile[t] = a[base + t]
        cuda.syncthreads()
        acc += tile[63 - t]
        cuda.syncthreads()
    out[t] = acc


# 3 --------------------------------------------------------------------------
@cuda.jit
def shift_buggy(a, out):             # launched as shift(x, x): out is a
    i = cuda.grid(1)
    out[i] = a[i - 1] if i > 0 else 0


@cuda.jit
def shift_fixed(a, out):
    i = cuda.grid(1)
    v = a[i - 1] if i > 0 else 0
    cuda.syncthreads()               # every read is done before any write: right even when out is a
    out[i] = v


def _aliased(n):
    x = to_device(ramp(n))
    return x, x


# 4 --------------------------------------------------------------------------
@cuda.jit
def row_lse_buggy(s, lengths, lse):  # one thread per row; an empty row's lse is log(0) = -inf
    r = cuda.grid(1)
    n = lengths[r]
    m = -math.inf
    for j in range(s.shape[1]):
        if j < n:
            m = max(m, s[r, j])
    total = 0.0
    for j in range(s.shape[1]):
        if j < n:
            total += math.exp(s[r, j] - m)
    lse[r] = m + math.log(total)     # 64 threads for 40 rows, and no `if r < n_rows`


@cuda.jit
def row_lse_fixed(s, lengths, lse):
    r = cuda.grid(1)
    if r < lse.shape[0]:
        n = lengths[r]
        m = -math.inf
        for j in range(s.shape[1]):
            if j < n:
                m = max(m, s[r, j])
        total = 0.0
        for j in range(s.shape[1]):
            if j < n:
                total += math.exp(s[r, j] - m)
        lse[r] = m + math.log(total)


def _row_lse_args():
    lengths = np.arange(40, dtype=np.int32) % 9   # rows 0, 9, 18, ... are empty
    return ramp(40 * 8).reshape(40, 8) / 4, lengths, np.zeros(40, np.float32)


def _row_lse_spec(s, lengths, lse):
    want = np.full(40, -np.inf)
    for r, n in enumerate(lengths):
        if n:
            want[r] = np.logaddexp.reduce(s[r, :n].astype(np.float64))
    return {2: want.astype(np.float32)}


# 5 --------------------------------------------------------------------------
@cuda.jit
def row_start_buggy(a, out):         # row r of a (64, 1000) matrix, flattened, starts at r * 1000
    r = cuda.grid(1)
    start = int16(r * 1000)          # 16 bits: wraps to a negative number from row 33 on
    out[r] = a[start + 7]


@cuda.jit
def row_start_fixed(a, out):
    r = cuda.grid(1)
    start = int32(r * 1000)
    out[r] = a[start + 7]


# 6 --------------------------------------------------------------------------
@cuda.jit
def tile_sum_buggy(a, out):          # written for blocks of 64 threads, launched with 32
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    tile[t] = a[cuda.blockIdx.x * 64 + t]
    cuda.syncthreads()
    if t == 0:
        s = float32(0)
        for j in range(64):
            s += tile[j]
        out[cuda.blockIdx.x] = s


@cuda.jit
def tile_sum_fixed(a, out):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    for e in range(t, 64, cuda.blockDim.x):   # every element, whatever the block size
        tile[e] = a[cuda.blockIdx.x * 64 + e]
    cuda.syncthreads()
    if t == 0:
        s = float32(0)
        for j in range(64):
            s += tile[j]
        out[cuda.blockIdx.x] = s


# 7 --------------------------------------------------------------------------
@cuda.jit
def last_block_sum_buggy(a, partial, count, out):   # the CUDA guide's single-pass sum, without its fence
    tile = cuda.shared.array(64, float32)
    last = cuda.shared.array(1, int32)
    t, b = cuda.threadIdx.x, cuda.blockIdx.x
    tile[t] = a[b * 64 + t]
    cuda.syncthreads()
    if t == 0:
        s = float32(0)
        for j in range(64):
            s += tile[j]
        partial[b] = s
        ticket = cuda.atomic.add(count, 0, 1)       # the last block to arrive adds up every partial
        last[0] = ticket == cuda.gridDim.x - 1
    cuda.syncthreads()
    if last[0] and t == 0:
        total = float32(0)
        for j in range(cuda.gridDim.x):
            total += partial[j]
        out[0] = total


@cuda.jit
def last_block_sum_fixed(a, partial, count, out):
    tile = cuda.shared.array(64, float32)
    last = cuda.shared.array(1, int32)
    t, b = cuda.threadIdx.x, cuda.blockIdx.x
    tile[t] = a[b * 64 + t]
    cuda.syncthreads()
    if t == 0:
        s = float32(0)
        for j in range(64):
            s += tile[j]
        partial[b] = s
        cuda.threadfence()                          # partial[b] is visible to every block before the ticket
        ticket = cuda.atomic.add(count, 0, 1)
        last[0] = ticket == cuda.gridDim.x - 1
    cuda.syncthreads()
    if last[0] and t == 0:
        total = float32(0)
        for j in range(cuda.gridDim.x):
            total += partial[j]
        out[0] = total


# 8 --------------------------------------------------------------------------
FULL_MASK = 0xFFFFFFFF


@cuda.jit
def warp_sum_buggy(a, out):          # one sum per warp, by shuffles
    i, lane = cuda.grid(1), cuda.threadIdx.x % 32
    v = a[i]
    offset = 16
    while offset > 0:
        if lane < offset:            # the lanes that skip the shuffle are named in its full mask
            v += cuda.shfl_down_sync(FULL_MASK, v, offset)
        offset //= 2
    if lane == 0:
        out[i // 32] = v


@cuda.jit
def warp_sum_fixed(a, out):
    i, lane = cuda.grid(1), cuda.threadIdx.x % 32
    v = a[i]
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(FULL_MASK, v, offset)   # every lane shuffles; lane 0's sum is the warp's
        offset //= 2
    if lane == 0:
        out[i // 32] = v


CASES = (
    Case("device_function_shared_reused", "a device function with a shared array, called twice, no barrier "
         "at its end", two_totals_buggy, two_totals_fixed, 2, 64,
         lambda: (ramp(128), ramp(128)[::-1].copy(), np.zeros(128, np.float32)), "race", _two_totals_spec),
    Case("shared_array_declared_in_loop", "a shared tile declared inside the tile loop, no barrier at its end",
         tile_in_loop_buggy, tile_in_loop_fixed, 1, 64, lambda: (ramp(256), np.zeros(64, np.float32)), "race",
         lambda a, out: {1: a.reshape(4, 64)[:, ::-1].sum(axis=0, dtype=np.float32)}),
    Case("one_array_passed_twice", "shift(x, x): the output is the input, and threads read what others wrote",
         shift_buggy, shift_fixed, 1, 64, lambda: _aliased(64), "race",
         lambda a, out: {1: np.concatenate([[0], np.asarray(a)[:-1]]).astype(np.float32)}),
    Case("empty_row_log_zero", "per-row lse, some rows empty (log(0) = -inf), 64 threads for 40 rows, no guard",
         row_lse_buggy, row_lse_fixed, 1, 64, _row_lse_args, "out_of_bounds", _row_lse_spec),
    Case("int16_row_offset_wraps", "a row offset r * 1000 kept in an int16, which wraps past 32767",
         row_start_buggy, row_start_fixed, 1, 64, lambda: (ramp(64 * 1000), np.zeros(64, np.float32)),
         "out_of_bounds", lambda a, out: {1: a[np.arange(64) * 1000 + 7]}),
    Case("tile_sized_for_another_block", "a shared tile of 64 loaded one element per thread, launched with "
         "32 threads", tile_sum_buggy, tile_sum_fixed, 2, 32, lambda: (ramp(128), np.zeros(2, np.float32)),
         "uninitialized", lambda a, out: {1: a.reshape(2, 64).sum(axis=1, dtype=np.float32)}),
    Case("last_block_without_fence", "the last block (by an atomic ticket) sums every block's partial, but "
         "no threadfence between writing a partial and taking the ticket", last_block_sum_buggy,
         last_block_sum_fixed, 4, 64,
         lambda: (ramp(256), np.zeros(4, np.float32), np.zeros(1, np.int32), np.zeros(1, np.float32)), "race",
         lambda a, partial, count, out: {1: a.reshape(4, 64).sum(axis=1), 2: np.array([4], np.int32),
                                         3: np.array([a.sum()], np.float32)}),
    Case("shuffle_inside_a_branch", "a warp sum by shfl_down_sync with the full mask, called only by the "
         "lanes that keep a value", warp_sum_buggy, warp_sum_fixed, 2, 64,
         lambda: (ramp(128), np.zeros(4, np.float32)), "barrier",
         lambda a, out: {1: a.reshape(4, 32).sum(axis=1, dtype=np.float32)}),
)
