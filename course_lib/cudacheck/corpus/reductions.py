"""Reductions and scans past the first one: a tree whose barrier sits in the branch, a warp shuffle
with a half-warp mask, a Hillis-Steele scan in one buffer, the last warp reduced without
``syncwarp`` or with one inside its branch, ``activemask`` taken in a tail branch, the fence
placed after the ticket of the last-block pattern."""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32

from .case import Case, ramp

# Each case's expected verdict is its ``expect``, written down before the case was first run.
FULL = 0xFFFFFFFF


# 1 --------------------------------------------------------------------------
@cuda.jit
def tree_branch_buggy(a, out):
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = a[cuda.grid(1)]
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
            cuda.syncthreads()       # only the threads below stride reach it
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


@cuda.jit
def tree_branch_fixed(a, out):
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = a[cuda.grid(1)]
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


# 2 --------------------------------------------------------------------------
@cuda.jit
def half_mask_buggy(a, out):         # a warp sum by shuffles, with the mask of half a warp
    i, lane = cuda.grid(1), cuda.threadIdx.x % 32
    v = a[i]
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(0xFFFF, v, offset)   # names lanes 0-15; all 32 call it
        offset //= 2
    if lane == 0:
        out[i // 32] = v


@cuda.jit
def half_mask_fixed(a, out):
    i, lane = cuda.grid(1), cuda.threadIdx.x % 32
    v = a[i]
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(FULL, v, offset)
        offset //= 2
    if lane == 0:
        out[i // 32] = v


# 3 --------------------------------------------------------------------------
@cuda.jit
def scan_in_place_buggy(a, out):     # inclusive prefix sum of 64 values, Hillis-Steele
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = a[t]
    cuda.syncthreads()
    offset = 1
    while offset < 64:
        if t >= offset:
            s[t] += s[t - offset]    # one buffer: thread t - offset may already have added its step
        cuda.syncthreads()
        offset *= 2
    out[t] = s[t]


@cuda.jit
def scan_in_place_fixed(a, out):
    s = cuda.shared.array((2, 64), float32)   # double buffered: read one, write the other
    t = cuda.threadIdx.x
    s[0, t] = a[t]
    cuda.syncthreads()
    src = 0
    offset = 1
    while offset < 64:
        s[1 - src, t] = s[src, t] + s[src, t - offset] if t >= offset else s[src, t]
        cuda.syncthreads()
        src = 1 - src
        offset *= 2
    out[t] = s[src, t]


# 4 --------------------------------------------------------------------------
@cuda.jit
def last_warp_buggy(a, out):         # 64 values: one halving step by the block, the rest by the first warp
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = a[t]
    cuda.syncthreads()
    if t < 32:
        s[t] += s[t + 32]
        for offset in (16, 8, 4, 2, 1):
            s[t] += s[t + offset]    # "a warp runs in lockstep": not since Volta, without syncwarp
    if t == 0:
        out[0] = s[0]


@cuda.jit
def last_warp_fixed(a, out):
    s = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    s[t] = a[t]
    cuda.syncthreads()
    if t < 32:
        s[t] += s[t + 32]
        cuda.syncwarp()
        for offset in (16, 8, 4, 2, 1):
            v = s[t + offset]
            cuda.syncwarp()          # every lane has read before any lane writes
            s[t] += v
            cuda.syncwarp()          # every lane has written before the next step reads
    if t == 0:
        out[0] = s[0]


# 5 --------------------------------------------------------------------------
@cuda.jit
def syncwarp_branch_buggy(a, out):   # the warp's tree with syncwarp, but only the lanes that add reach it
    s = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    s[t] = a[t]
    cuda.syncwarp()
    offset = 16
    while offset > 0:
        if t < offset:
            v = s[t + offset]
            cuda.syncwarp()          # the full mask names lanes that skipped the branch
            s[t] += v
        cuda.syncwarp()
        offset //= 2
    if t == 0:
        out[0] = s[0]


@cuda.jit
def syncwarp_branch_fixed(a, out):
    s = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    s[t] = a[t]
    cuda.syncwarp()
    offset = 16
    while offset > 0:
        v = s[t + offset] if t < offset else float32(0)
        cuda.syncwarp()
        if t < offset:
            s[t] += v
        cuda.syncwarp()
        offset //= 2
    if t == 0:
        out[0] = s[0]


# 6 --------------------------------------------------------------------------
@cuda.jit
def active_tail_buggy(a, out):       # per-warp sums of n = 40 values, 64 threads
    i, lane = cuda.grid(1), cuda.threadIdx.x % 32
    if i < a.shape[0]:
        v = a[i]
        mask = cuda.activemask()     # lanes 0-7 of the second warp: lane 0 still reads lanes 16, 8...
        for offset in (16, 8, 4, 2, 1):
            v += cuda.shfl_down_sync(mask, v, offset)
        if lane == 0:
            out[i // 32] = v


@cuda.jit
def active_tail_fixed(a, out):
    i, lane = cuda.grid(1), cuda.threadIdx.x % 32
    v = a[i] if i < a.shape[0] else float32(0)   # every lane shuffles; past the tail it adds 0
    for offset in (16, 8, 4, 2, 1):
        v += cuda.shfl_down_sync(FULL, v, offset)
    if lane == 0:
        out[i // 32] = v


# 7 --------------------------------------------------------------------------
@cuda.jit
def fence_after_ticket_buggy(a, partial, count, out):   # the last-block sum, its fence after the atomic
    tile = cuda.shared.array(32, float32)
    last = cuda.shared.array(1, int32)
    t, b = cuda.threadIdx.x, cuda.blockIdx.x
    tile[t] = a[b * 32 + t]
    cuda.syncthreads()
    if t == 0:
        s = float32(0)
        for j in range(32):
            s += tile[j]
        partial[b] = s
        ticket = cuda.atomic.add(count, 0, 1)
        cuda.threadfence()                          # too late: the ticket may be seen before partial[b]
        last[0] = ticket == cuda.gridDim.x - 1
    cuda.syncthreads()
    if last[0] and t == 0:
        total = float32(0)
        for j in range(cuda.gridDim.x):
            total += partial[j]
        out[0] = total


@cuda.jit
def fence_after_ticket_fixed(a, partial, count, out):
    tile = cuda.shared.array(32, float32)
    last = cuda.shared.array(1, int32)
    t, b = cuda.threadIdx.x, cuda.blockIdx.x
    tile[t] = a[b * 32 + t]
    cuda.syncthreads()
    if t == 0:
        s = float32(0)
        for j in range(32):
            s += tile[j]
        partial[b] = s
        cuda.threadfence()
        ticket = cuda.atomic.add(count, 0, 1)
        last[0] = ticket == cuda.gridDim.x - 1
    cuda.syncthreads()
    if last[0] and t == 0:
        total = float32(0)
        for j in range(cuda.gridDim.x):
            total += partial[j]
        out[0] = total


CASES = (
    Case("tree_barrier_inside_branch", "the halving loop's syncthreads inside `if t < stride`",
         tree_branch_buggy, tree_branch_fixed, 2, 64, lambda: (ramp(128), np.zeros(2, np.float32)), "barrier",
         lambda a, out: {1: a.reshape(2, 64).sum(axis=1, dtype=np.float32)}),
    Case("shuffle_half_warp_mask", "shfl_down_sync(0xFFFF, ...) called by all 32 lanes of a warp sum",
         half_mask_buggy, half_mask_fixed, 1, 64, lambda: (ramp(64), np.zeros(2, np.float32)), "barrier",
         lambda a, out: {1: a.reshape(2, 32).sum(axis=1, dtype=np.float32)}),
    Case("scan_without_double_buffer", "a Hillis-Steele scan reading and writing one shared buffer in a step",
         scan_in_place_buggy, scan_in_place_fixed, 1, 64, lambda: (ramp(64), np.zeros(64, np.float32)), "race",
         lambda a, out: {1: np.cumsum(a).astype(np.float32)}),
    Case("last_warp_without_syncwarp", "the last warp's steps of a tree sum with no syncwarp, as if lanes "
         "ran in lockstep", last_warp_buggy, last_warp_fixed, 1, 64,
         lambda: (ramp(64), np.zeros(1, np.float32)), "race", lambda a, out: {1: np.array([a.sum()], np.float32)}),
    Case("syncwarp_inside_branch", "a warp tree with cuda.syncwarp() inside `if t < offset`",
         syncwarp_branch_buggy, syncwarp_branch_fixed, 1, 32, lambda: (ramp(32), np.zeros(1, np.float32)),
         "barrier", lambda a, out: {1: np.array([a.sum()], np.float32)}),
    Case("activemask_in_tail_branch", "shuffles with cuda.activemask() taken inside `if i < n`, n = 40 of 64",
         active_tail_buggy, active_tail_fixed, 1, 64, lambda: (ramp(40), np.zeros(2, np.float32)),
         "uninitialized", lambda a, out: {1: np.array([a[:32].sum(), a[32:].sum()], np.float32)}),
    Case("fence_after_the_ticket", "the last-block sum with its threadfence after the atomic ticket, not "
         "before it", fence_after_ticket_buggy, fence_after_ticket_fixed, 4, 32,
         lambda: (ramp(128), np.zeros(4, np.float32), np.zeros(1, np.int32), np.zeros(1, np.float32)), "race",
         lambda a, partial, count, out: {1: a.reshape(4, 32).sum(axis=1), 2: np.array([4], np.int32),
                                         3: np.array([a.sum()], np.float32)}),
)
