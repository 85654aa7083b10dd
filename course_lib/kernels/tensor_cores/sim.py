"""The tensor-core instructions in numba's simulator: ``mma``'s, emulated in Python.

The simulator runs every CUDA thread as a Python thread and cannot run inline PTX, so a kernel written
with ``mma.mma_f16`` could only be tried on a GPU.  Here each instruction a kernel uses is written again
as the PTX ISA defines it, from the same fragment tables (``mma.a_word``, ``b_word``, ``c_elem``):

- ``mma_f16`` / ``mma_bf16``: the warp's 32 lanes trade their registers at a barrier (``trade``), each
  rebuilds A (16 x 16 halves), B (8 columns of 16) and C from the tables, and keeps the four floats of
  D = A B + C that ``c_elem`` gives it (products exact, sums in float64, rounded once to float32);
- ``mma_tf32``: the same for m16n8k8 on tf32 words (A 16 x 8, B 8 columns of 8), each word read as the
  hardware reads it, its lower 13 bits ignored;
- ``ldmatrix_x4`` / ``ldmatrix_x4_trans``: the lanes trade the row addresses they give, and each reads
  its words of the four 8 x 8 matrices (``mma.ldmatrix_word``) from the shared tile;
- ``cp_async16``: the 16 bytes copied at once, zeros past ``nbytes``; ``commit`` / ``wait`` then have
  nothing left to wait for (a copy landed early is one a correct kernel may see: it waits before it reads);
- ``shfl_xor_sync``: a trade, each lane taking the value of lane ``lane ^ mask``;
- ``pack_f16`` / ``pack_bf16``, ``to_tf32`` / ``round_tf32``, ``low_halves`` / ``high_halves``,
  ``word_of`` / ``float_of``, ``max_nan``: bit moves and rounding on numpy scalars (``cvt.rn`` rounds to
  nearest even, as numpy's and ml_dtypes' conversions do; ``cvt.rna`` to nearest, ties away from zero).

A kernel picks ``mma`` on a GPU and this module in the simulator (``ops``); everything else it does is
ordinary Numba CUDA, which the simulator runs as it is.  So the kernel's fragment bookkeeping, masks,
tails and GQA sums are checked on a machine without a GPU; what the hardware itself does (its
accumulation order, the real instruction's operand layout) is checked only on one.  Slow (a barrier of 32
Python threads an mma): small shapes only.
"""
from __future__ import annotations

import threading

import numpy as np

from ...core import rules
from .mma import a_word, b_word, c_elem, ldmatrix_row, ldmatrix_word

a_word_gpu, b_word_gpu, c_elem_gpu = a_word, b_word, c_elem   # plain functions: the simulator calls them as they are
max_nan = rules.max_nan

_LOCK = threading.Lock()
_WARPS = {}      # warp of the block running now -> (its barrier, two rounds' slots, a slot per lane)


def trade(value):
    """(every lane's ``value``, by lane; this lane): one round at the warp's barrier.  Rounds alternate
    between two sets of slots, so one barrier a round suffices: a lane writes a set again only after the
    next round's barrier, which every lane reaches after it read this round's.  Blocks run one after
    another in the simulator, so a warp's barrier serves the same warp of every block."""
    me = threading.current_thread()
    lane, warp = me.thread_id % 32, me.thread_id // 32
    with _LOCK:
        if warp not in _WARPS or _WARPS[warp][0].broken:      # first use, or a launch that failed mid-round
            _WARPS[warp] = (threading.Barrier(32), ([None] * 32, [None] * 32))
        barrier, rounds = _WARPS[warp]
    parity = getattr(me, "trade_parity", 0)
    me.trade_parity = parity ^ 1
    slots = rounds[parity]
    slots[lane] = value
    barrier.wait(timeout=300)
    return list(slots), lane


# where each lane's registers go, as index arrays: A's (row, word) of registers 0-3, B's (n, word) of 0-1
_A_AT = tuple(np.array([[a_word(lane, reg)[i] for reg in range(4)] for lane in range(32)]) for i in (0, 1))
_B_AT = tuple(np.array([[b_word(lane, reg)[i] for reg in range(2)] for lane in range(32)]) for i in (0, 1))


