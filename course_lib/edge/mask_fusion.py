"""A mask the compiler did not fuse: a separate pass over S, counted byte by byte.

An NPU compiler that treats "add the mask" as its own operator runs three
kernels where FlashAttention runs one:

    separate   1. S = scale Q K^T, tile by tile, stored to DRAM (float32)
               2. the mask pass: read S and the mask, store the masked S
               3. softmax and P V: read the masked S (and V) tile by tile, online softmax
    fused      one tile loop: read Q, K, V and the mask tile, apply it on chip
    rule       one tile loop: the mask is a rule of (i, j) (causal), computed on chip; the
               tiles no query sees are skipped, neither read nor computed

``run_counted(schedule, q, k, v, mask, ...)`` runs each for real on the
course's counted DRAM (``kernels.counted.HBM``: every load and store of a named
tensor counted) and returns the output and the counts; ``mask_traffic`` is the
closed form, and the tests hold the two equal.  The mask tensor is boolean
(1 byte per pair) unless ``mask_dtype`` says otherwise (an additive float16 bias:
2 bytes).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.masks import MaskSpec
from ..core.rules import EMPTY
from ..kernels.counted import HBM

SEPARATE, FUSED, RULE = "separate", "fused", "rule"
MASK_SCHEDULES = (SEPARATE, FUSED, RULE)


def _online(state, s, vj):
    m, l, acc = state
    m_new = np.maximum(m, s.max(axis=1))
    shift = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.where(np.isneginf(m_new), 0.0, np.exp(m - shift))
    p = np.exp(s - shift[:, None])
    return m_new, alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ vj


def run_counted(schedule: str, q, k, v, visible, *, block_q: int, block_k: int, mask_dtype=np.bool_):
    """Attention of one head (float32) with the boolean mask ``visible`` (Nq, Nk), run as ``schedule``.

    Returns ``(out, hbm)``: out (Nq, Dv), and the counted DRAM (``hbm.reads`` / ``hbm.writes`` by tensor).
    The ``rule`` schedule takes ``visible`` to be causal (bottom-right), as the rule it computes.
    """
    if schedule not in MASK_SCHEDULES:
        raise ValueError(f"schedule must be one of {MASK_SCHEDULES}, got {schedule!r}")
    (nq, d), (nk, dv) = q.shape, v.shape
    scale = np.float32(1 / math.sqrt(d))
    mem = HBM()
    out = np.zeros((nq, dv), np.float32)
    mask = np.asarray(visible).astype(mask_dtype)
    s_dram = np.zeros((nq, nk), np.float32) if schedule == SEPARATE else None
    plan = MaskSpec(nq, nk, causal=True).tile_codes(block_q, block_k) if schedule == RULE else None
    rows, cols = range(0, nq, block_q), range(0, nk, block_k)
    if schedule == SEPARATE:
        for r0 in rows:
            qi = mem.load("Q", q, np.s_[r0:r0 + block_q])
            for c0 in cols:
                kj = mem.load("K", k, np.s_[c0:c0 + block_k])
                mem.store("S", s_dram, np.s_[r0:r0 + block_q, c0:c0 + block_k], scale * qi @ kj.T)
        for r0 in rows:
            for c0 in cols:
                tile = np.s_[r0:r0 + block_q, c0:c0 + block_k]
                sij, keep = mem.load("S", s_dram, tile), mem.load("mask", mask, tile)
                mem.store("S", s_dram, tile, np.where(keep.astype(bool), sij, -np.inf))
    for t, r0 in enumerate(rows):
        n_r = min(nq, r0 + block_q) - r0
        state = (np.full(n_r, -np.inf), np.zeros(n_r), np.zeros((n_r, dv)))
        qi = None if schedule == SEPARATE else mem.load("Q", q, np.s_[r0:r0 + block_q])
        for c, c0 in enumerate(cols):
            tile = np.s_[r0:r0 + block_q, c0:c0 + block_k]
            if schedule == RULE and plan[t, c] == EMPTY:
                continue
            if schedule == SEPARATE:
                sij = mem.load("S", s_dram, tile)
            else:
                sij = scale * qi @ mem.load("K", k, np.s_[c0:c0 + block_k]).T
                keep = mem.load("mask", mask, tile) if schedule == FUSED else visible[tile]  # RULE: computed
                sij = np.where(np.asarray(keep, bool), sij, -np.inf)
            state = _online(state, sij, mem.load("V", v, np.s_[c0:c0 + block_k]))
        m, l, acc = state
        mem.store("O", out, np.s_[r0:r0 + block_q], np.where(l[:, None] > 0, acc / np.where(l > 0, l, 1)[:, None], 0))
    return out, mem


def mask_traffic(schedule: str, seqlen_q: int, seqlen_k: int, head_dim: int, *, block_q: int, block_k: int,
                 itemsize: int = 4, mask_itemsize: int = 1) -> dict:
    """DRAM bytes by tensor of ``run_counted(schedule, ...)`` with no mask-skipped tiles (the closed form).

    For ``rule`` this is the unmasked count; the tiles a causal mask lets it skip come off it
    (``run_counted`` counts them exactly).
    """
    nq, nk, d, e = seqlen_q, seqlen_k, head_dim, itemsize
    tr = math.ceil(nq / block_q)
    pairs = nq * nk
    reads = {"Q": nq * d * e, "K": tr * nk * d * e, "V": tr * nk * d * e}
    writes = {"O": nq * d * e}
    if schedule == SEPARATE:
        reads.update(S=2 * pairs * 4, mask=pairs * mask_itemsize)  # read to mask it, read again for the softmax
        writes.update(S=2 * pairs * 4)                              # written by QK^T, written masked
    elif schedule == FUSED:
        reads["mask"] = pairs * mask_itemsize
    elif schedule != RULE:
        raise ValueError(f"schedule must be one of {MASK_SCHEDULES}, got {schedule!r}")
    return dict(reads=reads, writes=writes, bytes=sum(reads.values()) + sum(writes.values()))
