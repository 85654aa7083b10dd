"""Double buffering for real: this CPU stands in for an NPU.

The parts of the schedule model (``edge.schedule``), each played by something real:

    DRAM           ``PacedDRAM``: arrays reached only through a copy that takes
                   setup + bytes / bandwidth seconds (it copies, then sleeps out the rest
                   of that time, so the "DMA" costs wall time but almost no CPU)
    scratchpad     ``buffers`` preallocated K / V buffers of one key tile each
    DMA engine     a loader thread: it takes a free buffer, fills it, hands it over
    compute unit   this thread, running ``attend_tile``: one query tile against one key
                   tile with the online softmax, compiled with ``numba.njit(nogil=True)``
                   so it runs while the loader thread runs

``run_pipeline`` streams every key tile of one query tile through that
machine and returns the output and lse (equal to the reference), and the
timeline it took.  ``measure_parts`` times a load and a compute alone, which is
what the model needs to predict the pipeline.  The benchmark
``benchmarks/edge_dma.py`` measures 1, 2 and 3 buffers beside the prediction.
"""
from __future__ import annotations

import math
import queue
import threading
import time

import numba
import numpy as np

from ..core import rules
from .schedule import COMPUTE, LOAD, STORE, Step, Timeline

_rescale = numba.njit(rules.rescale)
_shift_of = numba.njit(rules.shift_of)


class PacedDRAM:
    """Slow memory: ``copy`` moves bytes at ``bandwidth`` B/s after ``setup`` seconds, like a DMA transfer."""

    def __init__(self, bandwidth: float, setup: float = 0.0):
        if not bandwidth > 0 or setup < 0:
            raise ValueError(f"bandwidth must be > 0 and setup >= 0, got {bandwidth!r}, {setup!r}")
        self.bandwidth, self.setup = float(bandwidth), float(setup)

    def seconds(self, nbytes: int) -> float:
        return self.setup + nbytes / self.bandwidth

    def copy(self, dst, src):
        """``dst[...] = src``, taking ``seconds(src.nbytes)`` of wall time (more if the copy itself is slower)."""
        deadline = time.perf_counter() + self.seconds(src.nbytes)
        np.copyto(dst, src)
        left = deadline - time.perf_counter()
        if left > 0:
            time.sleep(left)


@numba.njit(nogil=True, cache=True)
def attend_tile(q, k, v, n_keys, scale, m, l, acc):
    """One key tile (its first ``n_keys`` rows) into the running (m, l, acc) of the query tile ``q``."""
    br, d = q.shape
    dv = v.shape[1]
    s = np.empty(n_keys, np.float32)
    for r in range(br):
        m_new = m[r]
        for j in range(n_keys):
            dot = np.float32(0.0)
            for x in range(d):
                dot += q[r, x] * k[j, x]
            s[j] = dot * scale
            if s[j] > m_new:
                m_new = s[j]
        alpha = _rescale(m[r], m_new)
        shift = _shift_of(m_new)
        row_sum = np.float32(0.0)
        for x in range(dv):
            acc[r, x] *= alpha
        for j in range(n_keys):
            p = np.float32(math.exp(s[j] - shift))
            row_sum += p
            for x in range(dv):
                acc[r, x] += p * v[j, x]
        l[r] = alpha * l[r] + row_sum
        m[r] = m_new


def _finish(m, l, acc):
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(l[:, None] > 0, acc / np.where(l > 0, l, 1)[:, None], 0.0).astype(np.float32)
        lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf).astype(np.float32)
    return out, lse


def _check(q, k, v, block_k, buffers):
    if q.dtype != np.float32 or k.dtype != np.float32 or v.dtype != np.float32:
        raise TypeError("the stand-in NPU works in float32: pass float32 q, k, v")
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2 or k.shape[1] != q.shape[1] or v.shape[0] != k.shape[0]:
        raise ValueError(f"q (Br, D), k (Nk, D), v (Nk, Dv) expected, got {q.shape}, {k.shape}, {v.shape}")
    if block_k < 1 or buffers < 1:
        raise ValueError(f"block_k and buffers must be >= 1, got {block_k}, {buffers}")


