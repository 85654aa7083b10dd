"""The tensor-core instructions in numba's simulator: ``mma``'s, emulated in Python.

The simulator runs every CUDA thread as a Python thread and cannot run inline PTX, so a kernel written
with ``mma.mma_f16`` could only be tried on a GPU.  Here each instruction a kernel uses is written again
as the PTX ISA defines it, from the same fragment tables (``mma.a_word``, ``b_word``, ``c_elem``):

- ``mma_f16`` / ``mma_bf16``: the warp's 32 lanes trade their registers at a barrier (``trade``), each
  rebuilds A (16 x 16 halves), B (8 columns of 16) and C from the tables, and keeps the four floats of
  D = A B + C that ``c_elem`` gives it (products exact, sums in float64, rounded once to float32);
- ``pack_f16`` / ``pack_bf16``, ``low_halves`` / ``high_halves``, ``word_of`` / ``float_of``: bit moves on
  numpy scalars (``cvt.rn`` rounds to nearest even, as numpy's and ml_dtypes' conversions do).

A kernel picks ``mma`` on a GPU and this module in the simulator (``ops``); everything else it does is
ordinary Numba CUDA, which the simulator runs as it is.  So the kernel's fragment bookkeeping, masks,
tails and GQA sums are checked on a machine without a GPU; what the hardware itself does (its
accumulation order, the real instruction's operand layout) is checked only on one.  Slow (two barriers
of 32 Python threads an mma): small shapes only.
"""
from __future__ import annotations

import threading

import numpy as np

from ...core import rules
from .mma import a_word, b_word, c_elem

_LOCK = threading.Lock()
_WARPS = {}      # warp of the block running now -> (its barrier, a slot per lane)


def trade(value):
    """(every lane's ``value``, by lane; this lane): one round at the warp's barrier.  Blocks run one after
    another in the simulator, so a warp's barrier serves the same warp of every block."""
    me = threading.current_thread()
    lane, warp = me.thread_id % 32, me.thread_id // 32
    with _LOCK:
        if warp not in _WARPS or _WARPS[warp][0].broken:      # first use, or a launch that failed mid-round
            _WARPS[warp] = (threading.Barrier(32), [None] * 32)
        barrier, slots = _WARPS[warp]
    slots[lane] = value
    barrier.wait(timeout=300)
    values = list(slots)
    barrier.wait(timeout=300)            # nobody's next value overwrites a slot before every lane has read
    return values, lane


def halves(word, dtype):
    """A word's two halves (lower, upper) as float64."""
    return np.array([word], np.uint32).view(np.uint16).view(dtype).astype(np.float64)


def _mma(dtype):
    def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        regs, lane = trade((a0, a1, a2, a3, b0, b1))
        A, B = np.zeros((16, 16)), np.zeros((8, 16))
        for other, r in enumerate(regs):
            for reg in range(4):
                row, w = a_word(other, reg)
                A[row, 2 * w:2 * w + 2] = halves(r[reg], dtype)
            for reg in range(2):
                n, w = b_word(other, reg)
                B[n, 2 * w:2 * w + 2] = halves(r[4 + reg], dtype)
        product = A @ B.T
        c = (c0, c1, c2, c3)
        return tuple(np.float32(product[c_elem(lane, reg)] + np.float64(c[reg])) for reg in range(4))
    return mma


mma_f16 = _mma(np.float16)
mma_bf16 = _mma(rules.ml_dtypes.bfloat16)


def _pack(dtype):
    def pack(lo, hi):
        bits = np.array([lo, hi], np.float32).astype(dtype).view(np.uint16).astype(np.uint32)
        return np.uint32(bits[0] | (bits[1] << 16))
    return pack


pack_f16 = _pack(np.float16)
pack_bf16 = _pack(rules.ml_dtypes.bfloat16)


def low_halves(a, b):
    """``prmt.b32 0x5410``: a's lower half below, b's lower half above."""
    return np.uint32((int(a) & 0xFFFF) | ((int(b) & 0xFFFF) << 16))


def high_halves(a, b):
    """``prmt.b32 0x7632``: a's upper half below, b's upper half above."""
    return np.uint32((int(a) >> 16) | (int(b) & 0xFFFF0000))


def word_of(x):
    return np.array([x], np.float32).view(np.uint32)[0]


def float_of(w):
    return np.array([w], np.uint32).view(np.float32)[0]