def _operands(regs):
    """The warp's registers (32 lanes x (4 A words, 2 B words)) placed by the fragment tables: A (16 rows x
    8 words) and B (8 columns x 8 words), as words (two halves each, or one tf32)."""
    regs = np.array(regs, dtype=np.uint32)
    A, B = np.zeros((16, 8), np.uint32), np.zeros((8, 8), np.uint32)
    A[_A_AT] = regs[:, :4]
    B[_B_AT] = regs[:, 4:]
    return A, B


def _mma(dtype):
    def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        regs, lane = trade((a0, a1, a2, a3, b0, b1))
        A, B = (x.view(np.uint16).view(dtype).astype(np.float64) for x in _operands(regs))  # halves: lower first
        product = A @ B.T
        c = (c0, c1, c2, c3)
        return tuple(np.float32(product[c_elem(lane, reg)] + np.float64(c[reg])) for reg in range(4))
    return mma


mma_f16 = _mma(np.float16)
mma_bf16 = _mma(rules.ml_dtypes.bfloat16)

TF32_BITS = 0xFFFFE000      # what an mma on tf32 reads of a word: sign, exponent, 10 mantissa bits


def mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """m16n8k8 on tf32: A (16 x 8 words), B (8 columns n of 8 words k), placed by the same tables."""
    regs, lane = trade((a0, a1, a2, a3, b0, b1))
    A, B = ((x & np.uint32(TF32_BITS)).view(np.float32).astype(np.float64) for x in _operands(regs))
    product = A @ B.T
    c = (c0, c1, c2, c3)
    return tuple(np.float32(product[c_elem(lane, reg)] + np.float64(c[reg])) for reg in range(4))


def round_tf32(w):
    """``mma.round_tf32``'s two integer instructions: add 4096, clear the lower 13 bits (32-bit wrap)."""
    return np.uint32(((int(w) + 4096) & 0xFFFFFFFF) & TF32_BITS)


def to_tf32(x):
    """``cvt.rna.tf32.f32``: x to its nearest tf32, ties away from zero, as a word; a NaN stays a NaN."""
    if np.isnan(x):
        return np.uint32(0x7FFFFFFF)
    return round_tf32(word_of(x))


def shfl_xor_sync(mask, value, lane_mask):
    """``shfl.sync.bfly``: every lane of the warp takes part (mask = all lanes, as the kernels pass)."""
    values, lane = trade(value)
    return values[lane ^ lane_mask]


_ROW_GIVER = {ldmatrix_row(lane): lane for lane in range(32)}   # (matrix, row) -> the lane that gives its address


def _ldmatrix(trans):
    def ldmatrix(tile, index):
        """Four 8 x 8 matrices of halves: lane i gave the word where row ``ldmatrix_row(i)`` starts."""
        starts, lane = trade(int(index))
        words = np.asarray(tile).reshape(-1)
        regs = []
        for matrix in range(4):
            start = [starts[_ROW_GIVER[matrix, r]] for r in range(8)]
            if not trans:
                row, w = ldmatrix_word(lane, matrix)
                regs.append(np.uint32(words[start[row] + w]))
                continue
            row0, row1, col = ldmatrix_word(lane, matrix, trans=True)
            lo, hi = (int(words[start[r] + col // 2]) >> (16 * (col % 2)) & 0xFFFF for r in (row0, row1))
            regs.append(np.uint32(lo | (hi << 16)))
        return tuple(regs)
    return ldmatrix


ldmatrix_x4 = _ldmatrix(False)
ldmatrix_x4_trans = _ldmatrix(True)


def cp_async16(tile, index, src, word, nbytes):
    """16 bytes (4 words) from word ``word`` of ``src``, its words counted flat, to ``tile[index:index + 4]``;
    only the first ``nbytes`` read, the rest zeros."""
    flat = np.asarray(src).reshape(-1)
    n = int(nbytes) // 4
    for i in range(4):
        tile[int(index) + i] = flat[int(word) + i] if i < n else np.uint32(0)


def _landed():
    """commit_group / wait_group: every copy landed when it was issued."""


cp_async_commit = cp_async_wait0 = cp_async_wait1 = _landed


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