def run_pipeline(q, k, v, *, block_k: int, buffers: int, dram: PacedDRAM, scale: float | None = None):
    """One query tile ``q`` (Br, D) against ``k``, ``v`` in paced DRAM, with ``buffers`` K / V buffers.

    Returns ``(out, lse, timeline)``: out (Br, Dv) and lse (Br,) in float32, and the measured
    timeline (seconds from the start) in the model's terms.
    """
    _check(q, k, v, block_k, buffers)
    (br, d), (nk, dv) = q.shape, v.shape
    scale = np.float32(1 / math.sqrt(d) if scale is None else scale)
    n_tiles = math.ceil(nk / block_k)
    kbuf = np.zeros((buffers, block_k, d), np.float32)   # the scratchpad, allocated before the clock starts
    vbuf = np.zeros((buffers, block_k, dv), np.float32)
    qbuf = np.zeros_like(q)
    m, l, acc = np.full(br, -np.inf, np.float32), np.zeros(br, np.float32), np.zeros((br, dv), np.float32)
    free, filled, steps = queue.Queue(), queue.Queue(), []
    for b in range(buffers):
        free.put(b)
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0

    def dma_engine():
        for j in range(n_tiles):
            b = free.get()                            # waits for the compute of tile j - buffers
            start, c0 = clock(), j * block_k
            n = min(nk, c0 + block_k) - c0
            dram.copy(kbuf[b, :n], k[c0:c0 + n])
            dram.copy(vbuf[b, :n], v[c0:c0 + n])
            steps.append(Step("DMA 0", LOAD, j, b, start, clock()))
            filled.put((j, b, n))

    start = clock()
    dram.copy(qbuf, q)                                # the prologue: Q before any key tile
    steps.append(Step("DMA 0", LOAD, -1, -1, start, clock()))
    loader = threading.Thread(target=dma_engine, daemon=True)
    loader.start()
    for _ in range(n_tiles):
        j, b, n = filled.get()
        start = clock()
        attend_tile(qbuf, kbuf[b], vbuf[b], n, scale, m, l, acc)
        steps.append(Step("compute 0", COMPUTE, j, b, start, clock()))
        free.put(b)
    loader.join()
    out, lse = _finish(m, l, acc)
    start, stored = clock(), np.empty_like(out)
    dram.copy(stored, out)                            # the epilogue: O back to DRAM
    steps.append(Step("DMA 0", STORE, -1, -1, start, clock()))
    return stored, lse, Timeline(buffers, tuple(steps))


def measure_parts(q, k, v, *, block_k: int, dram: PacedDRAM, scale: float | None = None) -> dict:
    """Seconds of one key tile's load (K and V), one tile's compute, the Q load and the O store, each alone.

    Each is the median over every key tile of one pass, so the model is fed what the
    machine did just now (a shared machine changes from minute to minute).
    """
    _check(q, k, v, block_k, 1)
    (br, d), (nk, dv) = q.shape, v.shape
    scale = np.float32(1 / math.sqrt(d) if scale is None else scale)
    kbuf, vbuf = np.zeros((block_k, d), np.float32), np.zeros((block_k, dv), np.float32)
    m, l, acc = np.full(br, -np.inf, np.float32), np.zeros(br, np.float32), np.zeros((br, dv), np.float32)
    loads, computes = [], []
    for c0 in range(0, nk, block_k):
        n = min(nk, c0 + block_k) - c0
        start = time.perf_counter()
        dram.copy(kbuf[:n], k[c0:c0 + n])
        dram.copy(vbuf[:n], v[c0:c0 + n])
        loads.append(time.perf_counter() - start)
    kbuf[:], vbuf[:] = k[:block_k], v[:block_k]
    for c0 in range(0, nk, block_k):
        start = time.perf_counter()
        attend_tile(q, kbuf, vbuf, min(nk, c0 + block_k) - c0, scale, m, l, acc)
        computes.append(time.perf_counter() - start)
    qbuf, out = np.empty_like(q), np.empty((br, dv), np.float32)
    start = time.perf_counter()
    dram.copy(qbuf, q)
    q_load = time.perf_counter() - start
    start = time.perf_counter()
    dram.copy(out, acc)
    o_store = time.perf_counter() - start
    return dict(load_s=float(np.median(loads)), compute_s=float(np.median(computes)), q_load_s=q_load,
                o_store_s=o_store, key_tiles=len(loads))
