"""The pieces of a tiled attention kernel a learner writes one at a time, each with the bug it
invites: a row max and sum reduced in shared memory, a P V tile update, a varlen offset from
``cu_seqlens``, a causal mask tile, a row normalized by its sum (0 for an empty row)."""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .case import Case, ramp

# Each case's expected verdict is its ``expect``, written down before the case was first run.


# 1 --------------------------------------------------------------------------
@cuda.jit
def row_stats_buggy(s, m_out, l_out):   # one block per row of 64 scores: its max, then sum of exp(s - max)
    buf = cuda.shared.array(64, float32)
    t, r = cuda.threadIdx.x, cuda.blockIdx.x
    x = s[r, t]
    buf[t] = x
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if t < stride:
            buf[t] = max(buf[t], buf[t + stride])
        cuda.syncthreads()
        stride //= 2
    buf[t] = math.exp(x - buf[0])    # the buffer is reused while other threads still read the max in buf[0]
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if t < stride:
            buf[t] += buf[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        l_out[r] = buf[0]


@cuda.jit
def row_stats_fixed(s, m_out, l_out):
    buf = cuda.shared.array(64, float32)
    t, r = cuda.threadIdx.x, cuda.blockIdx.x
    x = s[r, t]
    buf[t] = x
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if t < stride:
            buf[t] = max(buf[t], buf[t + stride])
        cuda.syncthreads()
        stride //= 2
    m = buf[0]
    if t == 0:
        m_out[r] = m
    cuda.syncthreads()               # every thread holds the max before the buffer is reused
    buf[t] = math.exp(x - m)
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if t < stride:
            buf[t] += buf[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        l_out[r] = buf[0]


def _row_stats_spec(s, m_out, l_out):
    m = s.max(axis=1)
    return {1: m, 2: np.exp(s - m[:, None]).sum(axis=1).astype(np.float32)}


# 2 --------------------------------------------------------------------------
@cuda.jit
def pv_update_buggy(p, v, o):        # o = p @ v, one thread per query row, V staged 16 keys at a time
    vt = cuda.shared.array((16, 8), float32)
    t = cuda.threadIdx.x
    acc = cuda.local.array(8, float32)
    for d in range(8):
        acc[d] = 0
    for k0 in range(0, v.shape[0], 16):
        for e in range(t, 16 * 8, cuda.blockDim.x):
            vt[e // 8, e % 8] = v[k0 + e // 8, e % 8]
        cuda.syncthreads()
        for j in range(16):
            for d in range(8):
                acc[d] += p[t, k0 + j] * vt[j, d]
    for d in range(8):                # the next V tile overwrites vt while slower threads still read it
        o[t, d] = acc[d]


@cuda.jit
def pv_update_fixed(p, v, o):
    vt = cuda.shared.array((16, 8), float32)
    t = cuda.threadIdx.x
    acc = cuda.local.array(8, float32)
    for d in range(8):
        acc[d] = 0
    for k0 in range(0, v.shape[0], 16):
        for e in range(t, 16 * 8, cuda.blockDim.x):
            vt[e // 8, e % 8] = v[k0 + e // 8, e % 8]
        cuda.syncthreads()
        for j in range(16):
            for d in range(8):
                acc[d] += p[t, k0 + j] * vt[j, d]
        cuda.syncthreads()
    for d in range(8):
        o[t, d] = acc[d]


def _pv_args():
    return ramp(32 * 48).reshape(32, 48) / 8, ramp(48 * 8).reshape(48, 8) / 4, np.zeros((32, 8), np.float32)


# 3 --------------------------------------------------------------------------
@cuda.jit
def varlen_scale_buggy(x, cu_seqlens, out):   # block b: sequence b, its rows cu_seqlens[b] .. cu_seqlens[b + 1]
    b, t = cuda.blockIdx.x, cuda.threadIdx.x
    start = cu_seqlens[b + 1]        # the next sequence's start: off by one
    if t < cu_seqlens[b + 1] - cu_seqlens[b]:
        out[start + t] = 2 * x[start + t]


@cuda.jit
def varlen_scale_fixed(x, cu_seqlens, out):
    b, t = cuda.blockIdx.x, cuda.threadIdx.x
    start = cu_seqlens[b]
    if t < cu_seqlens[b + 1] - start:
        out[start + t] = 2 * x[start + t]


# 4 --------------------------------------------------------------------------
@cuda.jit
def causal_tile_buggy(q, k, m_out):  # S = q k^T on a 16 x 16 tile, causal: row i sees keys j <= i
    s = cuda.shared.array((16, 16), float32)
    i = cuda.threadIdx.x
    for j in range(16):
        if j <= i:
            s[i, j] = q[i] * k[j]    # the masked scores are skipped, never set to -inf
    cuda.syncthreads()
    m = -math.inf
    for j in range(16):
        m = max(m, s[i, j])
    m_out[i] = m


@cuda.jit
def causal_tile_fixed(q, k, m_out):
    s = cuda.shared.array((16, 16), float32)
    i = cuda.threadIdx.x
    for j in range(16):
        s[i, j] = q[i] * k[j] if j <= i else -math.inf
    cuda.syncthreads()
    m = -math.inf
    for j in range(16):
        m = max(m, s[i, j])
    m_out[i] = m


def _causal_spec(q, k, m_out):
    s = np.where(np.tril(np.ones((16, 16), bool)), q[:, None] * k[None, :], -np.inf)
    return {2: s.max(axis=1).astype(np.float32)}


# 5 --------------------------------------------------------------------------
@cuda.jit
def pv_single_tile_buggy(p, v, o):   # o = p @ v for one tile: 16 keys, head dim 8
    vt = cuda.shared.array((16, 8), float32)
    t = cuda.threadIdx.x
    for e in range(t, 16 * 8, cuda.blockDim.x):
        vt[e // 8, e % 8] = v[e // 8, e % 8]
    cuda.syncthreads()
    for d in range(8):
        acc = float32(0)
        for j in range(16):
            acc += p[t, j] * vt[d, j]   # indexed (d, j) on a (keys, dim) tile: j runs past the 8 columns
        o[t, d] = acc


@cuda.jit
def pv_single_tile_fixed(p, v, o):
    vt = cuda.shared.array((16, 8), float32)
    t = cuda.threadIdx.x
    for e in range(t, 16 * 8, cuda.blockDim.x):
        vt[e // 8, e % 8] = v[e // 8, e % 8]
    cuda.syncthreads()
    for d in range(8):
        acc = float32(0)
        for j in range(16):
            acc += p[t, j] * vt[j, d]
        o[t, d] = acc


# 6 --------------------------------------------------------------------------
@cuda.jit
def normalize_rows_buggy(s, lengths, o):   # o[r] = the softmax-weighted mean of row r's first n positions
    r = cuda.grid(1)
    n = lengths[r]
    m = -math.inf
    for j in range(n):
        m = max(m, s[r, j])
    l = 0.0
    acc = 0.0
    for j in range(n):
        p = math.exp(s[r, j] - m)
        l += p
        acc += p * j
    inv_l = 1.0 / l                  # an empty row: 1 / 0 = inf on a GPU, used only where n > 0
    o[r] = acc * inv_l if n > 0 else 0.0   # 64 threads for 40 rows, and no `if r < n_rows`


@cuda.jit
def normalize_rows_fixed(s, lengths, o):
    r = cuda.grid(1)
    if r < o.shape[0]:
        n = lengths[r]
        m = -math.inf
        for j in range(n):
            m = max(m, s[r, j])
        l = 0.0
        acc = 0.0
        for j in range(n):
            p = math.exp(s[r, j] - m)
            l += p
            acc += p * j
        inv_l = 1.0 / l
        o[r] = acc * inv_l if n > 0 else 0.0


def _normalize_args():
    return ramp(40 * 8).reshape(40, 8) / 4, np.arange(40, dtype=np.int32) % 9 % 8, np.zeros(40, np.float32)


def _normalize_spec(s, lengths, o):
    want = np.zeros(40)
    for r, n in enumerate(lengths):
        if n:
            p = np.exp(s[r, :n].astype(np.float64) - s[r, :n].max())
            want[r] = (p * np.arange(n)).sum() / p.sum()
    return {2: want.astype(np.float32)}


CASES = (
    Case("row_max_buffer_reused_too_soon", "a row's max and sum of exp in one shared buffer: it is "
         "overwritten with exp(x - max) while other threads still read the max from it",
         row_stats_buggy, row_stats_fixed, 2, 64,
         lambda: (ramp(128).reshape(2, 64) / 4, np.zeros(2, np.float32), np.zeros(2, np.float32)), "race",
         _row_stats_spec),
    Case("pv_tile_no_end_barrier", "the P V update stages V tiles in shared memory, no barrier at the end "
         "of the key loop", pv_update_buggy, pv_update_fixed, 1, 32, _pv_args, "race",
         lambda p, v, o: {2: (p @ v).astype(np.float32)}),
    Case("varlen_start_off_by_one", "a sequence's rows start at cu_seqlens[b + 1], the next one's start",
         varlen_scale_buggy, varlen_scale_fixed, 3, 16,
         lambda: (ramp(24), np.array([0, 5, 17, 24], np.int32), np.zeros(24, np.float32)), "out_of_bounds",
         lambda x, cu, out: {2: 2 * x}),
    Case("causal_tile_masked_scores_unwritten", "a causal score tile whose masked entries are skipped, not "
         "set to -inf, and then read by the row max", causal_tile_buggy, causal_tile_fixed, 1, 16,
         lambda: (ramp(16) / 2, ramp(16)[::-1] / 3, np.zeros(16, np.float32)), "uninitialized", _causal_spec),
    Case("pv_tile_indexed_transposed", "the (keys, dim) V tile read as vt[d, j]: j runs past its 8 columns",
         pv_single_tile_buggy, pv_single_tile_fixed, 1, 16,
         lambda: (ramp(16 * 16).reshape(16, 16) / 8, ramp(16 * 8).reshape(16, 8) / 4,
                  np.zeros((16, 8), np.float32)), "out_of_bounds",
         lambda p, v, o: {2: (p @ v).astype(np.float32)}),
    Case("normalize_rows_no_guard", "a softmax-weighted mean per row, 1 / l = inf for the empty rows (unused "
         "there), 64 threads for 40 rows and no guard", normalize_rows_buggy, normalize_rows_fixed, 1, 64,
         _normalize_args, "out_of_bounds", _normalize_spec),
)
